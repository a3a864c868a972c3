package lease_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/lease"
	"github.com/tenurelog/tenure/services/lease/leasetest"
)

// TestConcurrentGrantsAreDistinctAndGapFree: many promoters racing for the
// same range each get distinct epochs, and together every epoch 1..N exactly
// once (invariant 7). The losers learn the current epoch from the Aborted
// answer and retry with it.
func TestConcurrentGrantsAreDistinctAndGapFree(t *testing.T) {
	const (
		workers   = 16
		perWorker = 20
		total     = workers * perWorker
		// Bounds a worker's attempts: each round of the race has a winner,
		// so a worker never loses more than all the other grants.
		maxAttempts = total * 2
	)
	env := newEnv(t)
	ctx := testCtx(t, 2*time.Minute)
	createRange(t, ctx, env.Client, "contended")

	var mu sync.Mutex
	var got []uint64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		holder := fmt.Sprintf("promoter-%02d", w)
		// The session must outlive the test (its ctx bounds it to 2
		// minutes) and nothing keeps it alive: at 60 s a loaded run of
		// 320 contended grants took 62 s, and every worker's session
		// expired under it (FailedPrecondition, not the Aborted asked).
		sid := openSession(t, ctx, env.Client, holder, 180_000)
		wg.Go(func() {
			var prev uint64
			won := 0
			for attempt := 0; won < perWorker; attempt++ {
				if attempt == maxAttempts {
					errs <- fmt.Errorf("%s: %d grants after %d attempts", holder, won, attempt)
					return
				}
				resp, err := env.Client.GrantEpoch(ctx, connect.NewRequest(&tenurev1.GrantEpochRequest{
					RangeId: "contended", PreviousEpoch: prev, HolderId: holder, SessionId: sid,
				}))
				if err != nil {
					cur, ok := lease.CurrentEpoch(err)
					if connect.CodeOf(err) != connect.CodeAborted || !ok || !strings.Contains(err.Error(), fmt.Sprintf("current epoch is %d", cur)) {
						errs <- fmt.Errorf("%s: GrantEpoch(previous %d) = %v, want Aborted naming the current epoch", holder, prev, err)
						return
					}
					prev = cur
					continue
				}
				e := resp.Msg.GetEpoch()
				if e != prev+1 {
					errs <- fmt.Errorf("%s: GrantEpoch(previous %d) = %d, want %d", holder, prev, e, prev+1)
					return
				}
				mu.Lock()
				got = append(got, e)
				mu.Unlock()
				prev, won = e, won+1
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	slices.Sort(got)
	for i, e := range got {
		if e != uint64(i+1) {
			t.Fatalf("granted epochs sorted = %v..., want 1..%d each exactly once (position %d holds %d)", got[:min(len(got), i+3)], total, i, e)
		}
	}
	if len(got) != total {
		t.Fatalf("%d epochs granted, want %d", len(got), total)
	}
	r, err := env.Client.GetRange(ctx, connect.NewRequest(&tenurev1.GetRangeRequest{RangeId: "contended"}))
	if err != nil || r.Msg.GetRange().GetEpoch() != total {
		t.Fatalf("GetRange() = %v, %v; want epoch %d", r, err, total)
	}
}

// TestEpochsStayMonotonicAcrossEtcdRestart: etcd stopped and restarted on
// the same data under a running lease service. While etcd is down a grant
// fails with Unavailable (nothing granted); afterwards the next grant is
// strictly greater than every grant before, and a grant from the old view is
// refused.
func TestEpochsStayMonotonicAcrossEtcdRestart(t *testing.T) {
	env := leasetest.Start(t, lease.WithRequestTimeout(time.Second))
	ctx := testCtx(t, 2*time.Minute)
	createRange(t, ctx, env.Client, "r")
	// A long TTL: this test is about epochs, not expiry.
	sid := openSession(t, ctx, env.Client, "promoter", 60_000)
	e1 := grant(t, ctx, env.Client, "r", 0, "promoter", sid)
	e2 := grant(t, ctx, env.Client, "r", e1, "promoter", sid)

	env.Etcd.Stop()
	_, err := env.Client.GrantEpoch(testCtx(t, 5*time.Second), connect.NewRequest(&tenurev1.GrantEpochRequest{
		RangeId: "r", PreviousEpoch: e2, HolderId: "promoter", SessionId: sid,
	}))
	wantCode(t, "GrantEpoch() while etcd is down", err, connect.CodeUnavailable)
	if err := env.Etcd.Restart(); err != nil {
		t.Fatalf("Restart() = %v", err)
	}

	// The service's etcd client reconnects by itself; bounded retries
	// while it does. An attempt answered Unavailable has an unknown
	// outcome: the service gave up waiting (its request timeout) on a
	// transaction the restarted etcd may still commit. The retry then reads
	// that grant as a lost race, Aborted naming e2+1, as the README's lease
	// client section says: that is the grant after the restart too.
	var e3 uint64
	unknown := 0
	eventually(t, 30*time.Second, "grant after restart", func() bool {
		resp, err := env.Client.GrantEpoch(ctx, connect.NewRequest(&tenurev1.GrantEpochRequest{
			RangeId: "r", PreviousEpoch: e2, HolderId: "promoter", SessionId: sid,
		}))
		switch c := connect.CodeOf(err); {
		case err == nil:
			e3 = resp.Msg.GetEpoch()
			return true
		case c == connect.CodeUnavailable:
			unknown++
			return false
		case c == connect.CodeAborted && unknown > 0:
			cur, ok := lease.CurrentEpoch(err)
			if !ok || cur != e2+1 {
				t.Fatalf("GrantEpoch() after %d unknown outcomes = %v, want the current epoch %d", unknown, err, e2+1)
			}
			e3 = cur
			return true
		default:
			t.Fatalf("GrantEpoch() after restart = %v, want success or Unavailable", err)
			return false
		}
	})
	if !(e1 < e2 && e2 < e3) || e3 != 3 {
		t.Fatalf("epochs before, before, after restart = %d, %d, %d; want 1, 2, 3", e1, e2, e3)
	}
	_, err = env.Client.GrantEpoch(ctx, connect.NewRequest(&tenurev1.GrantEpochRequest{
		RangeId: "r", PreviousEpoch: e1, HolderId: "promoter", SessionId: sid,
	}))
	wantCode(t, "GrantEpoch(previous 1) after restart", err, connect.CodeAborted)
	if cur, ok := lease.CurrentEpoch(err); !ok || cur != e3 {
		t.Fatalf("CurrentEpoch(%v) = %d, %v; want %d", err, cur, ok, e3)
	}
}

// TestTwoInstancesShareOneEtcd: the service keeps no state of its own, so a
// second instance on the same etcd sees the first one's ranges, grants,
// sessions and events.
func TestTwoInstancesShareOneEtcd(t *testing.T) {
	a := newEnv(t)
	b := newEnv(t) // same test, same prefix: same ranges
	ctx := testCtx(t, time.Minute)
	info := createRange(t, ctx, a.Client, "shared")

	w := startWatch(t, b.Client, info.GetMembershipRevision(), "shared")
	sid := openSession(t, ctx, a.Client, "promoter", 60_000)
	e := grant(t, ctx, a.Client, "shared", 0, "promoter", sid)
	if ev := w.expect(t, 10*time.Second, tenurev1.LeaseEventType_LEASE_EVENT_TYPE_GRANTED, "shared"); ev.GetEpoch() != e || ev.GetHolderId() != "promoter" {
		t.Fatalf("instance b's watch: %v, want GRANTED epoch %d to promoter", ev, e)
	}

	r, err := b.Client.GetRange(ctx, connect.NewRequest(&tenurev1.GetRangeRequest{RangeId: "shared"}))
	if err != nil {
		t.Fatalf("b.GetRange() = %v", err)
	}
	if got := r.Msg.GetRange(); got.GetEpoch() != e || got.GetLease().GetSessionId() != sid || !got.GetLease().GetLive() {
		t.Fatalf("b.GetRange() = %v, want epoch %d, live lease of session %d", got, e, sid)
	}
	// A grant on b from a stale view loses against a's grant.
	_, err = b.Client.GrantEpoch(ctx, connect.NewRequest(&tenurev1.GrantEpochRequest{RangeId: "shared", PreviousEpoch: 0, HolderId: "promoter", SessionId: sid}))
	wantCode(t, "b.GrantEpoch(previous 0)", err, connect.CodeAborted)
	// a's session is renewed through b.
	if _, err := b.Client.KeepAlive(ctx, connect.NewRequest(&tenurev1.KeepAliveRequest{SessionId: sid, Held: []*tenurev1.RangeEpoch{{RangeId: "shared", Epoch: e}}})); err != nil {
		t.Fatalf("b.KeepAlive(a's session) = %v", err)
	}
}

// TestGrantRemembersTheSessionYetRefusesItClosed: after a holder's first
// grant its session is remembered, so the next grant costs etcd one
// transaction and no read. A remembered session still grants nothing once
// it is marked closing (its record rewritten, the lease not yet revoked)
// or closed: the transaction compares the record's revisions, which a
// remembered copy cannot pass.
func TestGrantRemembersTheSessionYetRefusesItClosed(t *testing.T) {
	kv := &countingKV{}
	env := newEnv(t, lease.WithStoreWrappers(
		func(inner clientv3.KV) clientv3.KV { kv.KV = inner; return kv },
		func(inner clientv3.Lease) clientv3.Lease { return inner },
	))
	ctx := testCtx(t, 30*time.Second)
	for _, id := range []string{"a", "b", "c", "d"} {
		createRange(t, ctx, env.Client, id)
	}
	epochOf := func(id string) uint64 {
		t.Helper()
		r, err := env.Client.GetRange(ctx, connect.NewRequest(&tenurev1.GetRangeRequest{RangeId: id}))
		if err != nil {
			t.Fatalf("GetRange(%q) = %v", id, err)
		}
		return r.Msg.GetRange().GetEpoch()
	}
	sid := openSession(t, ctx, env.Client, "promoter", 60_000)
	grant(t, ctx, env.Client, "a", 0, "promoter", sid)
	kv.reset()
	grant(t, ctx, env.Client, "b", 0, "promoter", sid)
	if gets, txns := kv.gets.Load(), kv.txns.Load(); gets != 0 || txns != 1 {
		t.Errorf("a second grant under one session cost etcd %d gets and %d txns; want 0 and 1", gets, txns)
	}

	// Marked closing, as CloseSession does just before it revokes.
	key := fmt.Sprintf("%ssessions/promoter/%016x", testPrefix(t), uint64(sid))
	got, err := env.EtcdClient.Get(ctx, key)
	if err != nil || len(got.Kvs) != 1 {
		t.Fatalf("session record %s: %v, %v", key, got, err)
	}
	closing := strings.Replace(string(got.Kvs[0].Value), "{", `{"closing":true,`, 1)
	if _, err := env.EtcdClient.Put(ctx, key, closing, clientv3.WithLease(clientv3.LeaseID(sid))); err != nil {
		t.Fatal(err)
	}
	_, err = env.Client.GrantEpoch(ctx, connect.NewRequest(&tenurev1.GrantEpochRequest{RangeId: "c", HolderId: "promoter", SessionId: sid}))
	wantCode(t, "GrantEpoch under a remembered session since marked closing", err, connect.CodeFailedPrecondition)
	if e := epochOf("c"); e != 0 {
		t.Fatalf("range c at epoch %d after a grant under a closing session; want 0", e)
	}

	// Closed outright: remembered by a grant, then closed.
	sid2 := openSession(t, ctx, env.Client, "promoter", 60_000)
	grant(t, ctx, env.Client, "c", 0, "promoter", sid2)
	if _, err := env.Client.CloseSession(ctx, connect.NewRequest(&tenurev1.CloseSessionRequest{SessionId: sid2})); err != nil {
		t.Fatalf("CloseSession() = %v", err)
	}
	_, err = env.Client.GrantEpoch(ctx, connect.NewRequest(&tenurev1.GrantEpochRequest{RangeId: "d", HolderId: "promoter", SessionId: sid2}))
	wantCode(t, "GrantEpoch under a remembered session since closed", err, connect.CodeFailedPrecondition)
	_, err = env.Client.BindLease(ctx, connect.NewRequest(&tenurev1.BindLeaseRequest{RangeId: "c", Epoch: 1, HolderId: "promoter", SessionId: sid2}))
	wantCode(t, "BindLease under a remembered session since closed", err, connect.CodeFailedPrecondition)
	if e := epochOf("d"); e != 0 {
		t.Fatalf("range d at epoch %d after a grant under a closed session; want 0", e)
	}
}
