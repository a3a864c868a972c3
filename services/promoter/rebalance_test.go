package promoter

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// failOverPreferred kills the preferred replica r1 while it leads r, waits
// for a survivor to lead, restarts r1 and waits for it to follow again. It
// returns the survivor leading and its epoch.
func failOverPreferred(t *testing.T, c *cluster) (string, uint64) {
	t.Helper()
	leader, e1 := c.leader("r", 1, 20*time.Second)
	if leader != "r1" {
		t.Fatalf("the first leader of r, preferred r1, is %s", leader)
	}
	if _, err := c.appendOne("r", "before", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	c.stop(c.byID["r1"])
	survivor, e2 := c.leader("r", e1+1, 20*time.Second)
	if _, err := c.appendOne("r", "during", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	c.start(c.byID["r1"])
	waitFor(t, "the restarted r1 to follow", 20*time.Second, func() bool {
		st := c.status("r1", "r")
		return st.GetRole() == tenurev1.Role_ROLE_FOLLOWER && st.GetEpoch() >= e2
	})
	return survivor, e2
}

// After a failover moved r's leadership off its preferred replica r1 and r1
// came back, the rebalancer moves leadership back to r1 with a planned
// handover, and no acknowledged record is lost.
func TestRebalanceMovesLeadershipBack(t *testing.T) {
	c := newCluster(t, 3)
	c.createRange("r", "r1")
	p := c.newPromoter("p1", true, func(cfg *Config) {
		cfg.NoRebalance, cfg.RebalanceInterval = false, 300*time.Millisecond
	})
	survivor, e2 := failOverPreferred(t, c)
	var acks []acked
	for i := range 20 {
		a, err := c.appendOne("r", "after-"+string(rune('a'+i)), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		acks = append(acks, a)
	}
	// Bounded: the range is left alone for one interval after its
	// failover, then a round every interval finds r1 caught up.
	got, e3 := "", uint64(0)
	waitFor(t, "r1 to lead r again", 15*time.Second, func() bool {
		got, e3 = c.leaderNow("r")
		return got == "r1" && e3 > e2
	})
	// The record is written after the adoption the replicas show.
	var trs []*tenurev1.Transition
	waitFor(t, "the transition record of epoch "+strconv.FormatUint(e3, 10), 10*time.Second, func() bool {
		var err error
		trs, err = p.transitions(context.Background(), "r", 1)
		return err == nil && len(trs) == 1 && trs[0].GetEpoch() == e3
	})
	if tr := trs[0]; tr.GetLeaderId() != "r1" || !strings.HasPrefix(tr.GetReason(), "rebalance:") || tr.GetHandoverTo() != "r1" {
		t.Fatalf("transition of epoch %d = leader %s, reason %q, handover to %q; want a rebalance to r1", e3, tr.GetLeaderId(), tr.GetReason(), tr.GetHandoverTo())
	}
	t.Logf("rebalanced r from %s (epoch %d) back to r1 at epoch %d", survivor, e2, e3)
	c.checkAcked("r", acks)
}

// With rebalancing off, leadership stays where the failover put it.
func TestRebalanceOffLeavesLeadership(t *testing.T) {
	c := newCluster(t, 3)
	c.createRange("r", "r1")
	c.newPromoter("p1", true, func(cfg *Config) {
		cfg.NoRebalance, cfg.RebalanceInterval = true, 100*time.Millisecond
	})
	survivor, e2 := failOverPreferred(t, c)
	// Ten intervals, far more than the enabled test needs.
	time.Sleep(time.Second)
	if got, e := c.leaderNow("r"); got != survivor || e != e2 {
		t.Fatalf("with rebalancing off, %s leads r at epoch %d; want %s still at %d", got, e, survivor, e2)
	}
}

// leaderNow is the replica leading rangeID right now and its epoch, or ""
// when none answers as leader.
func (c *cluster) leaderNow(rangeID string) (string, uint64) {
	for _, tr := range c.replicas {
		st := c.status(tr.id, rangeID)
		if st.GetRole() == tenurev1.Role_ROLE_LEADER && st.GetEpoch() == st.GetFencedEpoch() {
			return tr.id, st.GetEpoch()
		}
	}
	return "", 0
}

// One rebalance round moves at most RebalanceMax ranges, and the next
// round moves the next ones: a returning replica takes its leaderships
// back a few at a time.
func TestRebalanceRoundMovesAtMostMax(t *testing.T) {
	c := newCluster(t, 3)
	ids := []string{"a", "b", "c"}
	for _, id := range ids {
		c.createRange(id, "r1")
	}
	// The loop is off: the test runs the rounds itself.
	p := c.newPromoter("p1", true, func(cfg *Config) {
		cfg.NoRebalance, cfg.RebalanceInterval, cfg.RebalanceMax = true, 100*time.Millisecond, 1
	})
	for _, id := range ids {
		if l, _ := c.leader(id, 1, 20*time.Second); l != "r1" {
			t.Fatalf("the first leader of %s, preferred r1, is %s", id, l)
		}
	}
	c.stop(c.byID["r1"])
	for _, id := range ids {
		c.leader(id, 2, 20*time.Second)
	}
	c.start(c.byID["r1"])
	ledByR1 := func() int {
		n := 0
		for _, id := range ids {
			if l, _ := c.leaderNow(id); l == "r1" {
				n++
			}
		}
		return n
	}
	waitFor(t, "the restarted r1 to follow every range", 20*time.Second, func() bool {
		for _, id := range ids {
			if st := c.status("r1", id); st.GetRole() != tenurev1.Role_ROLE_FOLLOWER || st.GetEpoch() < 2 {
				return false
			}
		}
		return true
	})
	if n := ledByR1(); n != 0 {
		t.Fatalf("r1 leads %d ranges before any rebalance round", n)
	}
	for round := 1; round <= len(ids); round++ {
		// Bounded: the ranges must look settled (no leader change within
		// an interval, r1 answering probes) for a round to pick them.
		moved := false
		for attempt := 0; attempt < 50 && !moved; attempt++ {
			time.Sleep(100 * time.Millisecond)
			p.rebalance(context.Background())
			moved = ledByR1() >= round
		}
		if n := ledByR1(); n != round {
			t.Fatalf("after round %d (at most 1 move each) r1 leads %d ranges, want %d", round, n, round)
		}
	}
}
