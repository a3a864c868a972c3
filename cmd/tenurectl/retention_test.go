package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// retentionTestInterval is the test cluster's --retention-interval.
const retentionTestInterval = 100 * time.Millisecond

// retentionView is one status --json sample of a range: the leader's row,
// after checking every replica's log start against its HWM.
func retentionView(t *testing.T, c *testCluster, rangeID string) (replicaStatusJSON, bool) {
	t.Helper()
	code, out, _ := c.ctl("", "status", rangeID, "--json")
	var st []statusJSON
	if code != exitOK || json.Unmarshal([]byte(out), &st) != nil || len(st) != 1 {
		return replicaStatusJSON{}, false
	}
	var leader replicaStatusJSON
	found := false
	for _, r := range st[0].Replicas {
		// Only committed records are ever removed, on any replica.
		if r.Reachable && r.LogStart > r.HighWaterMark {
			t.Fatalf("replica %s: log start %d above its HWM %d: uncommitted records removed\n%s", r.ID, r.LogStart, r.HighWaterMark, out)
		}
		if r.ID == st[0].Leader {
			leader, found = r, true
		}
	}
	return leader, found
}

// A range created with a 64 KiB size limit and written five times that
// has its leader's log start advance (never past the HWM) until it stores
// at most 64 KiB; range set to 1 GiB reaches the leader within a few
// intervals and stops further deletion. Through the real lease service,
// promoter and replicas.
func testRetention(t *testing.T, c *testCluster) {
	out := c.mustCtl("", "range", "create", "ret", "--replicas", c.members(), "--retention-bytes", "64KiB")
	wantLines(t, "range create --retention-bytes", out, "created range ret", "retention 64KiB or 7d")
	c.waitLeader("ret", 1)
	wantLines(t, "range show", c.mustCtl("", "range", "show", "ret"), "range ret", "retention 64KiB or 7d", "max bytes 64KiB", "max age 7d")
	wantLines(t, "range list", c.mustCtl("", "range", "list"), "RETENTION", "ret 1")
	if !strings.Contains(normalize(c.mustCtl("", "range", "list")), " 64KiB or 7d ") {
		t.Errorf("range list lacks ret's retention:\n%s", c.mustCtl("", "range", "list"))
	}

	// 20 appends of 4 records of 4 KiB: 320 KiB, five times the limit.
	record := strings.Repeat("x", 4<<10)
	produce := func(n int) {
		for range n {
			c.mustCtl("", "produce", "ret", record, record, record, record)
		}
	}
	produce(20)
	var leader replicaStatusJSON
	waitFor(t, "the leader's log start to advance and its stored bytes to fit 64 KiB", 20*time.Second, func() bool {
		var ok bool
		leader, ok = retentionView(t, c, "ret")
		return ok && leader.LogStart > 0 && leader.StoredBytes <= 64<<10
	})
	if leader.RetentionInForce == nil || leader.RetentionInForce.MaxBytes != 64<<10 {
		t.Fatalf("leader's retention in force = %+v, want max_bytes 65536 (Adopt carried it)", leader.RetentionInForce)
	}
	wantLines(t, "status", c.mustCtl("", "status", "ret"), "range ret: retention 64KiB or 7d; leader "+leader.ID+" holds")

	out = c.mustCtl("", "range", "set", "ret", "--retention-bytes", "1GiB")
	wantLines(t, "range set", out, "range ret: retention 1GiB or 7d (was 64KiB or 7d)")
	waitFor(t, "the leader to apply 1 GiB", 10*time.Second, func() bool {
		var ok bool
		leader, ok = retentionView(t, c, "ret")
		return ok && leader.RetentionInForce != nil && leader.RetentionInForce.MaxBytes == 1<<30
	})
	// From the sample that shows 1 GiB in force, no pass applies 64 KiB.
	start, end := leader.LogStart, leader.LogEnd
	produce(10)
	waitFor(t, "the new records to commit", 10*time.Second, func() bool {
		var ok bool
		leader, ok = retentionView(t, c, "ret")
		return ok && leader.HighWaterMark >= end+40
	})
	for range 5 {
		time.Sleep(retentionTestInterval)
		if l, ok := retentionView(t, c, "ret"); ok && l.LogStart != start {
			t.Fatalf("log start moved %d -> %d after the limit was raised to 1 GiB", start, l.LogStart)
		}
	}
	// Only the age limit left, the age default: what the range keeps is
	// unchanged by a set of the other limit.
	out = c.mustCtl("", "range", "set", "ret", "--retention-age", "unlimited", "--json")
	if !strings.Contains(out, `"max_bytes": 1073741824`) || strings.Contains(out, `"max_age_ms"`) && !strings.Contains(out, `"max_age_ms": 0`) {
		t.Errorf("range set --retention-age unlimited --json: want max_bytes kept at 1 GiB and no age limit:\n%s", out)
	}
}
