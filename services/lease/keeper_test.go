package lease_test

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
)

const keeperTTL = ttlMs * time.Millisecond

// startKeeper starts a Keeper for holder and waits for its session.
func startKeeper(t *testing.T, c tenurev1connect.LeaseServiceClient, holder string) *lease.Keeper {
	t.Helper()
	k, err := lease.NewKeeper(c, holder, "http://"+holder, lease.WithSessionTTL(keeperTTL))
	if err != nil {
		t.Fatalf("NewKeeper() = %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		k.Close(ctx)
	})
	if _, err := k.Session(testCtx(t, 10*time.Second)); err != nil {
		t.Fatalf("Keeper.Session() = %v", err)
	}
	return k
}

// leadRange makes holder (through its keeper's session, the holder's newest)
// the lease holder of a new range at epoch 1 and waits until the keeper
// calls it valid.
func leadRange(t *testing.T, ctx context.Context, c tenurev1connect.LeaseServiceClient, k *lease.Keeper, holder, rangeID string) {
	t.Helper()
	createRange(t, ctx, c, rangeID)
	e := grant(t, ctx, c, rangeID, 0, holder, 0)
	k.Hold(rangeID, e)
	eventually(t, 5*time.Second, "Valid("+rangeID+") after Hold", func() bool { return k.Valid(rangeID, e) })
}

// TestKeeperValidOnlyWhileRenewed: with the lease service gone, no renewal
// succeeds, and the keeper stops calling the lease valid before the TTL has
// run out since the last renewal it sent.
func TestKeeperValidOnlyWhileRenewed(t *testing.T) {
	env := newEnv(t)
	// A server of its own for the keeper, so the test can take it away.
	srv, err := transport.Serve("127.0.0.1:0", env.Service.Registration())
	if err != nil {
		t.Fatalf("Serve() = %v", err)
	}
	ctx := testCtx(t, time.Minute)
	k := startKeeper(t, leasetest.Client(srv.URL()), "rep-1")
	leadRange(t, ctx, env.Client, k, "rep-1", "r")
	if k.Valid("r", 2) || k.Valid("other", 1) {
		t.Fatalf("Valid() true for an epoch or range not held")
	}
	// Renewals keep it valid well past one TTL.
	time.Sleep(keeperTTL + keeperTTL/2)
	if !k.Valid("r", 1) {
		t.Fatalf("Valid(r, 1) = false after %v of successful renewals", keeperTTL*3/2)
	}

	srv.Close()
	took := eventually(t, keeperTTL+time.Second, "Valid(r, 1) false after the lease service stopped", func() bool { return !k.Valid("r", 1) })
	if took >= keeperTTL {
		t.Fatalf("Valid(r, 1) stayed true %v after renewals stopped, want under the %v TTL", took, keeperTTL)
	}
}

// TestKeeperInvalidWhileEtcdIsDown: etcd stopped under a running lease
// service has the same effect; once etcd is back (it extends its leases on
// restart, and nobody could grant meanwhile) the lease is valid again.
func TestKeeperInvalidWhileEtcdIsDown(t *testing.T) {
	env := leasetest.Start(t, lease.WithRequestTimeout(500*time.Millisecond))
	ctx := testCtx(t, time.Minute)
	k := startKeeper(t, env.Client, "rep-1")
	leadRange(t, ctx, env.Client, k, "rep-1", "r")

	env.Etcd.Stop()
	took := eventually(t, keeperTTL+time.Second, "Valid(r, 1) false after etcd stopped", func() bool { return !k.Valid("r", 1) })
	if took >= keeperTTL {
		t.Fatalf("Valid(r, 1) stayed true %v after etcd stopped, want under the %v TTL", took, keeperTTL)
	}
	if err := env.Etcd.Restart(); err != nil {
		t.Fatalf("Restart() = %v", err)
	}
	eventually(t, 30*time.Second, "Valid(r, 1) after etcd is back", func() bool { return k.Valid("r", 1) })
}

// TestKeeperSuperseded: a grant on a held range makes the keeper's next
// renewal report it, and the range is invalid from then on; the other held
// ranges are not affected.
func TestKeeperSuperseded(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, time.Minute)
	k := startKeeper(t, env.Client, "rep-1")
	leadRange(t, ctx, env.Client, k, "rep-1", "r")
	leadRange(t, ctx, env.Client, k, "rep-1", "s")

	promoter := openSession(t, ctx, env.Client, "promoter", 60_000)
	grant(t, ctx, env.Client, "r", 1, "promoter", promoter)
	// One renewal interval (ttl/3), plus headroom.
	eventually(t, keeperTTL/3+2*time.Second, "Valid(r, 1) false after a grant of epoch 2", func() bool { return !k.Valid("r", 1) })
	time.Sleep(keeperTTL / 2) // a renewal or more later
	if k.Valid("r", 1) {
		t.Fatalf("Valid(r, 1) true again after being superseded")
	}
	if !k.Valid("s", 1) {
		t.Fatalf("Valid(s, 1) = false; only r was superseded")
	}
}

// TestKeeperSessionLost: when the keeper's session ends behind its back, its
// leases are gone: every held range turns invalid and stays so, while the
// keeper opens a new session, until the holder is bound again and says so
// with Hold.
func TestKeeperSessionLost(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, time.Minute)
	k := startKeeper(t, env.Client, "rep-1")
	leadRange(t, ctx, env.Client, k, "rep-1", "r")
	old := k.SessionID()

	if _, err := env.Client.CloseSession(ctx, connect.NewRequest(&tenurev1.CloseSessionRequest{SessionId: old})); err != nil {
		t.Fatalf("CloseSession() = %v", err)
	}
	eventually(t, keeperTTL+2*time.Second, "a new keeper session", func() bool {
		sid := k.SessionID()
		return sid != 0 && sid != old
	})
	if k.Valid("r", 1) {
		t.Fatalf("Valid(r, 1) true after the session holding it ended")
	}
	// The promoter binds the current epoch to the holder's new session.
	if _, err := env.Client.BindLease(ctx, connect.NewRequest(&tenurev1.BindLeaseRequest{RangeId: "r", Epoch: 1, HolderId: "rep-1"})); err != nil {
		t.Fatalf("BindLease() = %v", err)
	}
	k.Hold("r", 1)
	eventually(t, 5*time.Second, "Valid(r, 1) after rebinding", func() bool { return k.Valid("r", 1) })
}

// TestKeeperCloseReleases: a keeper closed on shutdown releases its leases,
// so the promoter sees RELEASED at once instead of waiting for EXPIRED.
func TestKeeperCloseReleases(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, time.Minute)
	k := startKeeper(t, env.Client, "rep-1")
	w := startWatch(t, env.Client, currentRevision(t, env), "r")
	leadRange(t, ctx, env.Client, k, "rep-1", "r")
	w.expect(t, 10*time.Second, membership, "r")
	w.expect(t, 10*time.Second, granted, "r")
	if err := k.Close(ctx); err != nil {
		t.Fatalf("Keeper.Close() = %v", err)
	}
	if k.Valid("r", 1) {
		t.Fatalf("Valid(r, 1) true after Close")
	}
	w.expect(t, 5*time.Second, released, "r")
}
