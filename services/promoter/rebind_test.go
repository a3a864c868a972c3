package promoter

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/lease"
)

// When the bind to a new leader fails (its keeper has no session yet), the
// lease stays with the promoter. That is no evidence the leader is dead, so
// missed probes must not promote it away (seen in the demo under load: a
// second, needless promotion); and the refresh loop hands the lease over
// once the leader has a session.
func TestLeaseKeptByPromoterIsRebound(t *testing.T) {
	c := newCluster(t, 3)
	c.createRange("r", "r1")
	r1 := c.byID["r1"]
	// r1 loses its session: the promotion's bind to it fails.
	ctx := context.Background()
	if err := r1.keeper.Close(ctx); err != nil {
		t.Fatal(err)
	}
	p := c.newPromoter("p1", false)
	tr, err := p.promote(ctx, "r", 0, "", "initial")
	if err != nil {
		t.Fatal(err)
	}
	if tr.GetLeaderId() != "r1" {
		t.Fatalf("leader = %s, want r1", tr.GetLeaderId())
	}
	resp, err := c.lease.Client.GetLease(ctx, connect.NewRequest(&tenurev1.GetLeaseRequest{RangeId: "r"}))
	if err != nil {
		t.Fatal(err)
	}
	if h := resp.Msg.GetLease().GetHolderId(); h != "p1" {
		t.Fatalf("lease holder = %s, want the promoter p1 (the bind should have failed)", h)
	}
	if !p.leaseLive(ctx, "r", tr.GetEpoch()) {
		t.Errorf("leaseLive with the lease held by the promoter = false: missed probes would promote a leader that may be fine")
	}

	// r1 gets a session again; a refresh hands the lease over.
	k, err := lease.NewKeeper(c.lease.Client, "r1", "", lease.WithSessionTTL(2*time.Second), lease.WithKeeperLogger(c.log))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close(context.Background()) })
	if _, err := k.Session(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the refresh to bind the lease to r1", 10*time.Second, func() bool {
		if err := p.refresh(ctx); err != nil {
			return false
		}
		resp, err := c.lease.Client.GetLease(ctx, connect.NewRequest(&tenurev1.GetLeaseRequest{RangeId: "r"}))
		return err == nil && resp.Msg.GetLease().GetHolderId() == "r1"
	})
}
