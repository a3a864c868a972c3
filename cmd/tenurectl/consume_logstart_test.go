package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tenurelog/tenure/services/replica/logstore"
)

// trimStore raises range id's log start to to in tr's store while tr is
// stopped, as retention on it would have: the store is real (Badger and
// segment files in tr's data directory), opened the way the replica opens it.
func (c *testCluster) trimStore(tr *testReplica, id string, to uint64) {
	c.t.Helper()
	c.stop(tr)
	s, err := logstore.Open(tr.dir, logstore.Options{})
	if err != nil {
		c.t.Fatalf("open %s's store: %v", tr.id, err)
	}
	r, ok := s.Range(id)
	if !ok {
		c.t.Fatalf("%s hosts no range %s", tr.id, id)
	}
	got, err := r.AdvanceLogStart(to)
	if cerr := s.Close(); err == nil {
		err = cerr
	}
	if err != nil || got != to {
		c.t.Fatalf("AdvanceLogStart(%s, %d) on %s = %d, %v", id, to, tr.id, got, err)
	}
	c.start(tr)
}

// consume --from below the range's log start fails and names the log start
// and how to read from it; --from-start reads from there, with and without
// --follow.
func testConsumeBelowLogStart(t *testing.T, c *testCluster) {
	first := c.createRange("retained", "r1")
	c.mustCtl("", "produce", "retained", "--echo", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j")
	// One follower holds everything committed: its store is trimmed to 6
	// and it then leads, so the leader's log starts at 6.
	next := "r2"
	if first == next {
		next = "r3"
	}
	waitFor(t, next+" to hold the committed records", 10*time.Second, func() bool {
		_, out, _ := c.ctl("", "status", "retained", "--json")
		var st []statusJSON
		if json.Unmarshal([]byte(out), &st) != nil || len(st) != 1 {
			return false
		}
		for _, r := range st[0].Replicas {
			if r.ID == next {
				return r.HighWaterMark == 11
			}
		}
		return false
	})
	c.trimStore(c.byID[next], "retained", 6)
	waitFor(t, "the handover to "+next, 30*time.Second, func() bool {
		code, _, _ := c.ctl("", "promote", "retained", "--preferred", next, "--reason", "lead from the trimmed log")
		return code == exitOK
	})

	// status --json names each replica's log start.
	_, out, _ := c.ctl("", "status", "retained", "--json")
	var st []statusJSON
	if err := json.Unmarshal([]byte(out), &st); err != nil || len(st) != 1 {
		t.Fatalf("status retained --json: %v\n%s", err, out)
	}
	for _, r := range st[0].Replicas {
		if r.ID == next && r.LogStart != 6 {
			t.Errorf("status --json: %s log_start = %d, want 6", r.ID, r.LogStart)
		}
	}
	code, _, stderr := c.ctl("", "consume", "retained", "--from", "3")
	for _, want := range []string{"offset 3 is below the log start 6: records below it were deleted by retention", "--from 6", "--from-start"} {
		if code != exitFail || !strings.Contains(stderr, want) {
			t.Errorf("consume --from 3 below the log start 6: status %d, stderr:\n%s\nwant %q", code, stderr, want)
		}
	}
	waitFor(t, "consume --from-start to read from the new leader", 20*time.Second, func() bool {
		code, out, stderr = c.ctl("", "consume", "retained", "--from-start")
		return code == exitOK
	})
	if want := "6\tf\n7\tg\n8\th\n9\ti\n10\tj\n"; !strings.HasPrefix(out, want) {
		t.Errorf("consume --from-start = %q (stderr %q), want it to begin %q", out, stderr, want)
	}
	code, out, stderr = c.ctl("", "consume", "retained", "--from-start", "--follow", "--limit", "2")
	if want := "6\tf\n7\tg\n"; code != exitOK || out != want {
		t.Errorf("consume --from-start --follow --limit 2: status %d, stdout %q, stderr %q; want %q", code, out, stderr, want)
	}
	code, _, stderr = c.ctl("", "consume", "retained", "--from-start", "--from", "7")
	if code != exitUsage || !strings.Contains(stderr, "give one") {
		t.Errorf("consume --from-start --from 7: status %d, stderr %q; want a usage error", code, stderr)
	}
	code, _, stderr = c.ctl("", "consume", "retained", "--from", "2", "--follow")
	if code != exitFail || !strings.Contains(stderr, fmt.Sprintf("below the log start %d", 6)) {
		t.Errorf("consume --from 2 --follow below the log start: status %d, stderr:\n%s", code, stderr)
	}
}
