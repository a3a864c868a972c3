package replica_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
	"github.com/tenurelog/tenure/services/lease"
	"github.com/tenurelog/tenure/services/lease/leasetest"
	"github.com/tenurelog/tenure/services/replica"
)

// Issue 25's brick: Fence(R, 2^64-1) was accepted, and every later fence
// (lower) refused, so the range could never be promoted again. A replica
// that can ask the lease service refuses a fence far above its current one
// that was never granted, and a fence for a range the lease service does
// not list it in; neither changes anything.
func TestFenceBeyondTheGrantedEpochIsRefused(t *testing.T) {
	env := leasetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	keeper, err := lease.NewKeeper(env.Client, "r1", "http://r1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { keeper.Close(context.Background()) })
	r, srv, err := replica.Start(replica.Config{ID: "r1", DataDir: t.TempDir(), Ranges: keeper}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.Close()
		r.Close()
	})
	if _, err := env.Client.CreateRange(ctx, connect.NewRequest(&tenurev1.CreateRangeRequest{
		RangeId: "r", Replicas: []*tenurev1.Replica{{Id: "r1", Address: srv.URL()}, {Id: "r2", Address: "http://127.0.0.1:1"}},
	})); err != nil {
		t.Fatal(err)
	}
	c := tenurev1connect.NewReplicaServiceClient(transport.NewHTTPClient(), srv.URL(), transport.ClientOptions()...)
	fence := func(rangeID string, e uint64) error {
		_, err := c.Fence(ctx, connect.NewRequest(&tenurev1.FenceRequest{RangeId: rangeID, Epoch: e, FencerId: "test"}))
		return err
	}
	fencedAt := func(rangeID string) (uint64, bool) {
		resp, err := c.GetStatus(ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, rs := range resp.Msg.GetRanges() {
			if rs.GetRangeId() == rangeID {
				return rs.GetFencedEpoch(), true
			}
		}
		return 0, false
	}
	if err := fence("r", 1); err != nil {
		t.Fatalf("Fence(r, 1) = %v", err)
	}
	for _, e := range []uint64{^uint64(0), 1 + 1<<10 + 1} {
		if err := fence("r", e); connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Fatalf("Fence(r, %d), never granted = %v, want failed precondition", e, err)
		}
		if got, _ := fencedAt("r"); got != 1 {
			t.Fatalf("after the refused Fence(r, %d) the range is fenced at %d, want 1", e, got)
		}
	}
	// The range is not bricked: the next real fence is taken.
	if err := fence("r", 2); err != nil {
		t.Fatalf("Fence(r, 2) after the refusals = %v", err)
	}
	// A range the lease service does not have, or does not list r1 in, is
	// not hosted.
	if err := fence("stranger", 1); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("Fence(stranger, 1) = %v, want failed precondition", err)
	}
	if _, err := env.Client.CreateRange(ctx, connect.NewRequest(&tenurev1.CreateRangeRequest{
		RangeId: "elsewhere", Replicas: []*tenurev1.Replica{{Id: "r7", Address: "http://127.0.0.1:1"}},
	})); err != nil {
		t.Fatal(err)
	}
	if err := fence("elsewhere", 1); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("Fence(elsewhere, 1), a range of r7 only = %v, want failed precondition", err)
	}
	for _, id := range []string{"stranger", "elsewhere"} {
		if _, hosted := fencedAt(id); hosted {
			t.Fatalf("range %s is hosted after its refused fence", id)
		}
	}
}

// Without a lease service to ask, a jump beyond 2^32 is still refused.
func TestFenceJumpBoundedWithoutALeaseService(t *testing.T) {
	r, srv, err := replica.Start(replica.Config{ID: "r1", DataDir: t.TempDir()}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.Close()
		r.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := tenurev1connect.NewReplicaServiceClient(transport.NewHTTPClient(), srv.URL(), transport.ClientOptions()...)
	if _, err := c.Fence(ctx, connect.NewRequest(&tenurev1.FenceRequest{RangeId: "r", Epoch: 1})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Fence(ctx, connect.NewRequest(&tenurev1.FenceRequest{RangeId: "r", Epoch: ^uint64(0)})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("Fence(r, 2^64-1) = %v, want failed precondition", err)
	}
	if _, err := c.Fence(ctx, connect.NewRequest(&tenurev1.FenceRequest{RangeId: "r", Epoch: 1 << 20})); err != nil {
		t.Fatalf("Fence(r, 2^20), a large jump below the bound = %v", err)
	}
}
