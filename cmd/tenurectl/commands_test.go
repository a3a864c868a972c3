package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// One cluster serves every command test: starting one is most of the cost.
// Each part uses its own range, so the parts do not depend on each other's
// records; they run in order because some stop and restart replicas.
func TestCommandsAgainstACluster(t *testing.T) {
	c := newTestCluster(t)
	for _, part := range []struct {
		name string
		test func(*testing.T, *testCluster)
	}{
		{"range", testRange},
		{"produce and consume", testProduceConsume},
		{"consume below the log start", testConsumeBelowLogStart},
		{"status", testStatus},
		{"promote and transitions", testPromoteTransitions},
		{"not-leader answers are followed", testNotLeaderFollowed},
		{"a refusal naming no leader is sent again", testNoLeaderNamedResent},
		{"bench", testBench},
		{"bench --duration --disk", testBenchDuration},
		{"bench several ranges", testBenchRanges},
		{"bench follows a leader change", testBenchFollowsLeader},
		{"epochs with a diverged replica", testEpochsDivergence},
		{"membership", testMembership},
		{"rebuild a quarantined copy", testRebuild},
		{"unknown range", testUnknownRange},
		{"json schema", testJSONSchema},
		{"retention", testRetention},
		{"URL flags", testURLRule},
		{"a server's error is not a connection's", testServerErrorsAreTheServers},
		{"misdirected addresses", testMisdirectedAddresses},
		{"a promoter whose election fails", testPromoterWithoutEtcd},
		{"several promoters in --promoter", testPromoterList},
		// Last: it takes two replicas down, which every range feels.
		{"status while a majority is down", testStatusMajorityDown},
	} {
		t.Run(part.name, func(st *testing.T) {
			// The cluster's helpers fail the part that is running.
			c.t = st
			defer func() { c.t = t }()
			part.test(st, c)
		})
	}
}

func testRange(t *testing.T, c *testCluster) {
	out := c.mustCtl("", "range", "create", "orders", "--replicas", c.members(), "--preferred", "r2")
	wantLines(t, "range create", out,
		"created range orders with replicas r1=http://"+c.byID["r1"].listen,
		"epoch 0, no leader yet")

	code, _, stderr := c.ctl("", "range", "create", "orders", "--replicas", c.members())
	if code != exitFail || !strings.Contains(stderr, `range "orders" already exists`) {
		t.Errorf("creating orders again: status %d, stderr:\n%s\nwant status 1 and 'already exists'", code, stderr)
	}
	code, _, stderr = c.ctl("", "range", "create", "x", "--replicas", "r1")
	if code != exitUsage || !strings.Contains(stderr, `"r1" is not ID=URL`) {
		t.Errorf("range create with a bad --replicas: status %d, stderr:\n%s", code, stderr)
	}

	leader := c.waitLeader("orders", 1)
	// The promoter holds the new epoch's lease until it binds it to the
	// leader it adopted.
	waitFor(t, "the lease to be bound to "+leader, 10*time.Second, func() bool {
		_, out, _ := c.ctl("", "range", "list")
		return strings.Contains(normalize(out), "orders 1 "+leader+" live")
	})
	out = c.mustCtl("", "range", "list")
	wantLines(t, "range list", out,
		"RANGE EPOCH LEASE HOLDER LEASE PREFERRED RETENTION REPLICAS",
		"orders 1 "+leader+" live")

	out = c.mustCtl("", "range", "list", "--json")
	var ranges []map[string]any
	if err := json.Unmarshal([]byte(out), &ranges); err != nil {
		t.Fatalf("range list --json: %v\n%s", err, out)
	}
	if len(ranges) != 1 || ranges[0]["range_id"] != "orders" || ranges[0]["preferred_replica_id"] != "r2" {
		t.Errorf("range list --json = %s", out)
	}
}

func testProduceConsume(t *testing.T, c *testCluster) {
	leader := c.createRange("events", "r1")

	out := c.mustCtl("", "produce", "events", "hello", "world", "--echo")
	// Offset 0 is epoch 1's epoch-start record.
	if want := "1\thello\n2\tworld\n"; out != want {
		t.Errorf("produce --echo = %q, want %q", out, want)
	}

	// Without --echo produce prints offsets alone on stdout, not the
	// values back; who took them is said on stderr.
	code, out, errOut := c.ctl("one\ntwo\n\nthree\n", "produce", "events")
	if want := "3\n4\n5\n6\n"; code != exitOK || out != want {
		t.Errorf("produce from stdin = %d, %q, want %q", code, out, want)
	}
	if want := "range events, leader " + leader + ", epoch 1:\n"; errOut != want {
		t.Errorf("produce from stdin: stderr %q, want %q", errOut, want)
	}

	out = c.mustCtl("", "produce", "events", "again", "--json")
	if want := `{"range_id":"events","offset":7,"epoch":1,"leader_id":"` + leader + `"}` + "\n"; out != want {
		t.Errorf("produce --json = %s, want %s", out, want)
	}

	out = c.mustCtl("", "consume", "events")
	if want := "1\thello\n2\tworld\n3\tone\n4\ttwo\n5\t\n6\tthree\n7\tagain\n"; out != want {
		t.Errorf("consume events =\n%q\nwant\n%q", out, want)
	}
	out = c.mustCtl("", "consume", "events", "--from", "5", "--limit", "2")
	if want := "5\t\n6\tthree\n"; out != want {
		t.Errorf("consume --from 5 --limit 2 = %q, want %q", out, want)
	}
	out = c.mustCtl("", "consume", "events", "--epoch-starts", "--limit", "1")
	if want := "0\t<epoch 1 starts>\n"; out != want {
		t.Errorf("consume --epoch-starts = %q, want %q", out, want)
	}
	out = c.mustCtl("", "consume", "events", "--from", "6", "--json")
	if want := `{"offset":6,"epoch":1,"value":"three"}` + "\n" + `{"offset":7,"epoch":1,"value":"again"}` + "\n"; out != want {
		t.Errorf("consume --json = %q, want %q", out, want)
	}

	code, _, stderr := c.ctl("", "consume", "events", "--from", "100")
	if code != exitFail || !strings.Contains(stderr, "beyond the high-water mark") || !strings.Contains(stderr, "--follow") {
		t.Errorf("consume past the HWM: status %d, stderr:\n%s", code, stderr)
	}
	code, _, stderr = c.ctl("", "produce", "nope", "x")
	if code != exitFail || !strings.Contains(stderr, `range "nope" does not exist`) {
		t.Errorf("produce to a missing range: status %d, stderr:\n%s", code, stderr)
	}

	testProduceInput(t, c)

	// --follow prints records as they commit.
	type result struct {
		code   int
		stdout string
	}
	done := make(chan result, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go func() {
		code, stdout, _ := c.ctlContext(ctx, "", "consume", "events", "--from", "7", "--follow", "--limit", "3")
		done <- result{code, stdout}
	}()
	time.Sleep(200 * time.Millisecond)
	c.mustCtl("", "produce", "events", "late-1", "late-2")
	select {
	case r := <-done:
		if want := "7\tagain\n8\tlate-1\n9\tlate-2\n"; r.code != exitOK || r.stdout != want {
			t.Errorf("consume --follow: status %d, stdout %q, want %q", r.code, r.stdout, want)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("consume --follow did not print the records produced after it started")
	}

	// A follow from beyond the end (the HWM is 10) waits for its offset to
	// commit, and prints nothing before it.
	go func() {
		code, stdout, _ := c.ctlContext(ctx, "", "consume", "events", "--from", "11", "--follow", "--limit", "1")
		done <- result{code, stdout}
	}()
	time.Sleep(200 * time.Millisecond)
	c.mustCtl("", "produce", "events", "at-10", "at-11")
	select {
	case r := <-done:
		if want := "11\tat-11\n"; r.code != exitOK || r.stdout != want {
			t.Errorf("consume --follow --from 11 (beyond the HWM 10): status %d, stdout %q, want %q", r.code, r.stdout, want)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("consume --follow from beyond the HWM did not print the record produced at its offset")
	}
}

func testStatus(t *testing.T, c *testCluster) {
	leader := c.createRange("status-range", "r3")
	c.mustCtl("", "produce", "status-range", "a", "b", "c")
	// Followers report their log end once they have fetched.
	waitFor(t, "every follower to catch up", 10*time.Second, func() bool {
		_, out, _ := c.ctl("", "status", "status-range", "--json")
		return strings.Count(out, `"log_end": 4`) == 3 && strings.Count(out, `"high_water_mark": 4`) == 3 && strings.Count(out, `"lag": 0`) == 2
	})
	out := c.mustCtl("", "status", "status-range")
	want := []string{"RANGE EPOCH LEADER REPLICA ROLE EPOCH LOG END HWM LAG PID UP NOTE"}
	// Every replica runs in this process: PID is the test's.
	pid := strconv.Itoa(os.Getpid())
	for i, tr := range c.replicas {
		line := tr.id + " follower 1 4 4 0 " + pid + " "
		if tr.id == leader {
			line = tr.id + " leader 1 4 4 - " + pid + " "
		}
		if i == 0 {
			line = "status-range 1 " + leader + " " + line
		}
		want = append(want, line)
	}
	wantLines(t, "status", out, want...)
	if !strings.Contains(out, "lease live") {
		t.Errorf("status lacks the leader's lease note:\n%s", out)
	}

	out = c.mustCtl("", "status")
	for _, r := range []string{"orders", "events", "status-range"} {
		if !strings.Contains(out, r+" ") {
			t.Errorf("status of every range lacks %s:\n%s", r, out)
		}
	}

	var st []struct {
		Range    string `json:"range_id"`
		Leader   string `json:"leader_id"`
		Epoch    uint64
		Replicas []struct {
			ID, Role string
			LogEnd   uint64 `json:"log_end"`
			Lag      *uint64
			PID      int64 `json:"pid"`
			Started  int64 `json:"started_unix_ms"`
		}
	}
	out = c.mustCtl("", "--json", "status", "status-range")
	if err := json.Unmarshal([]byte(out), &st); err != nil || len(st) != 1 || st[0].Leader != leader || len(st[0].Replicas) != 3 {
		t.Fatalf("status --json = %s (%v)", out, err)
	}
	for _, r := range st[0].Replicas {
		if (r.ID == leader) != (r.Lag == nil) || r.LogEnd != 4 {
			t.Errorf("status --json replica %+v: want log end 4, and a lag for followers only", r)
		}
		if r.PID != int64(os.Getpid()) || r.Started <= 0 || r.Started > time.Now().UnixMilli() {
			t.Errorf("status --json replica %+v: want pid %d and a start time in the past", r, os.Getpid())
		}
	}

	// Every range healthy: the last line says so, and --problems shows
	// nothing else.
	waitFor(t, "every range healthy", 10*time.Second, func() bool {
		_, out, _ = c.ctl("", "status", "--problems")
		return strings.HasPrefix(out, "all ") && strings.HasSuffix(out, " ranges healthy\n")
	})
	if out := c.mustCtl("", "status", "--problems", "--json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("status --problems --json with every range healthy = %s, want []", out)
	}

	// A replica that is down is shown as such, not as an error of the command.
	down := c.others(leader)[0]
	c.stop(c.byID[down])
	defer c.start(c.byID[down])
	out = c.mustCtl("", "status", "status-range")
	wantLines(t, "status with "+down+" down", out, down+" unreachable - - - - - - unreachable")

	// Every range has the replica down as a member: each is a range with
	// a problem, named in --json.
	var all []statusJSON
	if err := json.Unmarshal([]byte(c.mustCtl("", "status", "--json")), &all); err != nil || len(all) < 4 {
		t.Fatalf("status --json: %v, %d ranges", err, len(all))
	}
	out = c.mustCtl("", "status", "--problems")
	wantLines(t, "status --problems with "+down+" down", out, fmt.Sprintf("%d of %d ranges with a problem", len(all), len(all)))
	var problems []statusJSON
	if err := json.Unmarshal([]byte(c.mustCtl("", "status", "--problems", "--json")), &problems); err != nil || len(problems) != len(all) {
		t.Fatalf("status --problems --json: %v, %d ranges, want %d", err, len(problems), len(all))
	}
	for _, r := range problems {
		if !slices.Contains(r.Problems, down+" unreachable") {
			t.Errorf("status --problems --json: range %s's problems %q lack %q", r.Range, r.Problems, down+" unreachable")
		}
	}
}

func testPromoteTransitions(t *testing.T, c *testCluster) {
	first := c.createRange("handover", "r1")
	next := c.others(first)[0]
	c.mustCtl("", "produce", "handover", "x", "y")
	// Wait for the next leader to hold everything: --preferred only breaks
	// ties among equally complete logs.
	waitFor(t, next+" to catch up", 10*time.Second, func() bool {
		_, out, _ := c.ctl("", "status", "handover")
		return strings.Contains(normalize(out), next+" follower 1 3 3 0")
	})
	// A consumer following the range keeps going across the handover.
	type result struct {
		code           int
		stdout, stderr string
	}
	followed := make(chan result, 1)
	fctx, fcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer fcancel()
	go func() {
		code, stdout, stderr := c.ctlContext(fctx, "", "consume", "handover", "--follow", "--from", "1", "--limit", "4")
		followed <- result{code, stdout, stderr}
	}()

	out := c.mustCtl("", "promote", "handover", "--preferred", next, "--reason", "planned handover")
	wantLines(t, "promote", out,
		"range handover: epoch 1 -> 2, leader "+next,
		"reason: planned handover",
		"committed bound: 3",
		"trace id:",
		"REPLICA FENCED HISTORY LOG END HWM LAST EPOCH NOTE")
	if line := next + " yes known 3 3 1 new leader"; !strings.Contains(normalize(out), line) {
		t.Errorf("promote report lacks %q:\n%s", line, out)
	}
	// The old leader is fenced too (a planned handover fences it like any
	// other replica), unless its answer came too late to count.
	if !strings.Contains(normalize(out), first+" yes known 3 3 1") && !strings.Contains(normalize(out), first+" no - - - - not fenced") {
		t.Errorf("promote report lacks %s's fence answer:\n%s", first, out)
	}
	wantLines(t, "promote", out, "truncations: none", "timings: grant")

	out = c.mustCtl("", "transitions", "handover")
	wantLines(t, "transitions", out,
		"EPOCH LEADER COMMITTED TRUNCATED DURATION STARTED TRACE REASON",
		"2 "+next+" 3 -",
		"1 "+first+" 0 -")
	if !strings.Contains(out, "planned handover") || !strings.Contains(out, "initial leader") {
		t.Errorf("transitions lacks the reasons:\n%s", out)
	}
	out = c.mustCtl("", "transitions", "handover", "--verbose", "--limit", "1")
	wantLines(t, "transitions --verbose", out, "range handover: epoch 1 -> 2, leader "+next, "fence answers:")
	if strings.Contains(out, "epoch 0 -> 1") {
		t.Errorf("transitions --limit 1 printed more than one:\n%s", out)
	}

	out = c.mustCtl("", "transitions", "handover", "--json")
	var trs []map[string]any
	if err := json.Unmarshal([]byte(out), &trs); err != nil || len(trs) != 2 || trs[0]["leader_id"] != next || trs[0]["epoch"] != 2.0 {
		t.Errorf("transitions --json = %s (%v)", out, err)
	}

	// Records survive the handover, and the new leader serves them.
	out = c.mustCtl("", "consume", "handover")
	if want := "1\tx\n2\ty\n"; out != want {
		t.Errorf("consume after the handover = %q, want %q", out, want)
	}

	// Offset 3 is epoch 2's epoch-start record, which consume skips.
	c.mustCtl("", "produce", "handover", "z1", "z2")
	select {
	case r := <-followed:
		if want := "1\tx\n2\ty\n4\tz1\n5\tz2\n"; r.code != exitOK || r.stdout != want {
			t.Errorf("consume --follow across the handover: status %d, stdout %q, want %q; stderr:\n%s", r.code, r.stdout, want, r.stderr)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("consume --follow did not follow the range to its new leader")
	}

	code, _, stderr := c.ctl("", "promote", "handover", "--preferred", "r9")
	if code != exitFail || !strings.Contains(stderr, "promotion refused") || !strings.Contains(stderr, "r9") {
		t.Errorf("promote --preferred r9: status %d, stderr:\n%s", code, stderr)
	}

	// To the replica that leads already: nothing, and said so; --force
	// promotes anyway.
	out = c.mustCtl("", "promote", "handover", "--preferred", next)
	if want := next + " already leads range handover at epoch 2; nothing done (--force to promote anyway)\n"; out != want {
		t.Errorf("promote --preferred %s (the leader) = %q, want %q", next, out, want)
	}
	out = c.mustCtl("", "promote", "handover", "--preferred", next, "--force")
	wantLines(t, "promote --force", out, "range handover: epoch 2 -> 3, leader "+next)
}

func testBench(t *testing.T, c *testCluster) {
	leader := c.createRange("bench", "r1")
	out := c.mustCtl("", "bench", "bench", "--records", "60", "--size", "16", "--concurrency", "3", "--batch", "4")
	wantLines(t, "bench", out,
		"bench range bench, leader "+leader+" at epoch 1: 60 records of 16 bytes, batches of 4, 3 concurrent appenders (one AppendStream each)",
		"acknowledged 60 records in",
		"append latency: p50")
	out = c.mustCtl("", "bench", "bench", "--records", "10", "--json")
	var res benchJSON
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Records != 10 || res.Appends != 10 || res.P50Ms <= 0 || res.P999Ms < res.P50Ms {
		t.Errorf("bench --json = %s (%v)", out, err)
	}
	out = c.mustCtl("", "bench", "bench", "--records", "8", "--concurrency", "2", "--unary")
	wantLines(t, "bench --unary", out,
		"bench range bench, leader "+leader+" at epoch 1: 8 records of 100 bytes, batches of 1, 2 concurrent appenders (unary Append calls)",
		"acknowledged 8 records in")
	// 1 epoch-start record + 78 benched.
	waitFor(t, "the benched records to be readable", 5*time.Second, func() bool {
		_, out, _ := c.ctl("", "status", "bench", "--json")
		return strings.Contains(out, `"high_water_mark": 79`)
	})
}

// A promotion mid-run: bench's appends follow the range to its new
// leader, each written once, and the run ends as it would have, saying it
// followed the change. It used to fail at the first append the old leader
// refused.
func testBenchFollowsLeader(t *testing.T, c *testCluster) {
	leader := c.createRange("bench-move", "r1")
	type result struct {
		code           int
		stdout, stderr string
	}
	done := make(chan result, 1)
	go func() {
		code, stdout, stderr := c.ctl("", "bench", "bench-move", "--duration", "4s", "--size", "16", "--concurrency", "3", "--json")
		done <- result{code, stdout, stderr}
	}()
	waitFor(t, "bench to be appending", 10*time.Second, func() bool { return hwmOf(t, c, "bench-move") > 20 })
	next := c.others(leader)[0]
	c.mustCtl("", "promote", "bench-move", "--preferred", next)
	var r result
	select {
	case r = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("bench did not end")
	}
	if r.code != exitOK {
		t.Fatalf("bench across a promotion: status %d\nstderr:\n%s", r.code, r.stderr)
	}
	var res benchJSON
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || len(res.Ranges) != 1 {
		t.Fatalf("bench --json = %s (%v)", r.stdout, err)
	}
	if res.LeaderChanges != 1 || res.Ranges[0].LeaderChanges != 1 {
		t.Errorf("bench --json leader_changes = %d (range: %d), want 1: %s", res.LeaderChanges, res.Ranges[0].LeaderChanges, r.stdout)
	}
	// Every acknowledged record is committed once: the two epoch-start
	// records and the benched ones, nothing written twice.
	waitFor(t, "the benched records to be committed", 10*time.Second, func() bool {
		return hwmOf(t, c, "bench-move") >= res.Records+2
	})
	var recs int64
	for l := range strings.SplitSeq(strings.TrimSpace(c.mustCtl("", "consume", "bench-move")), "\n") {
		if l != "" {
			recs++
		}
	}
	if recs != res.Records {
		t.Errorf("consume bench-move: %d records, want the %d bench acknowledged, each once", recs, res.Records)
	}
}

// Several ranges, led by different replicas, benched together: each gets
// its appender (or, --random, appends drawn at random), the totals add up,
// and every acknowledged record is in its range.
func testBenchRanges(t *testing.T, c *testCluster) {
	ids := []string{"many-a", "many-b", "many-c"}
	leaders := map[string]string{}
	for i, id := range ids {
		leaders[id] = c.createRange(id, fmt.Sprintf("r%d", i+1))
	}
	args := append([]string{"bench"}, ids...)
	out := c.mustCtl("", append(args, "--records", "30", "--size", "8")...)
	wantLines(t, "bench of three ranges", out,
		"bench 3 ranges (many-a, many-b, many-c), leaders "+describeLeaders(leaders)+": 30 records of 8 bytes, batches of 1, 4 concurrent appenders, appender i on range i in turn (one AppendStream each)",
		"acknowledged 30 records in",
		"records per range: fewest ")

	// benched counts each range's records, to find them all committed.
	benched := map[string]int64{}
	sumOf := func(what string, res benchJSON, want int64) {
		t.Helper()
		var sum int64
		for i, r := range res.Ranges {
			if r.Range != ids[i] || r.Leader != leaders[r.Range] || r.Epoch != 1 || r.Records == 0 || r.Records != 2*r.Appends {
				t.Errorf("range %d in %s: %+v, want %s led by %s at epoch 1 with records in appends of 2", i, what, r, ids[i], leaders[ids[i]])
			}
			sum += r.Records
			benched[r.Range] += r.Records
		}
		if sum != want {
			t.Errorf("%s: the ranges' records add up to %d, want %d", what, sum, want)
		}
	}
	// The text run's records fell on the ranges as its appenders raced for
	// them: count them from each leader's HWM (an acknowledged append is
	// committed).
	for _, id := range ids {
		benched[id] = hwmOf(t, c, id) - 1 // the epoch-start record
	}
	out = c.mustCtl("", append(args, "--records", "60", "--batch", "2", "--concurrency", "3", "--json")...)
	var res benchJSON
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Records != 60 || res.Range != "" || len(res.Ranges) != 3 || res.Random {
		t.Fatalf("bench of three ranges --json = %s (%v)", out, err)
	}
	sumOf("bench of three ranges --json", res, 60)

	out = c.mustCtl("", append(args, "--records", "90", "--batch", "2", "--concurrency", "2", "--random", "--json")...)
	res = benchJSON{}
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Records != 90 || !res.Random || len(res.Ranges) != 3 {
		t.Fatalf("bench --random --json = %s (%v)", out, err)
	}
	sumOf("bench --random --json", res, 90)
	// Every acknowledged record is in its range.
	for _, id := range ids {
		want := 1 + benched[id]
		waitFor(t, id+"'s benched records to be committed", 5*time.Second, func() bool {
			return hwmOf(t, c, id) == want
		})
	}

	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"many-a", "many-b", "many-c", "--concurrency", "2"}, "--concurrency 2 leaves ranges without an appender (3 ranges)"},
		{[]string{"many-a", "many-a"}, `range "many-a" is given twice`},
		{[]string{"many-a", "many-b", "--disk"}, "--disk samples one range's replicas"},
	} {
		code, _, stderr := c.ctl("", append([]string{"bench"}, bad.args...)...)
		if code != exitUsage || !strings.Contains(stderr, bad.want) {
			t.Errorf("bench %v: status %d, stderr:\n%s\nwant status 2 and %q", bad.args, code, stderr, bad.want)
		}
	}
	// A range that does not exist fails the run before anything is appended.
	code, _, stderr := c.ctl("", "bench", "many-a", "no-such-range", "--records", "5")
	if code != exitFail || !strings.Contains(stderr, `"no-such-range" does not exist`) {
		t.Errorf("bench with an unknown range: status %d, stderr:\n%s", code, stderr)
	}
	if hwm := hwmOf(t, c, "many-a"); hwm != 1+benched["many-a"] {
		t.Errorf("a bench that failed on an unknown range appended to many-a: HWM %d, want %d", hwm, 1+benched["many-a"])
	}
}

// hwmOf is the range's leader's HWM, from tenurectl status --json.
func hwmOf(t *testing.T, c *testCluster, rangeID string) int64 {
	t.Helper()
	out := c.mustCtl("", "status", rangeID, "--json")
	var st []statusJSON
	if err := json.Unmarshal([]byte(out), &st); err != nil || len(st) != 1 {
		t.Fatalf("status %s --json = %s (%v)", rangeID, out, err)
	}
	for _, r := range st[0].Replicas {
		if r.ID == st[0].Leader {
			return int64(r.HighWaterMark)
		}
	}
	t.Fatalf("status %s --json names no leader: %s", rangeID, out)
	return 0
}

// describeLeaders is bench's "r1 1, r2 2" of how many ranges each leads.
func describeLeaders(leaders map[string]string) string {
	led := map[string]int{}
	for _, l := range leaders {
		led[l]++
	}
	var parts []string
	for _, id := range slices.Sorted(maps.Keys(led)) {
		parts = append(parts, fmt.Sprintf("%s %d", id, led[id]))
	}
	return strings.Join(parts, ", ")
}

// A leader takes an append its followers never see (they are partitioned
// from it), then dies. A new leader is promoted and writes on; when the old
// leader comes back, before the promoter reconciles it, its history diverges
// from the leader's where the new epoch began, and epochs says so. Once it
// is reconciled, the histories agree.
func testEpochsDivergence(t *testing.T, c *testCluster) {
	old := c.createRange("div", "r1")
	followers := c.others(old)
	c.mustCtl("", "produce", "div", "a", "b") // offsets 1, 2: acknowledged
	waitFor(t, "the followers to catch up", 10*time.Second, func() bool {
		_, out, _ := c.ctl("", "status", "div", "--json")
		return strings.Count(out, `"log_end": 3`) == 3
	})

	// Partition the followers, let their in-flight long polls end, then
	// append to the leader: it writes the record but cannot commit it.
	for _, id := range followers {
		c.byID[id].gate.Close()
	}
	// (Their fetch wait is 200ms; a poll still out when the record lands
	// would carry it to a follower, which is safe but not this story.)
	time.Sleep(time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := c.byID[old].r.Append(ctx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: "div", Records: [][]byte{[]byte("never acknowledged")}}))
	cancel()
	if err == nil {
		t.Fatal("an append without a quorum was acknowledged")
	}
	c.stop(c.byID[old])
	for _, id := range followers {
		c.byID[id].gate.Open()
	}

	// A follower is promoted at epoch 2 and writes on.
	leader := c.waitLeader("div", 2)
	c.mustCtl("", "produce", "div", "c") // offset 4, after epoch 2's start at 3

	// Bring the old leader back with no promoter running, so nothing
	// reconciles it yet.
	c.stopPromoter()
	c.stopPromoter = nil
	c.start(c.byID[old])
	row := func(name string, cell func(id string) string) string {
		line := name
		for _, tr := range c.replicas {
			line += " " + cell(tr.id)
		}
		return line
	}
	pick := func(forOld, forOthers string) func(string) string {
		return func(id string) string {
			if id == old {
				return forOld
			}
			return forOthers
		}
	}
	out := c.mustCtl("", "epochs", "div")
	wantLines(t, "epochs before reconciling", out,
		"range div: where each replica's first record of each epoch sits",
		row("epoch 1", pick("0", "0")),
		row("epoch 2", pick("-", "3")),
		row("log end", pick("4", "5")),
		"divergence against the leader "+leader+":",
		old+": diverges at offset 3: its records 3..3 are another leadership's and are cut when it fetches")

	var ej epochsJSON
	out = c.mustCtl("", "epochs", "div", "--json")
	if err := json.Unmarshal([]byte(out), &ej); err != nil || ej.Leader != leader || len(ej.Replicas) != 3 {
		t.Fatalf("epochs --json = %s (%v)", out, err)
	}
	for _, r := range ej.Replicas {
		switch {
		case r.ID == old && (r.DivergencePoint == nil || *r.DivergencePoint != 3):
			t.Errorf("epochs --json: %s's divergence point = %v, want 3:\n%s", old, r.DivergencePoint, out)
		case r.ID != old && !r.Identical:
			// The leader too: it is the reference, identical to itself.
			t.Errorf("epochs --json: %s is not identical to the leader %s:\n%s", r.ID, leader, out)
		case r.ID == leader && r.DivergencePoint != nil:
			t.Errorf("epochs --json: the leader %s diverges from itself at %d:\n%s", r.ID, *r.DivergencePoint, out)
		}
	}

	// A promoter reconciles the old leader: it follows the new one, its
	// unacknowledged tail cut at the divergence point, and every history
	// agrees.
	c.startPromoter("p2")
	waitFor(t, old+" to be reconciled", 20*time.Second, func() bool {
		_, out, _ := c.ctl("", "epochs", "div")
		return strings.Count(out, "identical history") == 2
	})
	out = c.mustCtl("", "epochs", "div")
	wantLines(t, "epochs after reconciling", out, "epoch 1 0 0 0", "epoch 2 3 3 3", "log end 5 5 5")
	out = c.mustCtl("", "consume", "div")
	if want := "1\ta\n2\tb\n4\tc\n"; out != want {
		t.Errorf("consume div = %q, want %q: the acknowledged records, not the unacknowledged one", out, want)
	}
}

// Errors say what happened and what to do.
func TestCommandErrorsWithoutACluster(t *testing.T) {
	var out, errOut strings.Builder
	e := &env{stdout: &out, stderr: &errOut, stdin: strings.NewReader(""), getenv: func(k string) string {
		if k == "TENURECTL_LEASE" {
			return "http://127.0.0.1:1"
		}
		return ""
	}}
	code := run(context.Background(), e, []string{"status"})
	if code != exitFail || !strings.Contains(errOut.String(), "cannot reach the lease service at http://127.0.0.1:1") ||
		!strings.Contains(errOut.String(), "make demo ARGS=--keep") {
		t.Errorf("status with no lease service: status %d, stderr:\n%s", code, errOut.String())
	}
	errOut.Reset()
	code = run(context.Background(), e, []string{"--promoter", "http://127.0.0.1:1", "transitions", "r"})
	if code != exitFail || !strings.Contains(errOut.String(), "cannot reach the promoter at http://127.0.0.1:1") {
		t.Errorf("transitions with no promoter: status %d, stderr:\n%s", code, errOut.String())
	}
}

// With two of three replicas down no promotion can succeed; status says
// why, from the promoter, instead of leaving "no leader" unexplained.
func testStatusMajorityDown(t *testing.T, c *testCluster) {
	leader := c.createRange("quorum-range", "r1")
	// A follower first, then the leader: the other way round, the promoter
	// could promote the survivors between the two stops.
	down := []*testReplica{c.byID[c.others(leader)[0]], c.byID[leader]}
	for _, tr := range down {
		c.stop(tr)
	}
	var out string
	defer func() {
		if t.Failed() {
			t.Logf("last status:\n%s", out)
		}
	}()
	waitFor(t, "status to show why the range has no leader", 20*time.Second, func() bool {
		_, out, _ = c.ctl("", "status", "quorum-range")
		return strings.Contains(out, "refuse connections")
	})
	wantLines(t, "status with a majority down", out,
		"RANGE EPOCH LEADER", "quorum-range", "RANGE STATE FAILED ATTEMPTS NEXT RETRY LAST ERROR",
		"quorum-range no-quorum")
	if !strings.Contains(out, "2 of 3 replicas refuse connections") || !strings.Contains(out, down[0].id) || !strings.Contains(out, down[1].id) {
		t.Errorf("status does not name both replicas down:\n%s", out)
	}

	for _, tr := range down {
		c.start(tr)
	}
	waitFor(t, "a leader again, and the promoter content", 20*time.Second, func() bool {
		code, out, _ := c.ctl("", "status", "quorum-range", "--json")
		var st []statusJSON
		return code == exitOK && json.Unmarshal([]byte(out), &st) == nil && len(st) == 1 && st[0].Leader != "" &&
			st[0].Promotion != nil && st[0].Promotion.State == "healthy"
	})
}

// A replica fenced by a promotion still running refuses appends naming no
// leader. That refusal wrote nothing, so produce sends the batch again to
// the leader it finds, even --no-idempotence (which never resends a batch
// that may have been written). It used to fail with "outcome unknown".
func testNoLeaderNamedResent(t *testing.T, c *testCluster) {
	leader := c.createRange("no-leader-named", "r1")
	f := c.byID[c.others(leader)[0]]
	// As a promoter's fence at epoch 2 leaves f until its adopt: fenced, no
	// leader known. The range's own leader serves on at epoch 1 with the
	// other follower.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rc := tenurev1connect.NewReplicaServiceClient(transport.NewHTTPClient(), f.srv.URL(), transport.ClientOptions()...)
	if _, err := rc.Fence(ctx, connect.NewRequest(&tenurev1.FenceRequest{RangeId: "no-leader-named", Epoch: 2, FencerId: "test"})); err != nil {
		t.Fatalf("fence %s at epoch 2: %v", f.id, err)
	}
	var out, errOut bytes.Buffer
	e := &env{stdout: &out, stderr: &errOut}
	leaseURL, promoterURL, empty, no := c.lease.Server.URL(), c.promoterURL, "", false
	cl := newClients(clusterOpts{lease: &leaseURL, promoter: &promoterURL, json: &no, cacert: &empty, cert: &empty, key: &empty})
	defer cl.close()
	p := &producer{c: cl, e: e, rangeID: "no-leader-named", leader: &tenurev1.Replica{Id: f.id, Address: f.srv.URL()}, retryFor: 20 * time.Second}
	if err := p.append(ctx, [][]byte{[]byte("a")}); err != nil {
		t.Fatalf("plain produce through %s, fenced with no leader: %v", f.id, err)
	}
	if out.String() != "1\n" || !strings.Contains(errOut.String(), "range no-leader-named, leader ") {
		t.Errorf("produce printed %q (stderr %q), want the record at offset 1 under the leader", out.String(), errOut.String())
	}
	recs := c.mustCtl("", "consume", "no-leader-named")
	if recs != "1\ta\n" {
		t.Errorf("consume after produce = %q, want the one record once", recs)
	}
}

// produce and consume follow the leader a replica's not-leader answer
// names (leadership moved after the leader was found): here they start at
// a follower.
func testNotLeaderFollowed(t *testing.T, c *testCluster) {
	leader := c.createRange("redirect", "r1")
	f := c.byID[c.others(leader)[0]]
	// createRange returns once the leader serves; a follower is adopted in
	// the same promotion but may answer a moment later, and until then it
	// refuses with "leader unknown", which names nobody to follow.
	waitFor(t, f.id+" to follow "+leader+" at epoch 1", 20*time.Second, func() bool {
		r, _ := c.replicaJSON("redirect", f.id)
		return r.Role == "follower" && r.Epoch == 1
	})
	follower := &tenurev1.Replica{Id: f.id, Address: f.srv.URL()}
	var out, errOut bytes.Buffer
	e := &env{stdout: &out, stderr: &errOut}
	cl := &clients{http: transport.NewHTTPClient()}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := &producer{c: cl, e: e, rangeID: "redirect", leader: follower, echo: true}
	if err := p.append(ctx, [][]byte{[]byte("a"), []byte("b")}); err != nil {
		t.Fatalf("produce through follower %s: %v", f.id, err)
	}
	if want := "1\ta\n2\tb\n"; out.String() != want {
		t.Errorf("produce through follower %s printed %q, want %q", f.id, out.String(), want)
	}
	if want := "range redirect, leader " + leader + ", epoch 1:"; !strings.Contains(errOut.String(), want) {
		t.Errorf("produce stderr lacks %q:\n%s", want, errOut.String())
	}
	if want := f.id + " does not lead range redirect; following its leader " + leader; !strings.Contains(errOut.String(), want) {
		t.Errorf("produce stderr lacks %q:\n%s", want, errOut.String())
	}
	out.Reset()
	cs := &consumer{e: e, rangeID: "redirect"}
	if err := cs.readFrom(ctx, cl, follower); err != nil {
		t.Fatalf("consume through follower %s: %v", f.id, err)
	}
	if want := "1\ta\n2\tb\n"; out.String() != want {
		t.Errorf("consume through follower %s printed %q, want %q", f.id, out.String(), want)
	}
}

// The promoter's own answers that name a replica it could not dial are
// its answers, not a failure to reach it: "promote" of a range with no
// quorum, and "add-replica" of a replica nothing listens for, used to say
// "cannot reach the promoter ... is it running?" because the server's
// message contained "dial tcp".
func testServerErrorsAreTheServers(t *testing.T, c *testCluster) {
	dead := "http://127.0.0.1:1"
	c.mustCtl("", "range", "create", "noquorum", "--replicas", c.replicas[0].id+"=http://"+c.replicas[0].listen+",r8="+dead+",r9="+dead)
	code, _, stderr := c.ctl("", "promote", "noquorum")
	if code != exitFail || strings.Contains(stderr, "cannot reach the promoter") || !strings.Contains(stderr, "promotion did not complete") {
		t.Errorf("promote without a quorum: status %d, stderr:\n%s\nwant the promoter's answer, not \"cannot reach the promoter\"", code, stderr)
	}
	c.createRange("addtodead", "r1")
	code, _, stderr = c.ctl("", "range", "add-replica", "addtodead", "r5="+dead, "--catch-up-timeout", "5s")
	if code != exitFail || strings.Contains(stderr, "cannot reach the promoter") || !strings.Contains(stderr, "r5") {
		t.Errorf("add a replica nothing listens for: status %d, stderr:\n%s\nwant the promoter's answer naming r5", code, stderr)
	}
	// A client that cannot dial is still told so.
	code, _, stderr = c.ctl("", "--promoter", dead, "promote", "addtodead")
	if code != exitFail || !strings.Contains(stderr, "cannot reach the promoter at "+dead) {
		t.Errorf("promote with no promoter at %s: status %d, stderr:\n%s", dead, code, stderr)
	}
	// status --json says why it has no promotion state, as the table
	// does below itself (it used to leave the field out, unexplained).
	code, stdout, stderr := c.ctl("", "--promoter", dead, "status", "addtodead", "--json")
	var got []statusJSON
	if code != exitOK || json.Unmarshal([]byte(stdout), &got) != nil || len(got) != 1 || got[0].Promotion == nil ||
		got[0].Promotion.State != "unknown" || !strings.Contains(got[0].Promotion.PromoterError, "cannot reach the promoter at "+dead) {
		t.Errorf("status --json with no promoter at %s: status %d, stdout:\n%s\nstderr:\n%s\nwant promotion.state unknown and promoter_error naming it", dead, code, stdout, stderr)
	}
}

// A range whose members' addresses are swapped: status names each
// misdirection on the member's own row (it said "does not host the range
// yet"), and the range is not promoted.
func testMisdirectedAddresses(t *testing.T, c *testCluster) {
	r1, r2, r3 := c.replicas[0], c.replicas[1], c.replicas[2]
	c.mustCtl("", "range", "create", "swapped", "--replicas", "r1=http://"+r2.listen+",r2=http://"+r1.listen+",r3=http://"+r3.listen)
	code, stdout, stderr := c.ctl("", "status", "swapped", "--json")
	var got []statusJSON
	if code != exitOK || json.Unmarshal([]byte(stdout), &got) != nil || len(got) != 1 {
		t.Fatalf("status swapped --json: status %d, stdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	want := map[string]string{"r1": "answers as replica r2", "r2": "answers as replica r1"}
	for _, rj := range got[0].Replicas {
		if w, ok := want[rj.ID]; ok && !strings.Contains(rj.Error, "MISDIRECTED: the address "+w) {
			t.Errorf("status of %s at a swapped address: error %q, want it to say it %s", rj.ID, rj.Error, w)
		}
		if rj.ID == "r3" && strings.Contains(rj.Error, "MISDIRECTED") {
			t.Errorf("r3 is at its own address, yet status says %q", rj.Error)
		}
	}
	if got[0].Epoch != 0 {
		t.Errorf("the swapped range is at epoch %d: the promoter spent epochs on it", got[0].Epoch)
	}

	// The fix the status names. One member corrected alone would leave r1
	// and r2 at one address: refused, nothing written.
	code, stdout, stderr = c.ctl("", "range", "set-address", "swapped", "r1=http://"+r1.listen)
	if code != exitFail || !strings.Contains(stderr, "r1 and r2 would both be at http://"+r1.listen) {
		t.Errorf("set-address of r1 alone onto r2's address: status %d, stderr %q, want a refusal naming both", code, stderr)
	}
	code, _, stderr = c.ctl("", "range", "set-address", "swapped", "r9=http://127.0.0.1:1")
	if code != exitFail || !strings.Contains(stderr, "range swapped has no member r9 (members: r1, r2, r3)") {
		t.Errorf("set-address of a non-member: status %d, stderr %q", code, stderr)
	}
	out := c.mustCtl("", "range", "set-address", "swapped", "r1=http://"+r1.listen+",r2=http://"+r2.listen)
	wantLines(t, "set-address", out,
		"range swapped: r1 http://"+r2.listen+" -> http://"+r1.listen,
		"range swapped: r2 http://"+r1.listen+" -> http://"+r2.listen,
		"the promoter tells the members within its refresh interval; 'tenurectl status swapped' shows them")
	// Corrected, the range gets its first leader, and every row is plain.
	c.waitLeader("swapped", 1)
	out = c.mustCtl("", "range", "set-address", "swapped", "r3=http://"+r3.listen, "--json")
	var info struct {
		Replicas []struct{ ID, Address string }
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil || len(info.Replicas) != 3 {
		t.Fatalf("set-address --json with nothing to change = %s (%v)", out, err)
	}
	for _, r := range info.Replicas {
		if want := "http://" + c.byID[r.ID].listen; r.Address != want {
			t.Errorf("set-address --json: %s at %s, want %s", r.ID, r.Address, want)
		}
	}
}
