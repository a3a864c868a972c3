package promoter

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
)

// Two promoters racing on the same range: exactly one epoch wins, the
// loser's late commands are refused by the replicas because they carry an
// older epoch, and the transition records tell the story.
func TestRacingPromotersOneEpochWins(t *testing.T) {
	c := newCluster(t, 3)
	c.createRange("r", "r1")
	// Neither runs the election loop: this test drives promote directly, as
	// two promoters that both believe they are in charge would.
	a, b := c.newPromoter("pa", false), c.newPromoter("pb", false)
	ctx := context.Background()
	if _, err := a.promote(ctx, "r", 0, "", "initial"); err != nil {
		t.Fatal(err)
	}
	var acks []acked
	for i := range 5 {
		ack, err := c.appendOne("r", fmt.Sprintf("v%d", i), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		acks = append(acks, ack)
	}

	// Both observe epoch 1. The grant is a CAS on it: exactly one wins.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, p := range []*Promoter{a, b} {
		wg.Add(1)
		go func() { defer wg.Done(); _, errs[i] = p.promote(ctx, "r", 1, "", "race on evidence") }()
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		if err == nil {
			won++
		} else if connect.CodeOf(err) != connect.CodeAborted {
			t.Errorf("losing promotion: code %v (%v), want Aborted", connect.CodeOf(err), err)
		}
	}
	if won != 1 {
		t.Fatalf("%d promotions won the race on epoch 1, want exactly 1 (errors: %v)", won, errs)
	}

	// Now the harder interleaving: pa is granted epoch 3 and fences, then
	// pb promotes at epoch 4 before pa plans. pa's Truncate/Adopt carry
	// epoch 3 and must be refused.
	release := make(chan struct{})
	fenced := make(chan struct{})
	a.testHookAfterFence = func(string, uint64) { close(fenced); <-release }
	var aErr error
	done := make(chan struct{})
	go func() { _, aErr = a.promote(ctx, "r", -1, "", "slow promoter"); close(done) }()
	<-fenced
	trB, err := b.promote(ctx, "r", -1, "", "fast promoter")
	if err != nil {
		t.Fatalf("pb promote: %v", err)
	}
	close(release)
	<-done
	if aErr == nil {
		t.Fatal("pa's promotion at the older epoch succeeded after pb fenced the replicas higher")
	}
	if code := connect.CodeOf(aErr); code != connect.CodeFailedPrecondition {
		t.Errorf("pa's late command: code %v (%v), want FailedPrecondition from a replica", code, aErr)
	}
	leader, epoch := c.leader("r", trB.GetEpoch(), 10*time.Second)
	if leader != trB.GetLeaderId() || epoch != trB.GetEpoch() {
		t.Errorf("leader = %s at %d, want pb's %s at %d", leader, epoch, trB.GetLeaderId(), trB.GetEpoch())
	}
	ack, err := c.appendOne("r", "after-race", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.checkAcked("r", append(acks, ack))

	// The records: epochs 1, 2 and 4, each by the promoter that won it;
	// pa's abandoned epoch 3 left no record.
	trs, err := a.transitions(ctx, "r", 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, tr := range trs {
		got = append(got, fmt.Sprintf("%d:%s", tr.GetEpoch(), tr.GetPromoterId()))
	}
	if len(trs) != 3 || trs[0].GetEpoch() != 4 || trs[0].GetPromoterId() != "pb" || trs[2].GetEpoch() != 1 {
		t.Errorf("transitions (newest first) = %v, want 4:pb, 2:<winner>, 1:pa", got)
	}
}
