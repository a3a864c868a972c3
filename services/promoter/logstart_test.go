package promoter

import (
	"fmt"
	"testing"
	"time"

	"github.com/tenurelog/tenure/services/replica/logstore"
)

// trimStore raises rangeID's log start to to in tr's store while tr is
// down, as retention on it would have (real Badger and segment files, the
// epoch journal trimmed to the entry in force at the start), and starts it
// again.
func (c *cluster) trimStore(tr *testReplica, rangeID string, to uint64) {
	c.t.Helper()
	c.stop(tr)
	s, err := logstore.Open(tr.dir, logstore.Options{})
	if err != nil {
		c.t.Fatalf("open %s's store: %v", tr.id, err)
	}
	r, ok := s.Range(rangeID)
	if !ok {
		c.t.Fatalf("%s hosts no range %s", tr.id, rangeID)
	}
	got, err := r.AdvanceLogStart(to)
	if cerr := s.Close(); err == nil {
		err = cerr
	}
	if err != nil || got != to {
		c.t.Fatalf("AdvanceLogStart(%s, %d) on %s = %d, %v", rangeID, to, tr.id, got, err)
	}
}

// A promotion among replicas whose logs start at different offsets, with
// epoch journals trimmed differently: the most complete log leads, a
// replica agreeing from the larger start is not cut, and a replica whose log
// ends below the new leader's log start counts as fenced, is adopted uncut,
// and is reset to the leader's start by its first fetch. Every acknowledged
// record at or above the log start survives, and everyone ends with the
// leader's log start.
func TestPromotionAcrossDifferentLogStarts(t *testing.T) {
	c := newCluster(t, 3)
	c.createRange("r", "r1")
	c.newPromoter("p1", true)
	if l, _ := c.leader("r", 1, 20*time.Second); l != "r1" {
		t.Fatalf("initial leader = %s, want r1", l)
	}
	var acks []acked
	appendN := func(prefix string, n int) {
		t.Helper()
		for i := range n {
			a, err := c.appendOne("r", fmt.Sprintf("%s-%d", prefix, i), 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			acks = append(acks, a)
		}
	}
	appendN("e1", 5)
	end1 := acks[len(acks)-1].offset + 1
	waitFor(t, "followers to hold epoch 1", 10*time.Second, func() bool {
		return c.logEnd("r2", "r") >= end1 && c.logEnd("r3", "r") >= end1
	})

	// r1 goes down; epoch 2 is led by r2 or r3 and writes 10 more.
	c.stop(c.byID["r1"])
	l2, e2 := c.leader("r", 2, 20*time.Second)
	appendN("e2", 10)
	end2 := acks[len(acks)-1].offset + 1
	f := "r2"
	if l2 == f {
		f = "r3"
	}
	waitFor(t, f+" to hold epoch 2's records", 10*time.Second, func() bool {
		st := c.status(f, "r")
		return st.GetLogEnd() >= end2 && st.GetHighWaterMark() >= end2
	})

	// f's store is trimmed past epoch 1 (its journal keeps only epoch 2's
	// entry), l2's barely (both entries kept). l2 stays down; r1 (log end
	// end1, below f's start) comes back: the promotion at epoch 3 has f
	// and r1.
	start := end2 - 3
	c.trimStore(c.byID[f], "r", start)
	c.start(c.byID[f])
	c.trimStore(c.byID[l2], "r", 2)
	c.start(c.byID["r1"])
	leader, e3 := c.leader("r", e2+1, 30*time.Second)
	if leader != f {
		t.Fatalf("leader at epoch %d = %s, want %s (the most complete log)", e3, leader, f)
	}
	waitFor(t, "r1 to be reset to the leader's log start", 20*time.Second, func() bool {
		return c.status("r1", "r").GetLogStart() == start
	})
	c.start(c.byID[l2])
	appendN("e3", 3)
	end3 := acks[len(acks)-1].offset + 1
	for _, id := range []string{"r1", l2} {
		waitFor(t, id+" to catch up and follow the log start", 20*time.Second, func() bool {
			st := c.status(id, "r")
			return st.GetLogEnd() >= end3 && st.GetLogStart() == start && st.GetHalted() == ""
		})
	}
	var kept []acked
	for _, a := range acks {
		if a.offset >= start {
			kept = append(kept, a)
		}
	}
	c.checkAcked("r", kept)
}
