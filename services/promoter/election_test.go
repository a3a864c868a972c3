package promoter

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// Two promoters run behind the etcd election: only the elected one acts, the
// other refuses Promote naming the elected one, and takes over when the
// elected one stops.
func TestOnlyTheElectedPromoterActs(t *testing.T) {
	c := newCluster(t, 3)
	c.createRange("r", "r1")
	a := c.newPromoter("pa", true)
	waitFor(t, "pa to be elected", 10*time.Second, a.Elected)
	// Start pb only now, so the election order is known.
	ctx, cancel := context.WithCancel(context.Background())
	b := c.newPromoter("pb", false)
	bDone := make(chan struct{})
	go func() { b.Run(ctx); close(bDone) }()
	t.Cleanup(func() { cancel(); <-bDone })
	_, e1 := c.leader("r", 1, 20*time.Second)

	waitFor(t, "pb to see pa as the elected promoter", 10*time.Second, func() bool {
		resp, _ := handler{b}.GetStatus(context.Background(), connect.NewRequest(&tenurev1.PromoterServiceGetStatusRequest{}))
		return resp.Msg.GetLeaderPromoterId() == "pa"
	})
	if b.Elected() {
		t.Fatal("both promoters are elected")
	}
	_, err := handler{b}.Promote(context.Background(), connect.NewRequest(&tenurev1.PromoteRequest{RangeId: "r"}))
	if code := connect.CodeOf(err); code != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "pa") {
		t.Fatalf("Promote on the unelected promoter: %v, want FailedPrecondition naming pa", err)
	}

	// Stop pa's campaign (its election session is closed): pb takes over and
	// acts on the next failure.
	stopA := a.stopForTest()
	stopA()
	waitFor(t, "pb to be elected", 20*time.Second, b.Elected)
	leader, _ := c.leader("r", e1, 10*time.Second)
	c.stop(c.byID[leader])
	if next, e2 := c.leader("r", e1+1, 20*time.Second); next == leader || e2 <= e1 {
		t.Fatalf("after the kill: leader %s at %d, want another replica above epoch %d", next, e2, e1)
	}
	// The record is written just after adoption.
	waitFor(t, "pb's transition record", 10*time.Second, func() bool {
		trs, err := b.transitions(context.Background(), "r", 1)
		return err == nil && len(trs) == 1 && trs[0].GetPromoterId() == "pb" && trs[0].GetEpoch() > e1
	})
}
