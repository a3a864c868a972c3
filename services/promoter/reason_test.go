package promoter

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// An operator's reason too long to keep is refused before anything is
// promoted, and a transition record too large for etcd is refused when
// queued. A 2 MB reason used to promote, then its record was refused by
// etcd ("request is too large") and retried every second for good: the
// Promote never answered, the range's promotion slot stayed taken ("a
// promotion of range demo is already running" to every later Promote, and
// to a failover), and every later record of every range queued behind it.
func TestOversizedReasonWedgesNothing(t *testing.T) {
	c := newCluster(t, 3)
	c.createRange("r", "r1")
	p := c.newPromoter("p1", true)
	_, e1 := c.leader("r", 1, 20*time.Second)
	waitFor(t, "the promoter to be elected", 10*time.Second, p.Elected)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := handler{p}.Promote(ctx, connect.NewRequest(&tenurev1.PromoteRequest{RangeId: "r", Reason: strings.Repeat("x", 2<<20), Force: true}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "reason is 2097152 bytes, at most 1024") {
		t.Fatalf("Promote with a 2 MB reason = %v; want InvalidArgument naming the bound", err)
	}
	// The range is free to promote: a promotion of the promoter's own (a
	// rebalance) may hold it for a moment, never for good.
	var resp *connect.Response[tenurev1.PromoteResponse]
	for {
		resp, err = handler{p}.Promote(ctx, connect.NewRequest(&tenurev1.PromoteRequest{RangeId: "r", Reason: "after", Force: true}))
		if connect.CodeOf(err) != connect.CodeUnavailable || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil || resp.Msg.GetTransition().GetEpoch() <= e1 {
		t.Fatalf("Promote after the refused one = %v, %v; want a promotion above epoch %d", resp, err, e1)
	}

	// A record no etcd transaction may hold fails at once and holds up
	// no other.
	begun := time.Now()
	if err := p.recordTransition(ctx, &tenurev1.Transition{RangeId: "x", Epoch: 1, Reason: strings.Repeat("x", maxRecordBytesPerTxn)}); err == nil {
		t.Fatal("an oversized transition record was accepted")
	}
	if err := p.recordTransition(ctx, &tenurev1.Transition{RangeId: "x", Epoch: 2, Reason: "small"}); err != nil {
		t.Fatalf("a record after the oversized one: %v", err)
	}
	if d := time.Since(begun); d > 5*time.Second {
		t.Fatalf("the two records took %v", d)
	}
}
