package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/tenurelog/tenure/internal/testlog"
)

// TestProduceExactlyOnceAcrossLeaderKill: the leader is killed while
// produce streams stdin to it; produce retries the appends whose outcome the
// kill made unknown, with their sequences, at the next leader, and the range
// ends up holding every line exactly once.
func TestProduceExactlyOnceAcrossLeaderKill(t *testing.T) {
	c := newTestCluster(t)
	leader := c.createRange("once", "r1")

	const lines = 120
	stdin, w := io.Pipe()
	var out, errOut strings.Builder
	e := &env{stdout: &out, stderr: &errOut, stdin: stdin, getenv: func(string) string { return "" }}
	done := make(chan int, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	go func() {
		done <- run(ctx, e, []string{"--lease", c.lease.Server.URL(), "--promoter", c.promoterURL, "produce", "once", "--batch", "1"})
	}()
	for i := range lines {
		if i == lines/3 {
			c.stop(c.byID[leader])
		}
		if _, err := fmt.Fprintf(w, "line-%d\n", i); err != nil {
			t.Fatalf("write line %d: %v", i, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	w.Close()
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("produce: status %d\nstderr:\n%s", code, errOut.String())
		}
	case <-ctx.Done():
		t.Fatal("produce did not finish")
	}
	got := c.mustCtl("", "consume", "once")
	seen := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(got), "\n") {
		if _, v, ok := strings.Cut(l, "\t"); ok {
			seen[v]++
		}
	}
	for i := range lines {
		if v := fmt.Sprintf("line-%d", i); seen[v] != 1 {
			t.Errorf("%s is in the range %d times, want once", v, seen[v])
		}
	}
	if len(seen) != lines {
		t.Errorf("the range holds %d distinct values, want %d:\n%s", len(seen), lines, got)
	}
}

// TestProduceRetryAfterHandoverIsWrittenOnce: an append the leader wrote but
// could not commit (its followers cut off) when a planned handover deposed
// it has an unknown outcome; the handover re-elects the same replica (it
// holds the most complete log), so the record commits after all. produce's
// retry of it must be answered where it already is, not written again.
func TestProduceRetryAfterHandoverIsWrittenOnce(t *testing.T) {
	c := newTestCluster(t)
	leader := c.createRange("handover", "r1")
	c.mustCtl("", "produce", "handover", "before")
	for _, id := range c.others(leader) {
		c.byID[id].gate.Close()
	}
	done := make(chan int, 1)
	var errOut strings.Builder
	go func() {
		e := &env{stdout: io.Discard, stderr: &errOut, stdin: strings.NewReader(""), getenv: func(string) string { return "" }}
		done <- run(context.Background(), e, []string{"--lease", c.lease.Server.URL(), "--promoter", c.promoterURL, "produce", "handover", "stuck"})
	}()
	// The leader holds "stuck" (offset 2), uncommitted.
	waitFor(t, "the leader to hold the stuck append", 10*time.Second, func() bool {
		code, out, _ := c.ctl("", "status", "handover", "--json")
		var st []statusJSON
		if code != exitOK || json.Unmarshal([]byte(out), &st) != nil || len(st) != 1 {
			return false
		}
		for _, r := range st[0].Replicas {
			if r.ID == leader && r.LogEnd == 3 {
				return true
			}
		}
		return false
	})
	c.mustCtl("", "promote", "handover", "--preferred", leader)
	for _, id := range c.others(leader) {
		c.byID[id].gate.Open()
	}
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("produce: status %d\nstderr:\n%s", code, errOut.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("produce did not finish")
	}
	got := c.mustCtl("", "consume", "handover")
	if n := strings.Count(got, "\tstuck\n"); n != 1 {
		t.Fatalf("the range holds \"stuck\" %d times, want once:\n%s", n, got)
	}
}

// TestProduceGoesOnAfterRetentionForgotItsProducer: produce reads a quiet
// stdin while the range's retention removes its records and leadership
// moves; the new leader, whose dedupe state comes from the records it
// keeps, does not know produce's producer and refuses its next sequence,
// writing nothing. produce used to stop there; it goes on under a new
// producer id, and every line is in the range once.
func TestProduceGoesOnAfterRetentionForgotItsProducer(t *testing.T) {
	c := newTestCluster(t)
	c.mustCtl("", "range", "create", "quiet", "--replicas", c.members(), "--preferred", "r1", "--retention-age", "1ms")
	leader := c.waitLeader("quiet", 1)

	stdin, w := io.Pipe()
	var out, errOut testlog.Buffer // read while produce writes
	e := &env{stdout: &out, stderr: &errOut, stdin: stdin, getenv: func(string) string { return "" }}
	done := make(chan int, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	go func() {
		done <- run(ctx, e, []string{"--lease", c.lease.Server.URL(), "--promoter", c.promoterURL, "produce", "quiet", "--batch", "1"})
	}()
	if _, err := fmt.Fprintln(w, "before"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "produce to acknowledge its first line", 20*time.Second, func() bool { return strings.Count(out.String(), "\n") >= 1 })
	// Another producer's records, until every member's log starts past
	// produce's record.
	waitFor(t, "retention to remove produce's record on every member", 30*time.Second, func() bool {
		c.mustCtl("", "produce", "quiet", "other")
		var st []statusJSON
		if err := json.Unmarshal([]byte(c.mustCtl("", "status", "quiet", "--json")), &st); err != nil || len(st) != 1 {
			return false
		}
		for _, r := range st[0].Replicas {
			if r.LogStart <= 1 {
				return false
			}
		}
		return true
	})
	next := c.others(leader)[0]
	c.mustCtl("", "promote", "quiet", "--preferred", next)
	if _, err := fmt.Fprintln(w, "after"); err != nil {
		t.Fatal(err)
	}
	w.Close()
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("produce after retention forgot its producer: status %d\nstderr:\n%s", code, errOut.String())
		}
	case <-ctx.Done():
		t.Fatal("produce did not finish")
	}
	if n := strings.Count(out.String(), "\n"); n != 2 {
		t.Errorf("produce acknowledged %d lines, want 2:\n%s", n, out.String())
	}
}
