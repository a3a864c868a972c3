package lease_test

import (
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// A deleted range has no lease: GetLease answers NotFound, as GetRange
// does, and a bind at the epoch its tombstone keeps binds nothing, alone
// or batched. GetLease answered {"lease":{"epoch":"1"}} for it, and
// BindLease wrote a lease for the missing range, which the range created
// again under the id then showed as its live lease, held by whoever bound
// it (a holder that was not even a member).
func TestDeletedRangeHasNoLease(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, time.Minute)
	c := env.Client
	createRange(t, ctx, c, "gone")
	sid := openSession(t, ctx, c, "promoter", 60_000)
	e := grant(t, ctx, c, "gone", 0, "promoter", sid)
	if _, err := c.DeleteRange(ctx, connect.NewRequest(&tenurev1.DeleteRangeRequest{RangeId: "gone"})); err != nil {
		t.Fatal(err)
	}
	_, err := c.GetLease(ctx, connect.NewRequest(&tenurev1.GetLeaseRequest{RangeId: "gone"}))
	wantCode(t, "GetLease of a deleted range", err, connect.CodeNotFound)
	_, err = c.BindLease(ctx, connect.NewRequest(&tenurev1.BindLeaseRequest{RangeId: "gone", Epoch: e, HolderId: "promoter", SessionId: sid}))
	wantCode(t, "BindLease at a deleted range's last epoch", err, connect.CodeNotFound)
	batch, err := c.BindLeases(ctx, connect.NewRequest(&tenurev1.BindLeasesRequest{Binds: []*tenurev1.BindLeaseRequest{
		{RangeId: "gone", Epoch: e, HolderId: "promoter", SessionId: sid},
	}}))
	if err != nil || len(batch.Msg.GetResults()) != 1 || batch.Msg.GetResults()[0].GetError().GetCode() != uint32(connect.CodeNotFound) {
		t.Fatalf("BindLeases at a deleted range's last epoch = %v, %v; want its result NotFound", batch, err)
	}
	again := createRange(t, ctx, c, "gone")
	if again.GetEpoch() != e || again.GetLease() != nil {
		t.Fatalf("the range created again = epoch %d, lease %v; want epoch %d and no lease", again.GetEpoch(), again.GetLease(), e)
	}
	got, err := c.GetRange(ctx, connect.NewRequest(&tenurev1.GetRangeRequest{RangeId: "gone"}))
	if err != nil || got.Msg.GetRange().GetLease().GetLive() {
		t.Fatalf("GetRange of the range created again = %v, %v; want no live lease", got, err)
	}
}
