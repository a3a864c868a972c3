package lease_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
	"github.com/tenurelog/tenure/services/lease"
	"github.com/tenurelog/tenure/services/lease/leasetest"
)

// loseSession ends k's session the way a lease-service outage longer than
// the TTL does (etcd expires the lease; nobody closed it) and waits for k
// to find out and open a new one. It returns the new session.
func loseSession(t *testing.T, ctx context.Context, env *leasetest.Env, k *lease.Keeper) int64 {
	t.Helper()
	old := k.SessionID()
	if _, err := env.EtcdClient.Revoke(ctx, clientv3.LeaseID(old)); err != nil {
		t.Fatalf("revoke session %d: %v", old, err)
	}
	var sid int64
	eventually(t, 2*keeperTTL, "a new keeper session", func() bool {
		sid = k.SessionID()
		return sid != 0 && sid != old
	})
	return sid
}

func bindTo(t *testing.T, ctx context.Context, c tenurev1connect.LeaseServiceClient, rangeID string, epoch uint64, holder string) {
	t.Helper()
	if _, err := c.BindLease(ctx, connect.NewRequest(&tenurev1.BindLeaseRequest{RangeId: rangeID, Epoch: epoch, HolderId: holder})); err != nil {
		t.Fatalf("BindLease(%s, %d, %s) = %v", rangeID, epoch, holder, err)
	}
}

// TestKeeperLearnsBindToNewSession is issue 31's wedge at the keeper: the
// holder was told to hold an epoch (Hold, at adoption), then found the
// session it was bound to gone, and the promoter's bind of that epoch
// landed on the keeper's new session. The lease is live on this holder's
// open session: the keeper must call it valid again, without another Hold
// (nobody sends one). Before the fix it stayed invalid for good.
func TestKeeperLearnsBindToNewSession(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, time.Minute)
	k := startKeeper(t, env.Client, "rep-1")
	leadRange(t, ctx, env.Client, k, "rep-1", "r")

	loseSession(t, ctx, env, k)
	if k.Valid("r", 1) {
		t.Fatalf("Valid(r, 1) = true with the lease gone with the old session")
	}
	bindTo(t, ctx, env.Client, "r", 1, "rep-1")
	// One renewal interval (a third of the TTL) and a round trip; a TTL
	// leaves room for -race and a busy machine.
	took := eventually(t, keeperTTL, "Valid(r, 1) once the lease is bound to the new session", func() bool { return k.Valid("r", 1) })
	t.Logf("valid again %v after the bind", took)
}

// A lost range the keeper must not take back: its epoch moved on while it
// was lost, or its lease went to another holder. Binding the old epoch is
// refused by then, and a lease of the current epoch on another holder is
// not this holder's.
func TestKeeperRelearnsOnlyItsOwnEpoch(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, time.Minute)
	k := startKeeper(t, env.Client, "rep-1")
	leadRange(t, ctx, env.Client, k, "rep-1", "moved")
	leadRange(t, ctx, env.Client, k, "rep-1", "elsewhere")
	openSession(t, ctx, env.Client, "rep-2", ttlMs) // the other holder's session

	loseSession(t, ctx, env, k)
	// "moved": a promoter granted epoch 2 to rep-2 (the new leader).
	grant(t, ctx, env.Client, "moved", 1, "rep-2", 0)
	// "elsewhere": the lease of epoch 1 bound to another holder.
	bindTo(t, ctx, env.Client, "elsewhere", 1, "rep-2")
	// A third range it holds, bound back to it: the control, so the test
	// knows relearning ran.
	leadRange(t, ctx, env.Client, k, "rep-1", "control")
	loseSession(t, ctx, env, k)
	bindTo(t, ctx, env.Client, "control", 1, "rep-1")
	eventually(t, keeperTTL, "Valid(control, 1) once bound to the new session", func() bool { return k.Valid("control", 1) })
	// Two more renewal rounds for the others to be (wrongly) taken back.
	time.Sleep(keeperTTL * 2 / 3)
	if k.Valid("moved", 1) {
		t.Errorf("Valid(moved, 1) = true, but epoch 2 was granted since")
	}
	if k.Valid("elsewhere", 1) {
		t.Errorf("Valid(elsewhere, 1) = true, but its lease is bound to rep-2")
	}
}
