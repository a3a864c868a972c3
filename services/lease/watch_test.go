package lease_test

import (
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

const (
	granted    = tenurev1.LeaseEventType_LEASE_EVENT_TYPE_GRANTED
	bound      = tenurev1.LeaseEventType_LEASE_EVENT_TYPE_BOUND
	expired    = tenurev1.LeaseEventType_LEASE_EVENT_TYPE_EXPIRED
	released   = tenurev1.LeaseEventType_LEASE_EVENT_TYPE_RELEASED
	membership = tenurev1.LeaseEventType_LEASE_EVENT_TYPE_MEMBERSHIP
)

// TestLeaseExpiresWhenKeepAlivesStop: a holder that stops renewing loses its
// lease after its TTL, and the watch says EXPIRED (the promoter's failure
// signal), no earlier than the TTL allows.
func TestLeaseExpiresWhenKeepAlivesStop(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, time.Minute)
	info := createRange(t, ctx, env.Client, "r")
	w := startWatch(t, env.Client, info.GetMembershipRevision(), "r")

	sid := openSession(t, ctx, env.Client, "leader", ttlMs)
	e := grant(t, ctx, env.Client, "r", 0, "leader", sid)
	grantedAt := time.Now()
	w.expect(t, 10*time.Second, granted, "r")

	// TTL, plus etcd's expiry sweep (every 500 ms), plus headroom for a
	// loaded machine.
	ev := w.expect(t, ttlMs*time.Millisecond+5*time.Second, expired, "r")
	if elapsed := time.Since(grantedAt); elapsed < ttlMs*time.Millisecond*3/4 {
		t.Fatalf("lease expired %v after the grant, before its %d ms TTL", elapsed, ttlMs)
	}
	if ev.GetEpoch() != e || ev.GetHolderId() != "leader" || ev.GetRevision() <= info.GetMembershipRevision() {
		t.Fatalf("EXPIRED event = %v, want epoch %d, holder leader, a later revision", ev, e)
	}
	l, err := env.Client.GetLease(ctx, connect.NewRequest(&tenurev1.GetLeaseRequest{RangeId: "r"}))
	if err != nil {
		t.Fatalf("GetLease() = %v", err)
	}
	if got := l.Msg.GetLease(); got.GetLive() || got.GetSessionId() != 0 || got.GetEpoch() != e {
		t.Fatalf("GetLease() after expiry = %v, want epoch %d, not live, no session", got, e)
	}
	_, err = env.Client.KeepAlive(ctx, connect.NewRequest(&tenurev1.KeepAliveRequest{SessionId: sid}))
	wantCode(t, "KeepAlive(expired session)", err, connect.CodeNotFound)
}

// TestReleaseAndCloseAreReleasedNotExpired: a lease given up on purpose is
// reported RELEASED, both by ReleaseLease and by closing the session that
// holds it, so the promoter can tell a handover from a failure.
func TestReleaseAndCloseAreReleasedNotExpired(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, time.Minute)
	info := createRange(t, ctx, env.Client, "a")
	createRange(t, ctx, env.Client, "b")
	w := startWatch(t, env.Client, info.GetMembershipRevision(), "a", "b")

	sid := openSession(t, ctx, env.Client, "leader", 60_000)
	ea := grant(t, ctx, env.Client, "a", 0, "leader", sid)
	eb := grant(t, ctx, env.Client, "b", 0, "leader", sid)
	w.expect(t, 10*time.Second, granted, "a")
	w.expect(t, 10*time.Second, granted, "b")

	other := openSession(t, ctx, env.Client, "other", 60_000)
	_, err := env.Client.ReleaseLease(ctx, connect.NewRequest(&tenurev1.ReleaseLeaseRequest{RangeId: "a", Epoch: ea, SessionId: other}))
	wantCode(t, "ReleaseLease(by another session)", err, connect.CodeFailedPrecondition)
	_, err = env.Client.ReleaseLease(ctx, connect.NewRequest(&tenurev1.ReleaseLeaseRequest{RangeId: "a", Epoch: ea + 1, SessionId: sid}))
	wantCode(t, "ReleaseLease(epoch not current)", err, connect.CodeFailedPrecondition)

	if _, err := env.Client.ReleaseLease(ctx, connect.NewRequest(&tenurev1.ReleaseLeaseRequest{RangeId: "a", Epoch: ea, SessionId: sid})); err != nil {
		t.Fatalf("ReleaseLease(a) = %v", err)
	}
	if ev := w.expect(t, 10*time.Second, released, "a"); ev.GetEpoch() != ea || ev.GetHolderId() != "leader" {
		t.Fatalf("RELEASED event = %v, want epoch %d by leader", ev, ea)
	}
	l, err := env.Client.GetLease(ctx, connect.NewRequest(&tenurev1.GetLeaseRequest{RangeId: "a"}))
	if err != nil || l.Msg.GetLease().GetLive() || l.Msg.GetLease().GetSessionId() != 0 {
		t.Fatalf("GetLease(a) after release = %v, %v; want not live, no session", l, err)
	}

	if _, err := env.Client.CloseSession(ctx, connect.NewRequest(&tenurev1.CloseSessionRequest{SessionId: sid})); err != nil {
		t.Fatalf("CloseSession() = %v", err)
	}
	if ev := w.expect(t, 10*time.Second, released, "b"); ev.GetEpoch() != eb || ev.GetHolderId() != "leader" {
		t.Fatalf("event for b after CloseSession = %v, want RELEASED epoch %d by leader", ev, eb)
	}
	w.none(t, 300*time.Millisecond)
	_, err = env.Client.CloseSession(ctx, connect.NewRequest(&tenurev1.CloseSessionRequest{SessionId: sid}))
	wantCode(t, "CloseSession(closed session)", err, connect.CodeNotFound)
}

// TestWatchResumesWithoutGapsOrDuplicates: a watcher whose stream dropped
// passes the revision of the last event it saw and gets exactly the events
// it missed, in order, then new ones; nothing twice, and nothing of ranges
// it did not ask for.
func TestWatchResumesWithoutGapsOrDuplicates(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, time.Minute)
	start := currentRevision(t, env)
	w := startWatch(t, env.Client, start, "r")

	info := createRange(t, ctx, env.Client, "r")
	if ev := w.expect(t, 10*time.Second, membership, "r"); ev.GetRevision() != info.GetMembershipRevision() {
		t.Fatalf("MEMBERSHIP event revision = %d, want the membership revision %d", ev.GetRevision(), info.GetMembershipRevision())
	}
	promoter := openSession(t, ctx, env.Client, "promoter", 60_000)
	openSession(t, ctx, env.Client, "leader", 60_000) // BindLease finds it as leader's newest
	e1 := grant(t, ctx, env.Client, "r", 0, "promoter", promoter)
	last := w.expect(t, 10*time.Second, granted, "r")
	w.cancel() // the stream drops

	// Changes while nobody watches, including another range's.
	createRange(t, ctx, env.Client, "unwatched")
	if _, err := env.Client.BindLease(ctx, connect.NewRequest(&tenurev1.BindLeaseRequest{RangeId: "r", Epoch: e1, HolderId: "leader"})); err != nil {
		t.Fatalf("BindLease() = %v", err)
	}
	if _, err := env.Client.ChangeMembership(ctx, connect.NewRequest(&tenurev1.ChangeMembershipRequest{
		RangeId: "r", Step: tenurev1.MembershipStep_MEMBERSHIP_STEP_ADD_LEARNER,
		Replica: &tenurev1.Replica{Id: "r4", Address: "http://r4"}, ExpectedRevision: info.GetMembershipRevision(),
	})); err != nil {
		t.Fatalf("ChangeMembership() = %v", err)
	}
	e2 := grant(t, ctx, env.Client, "r", e1, "promoter", promoter)
	if _, err := env.Client.ReleaseLease(ctx, connect.NewRequest(&tenurev1.ReleaseLeaseRequest{RangeId: "r", Epoch: e2, SessionId: promoter})); err != nil {
		t.Fatalf("ReleaseLease() = %v", err)
	}

	resumed := startWatch(t, env.Client, last.GetRevision(), "r")
	want := []struct {
		typ    tenurev1.LeaseEventType
		epoch  uint64
		holder string
	}{
		{bound, e1, "leader"},
		{membership, 0, ""},
		{granted, e2, "promoter"},
		{released, e2, "promoter"},
	}
	prevRev := last.GetRevision()
	for i, wt := range want {
		ev := resumed.next(t, 10*time.Second)
		if ev.GetRangeId() != "r" || ev.GetType() != wt.typ || ev.GetEpoch() != wt.epoch || ev.GetHolderId() != wt.holder || ev.GetRevision() <= prevRev {
			t.Fatalf("resumed event %d = %v, want %v epoch %d holder %q after revision %d", i, ev, wt.typ, wt.epoch, wt.holder, prevRev)
		}
		prevRev = ev.GetRevision()
	}
	// And the stream goes on with new events.
	e3 := grant(t, ctx, env.Client, "r", e2, "promoter", promoter)
	if ev := resumed.next(t, 10*time.Second); ev.GetType() != granted || ev.GetEpoch() != e3 || ev.GetRevision() <= prevRev {
		t.Fatalf("event after resuming = %v, want GRANTED epoch %d", ev, e3)
	}
	resumed.none(t, 300*time.Millisecond)
}

// TestWatchFromCompactedRevision: history etcd has compacted cannot be
// replayed; the watcher is told so (OutOfRange) instead of silently missing
// events.
func TestWatchFromCompactedRevision(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, time.Minute)
	old := createRange(t, ctx, env.Client, "r").GetMembershipRevision()
	createRange(t, ctx, env.Client, "s")
	now := currentRevision(t, env)
	if _, err := env.EtcdClient.Compact(ctx, now); err != nil {
		t.Fatalf("Compact(%d) = %v", now, err)
	}
	w := startWatch(t, env.Client, old-1)
	select {
	case ev, ok := <-w.events:
		if ok {
			t.Fatalf("watch from a compacted revision sent %v, want an error", ev)
		}
		wantCode(t, "WatchLeases(compacted revision)", <-w.err, connect.CodeOutOfRange)
	case <-time.After(10 * time.Second):
		t.Fatalf("watch from a compacted revision neither failed nor sent within 10s")
	}
}

// TestListRangesPages: ranges come in id order, a page at a time, with
// epochs and leases.
func TestListRangesPages(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, time.Minute)
	for _, id := range []string{"e", "a", "c", "b", "d"} {
		createRange(t, ctx, env.Client, id)
	}
	sid := openSession(t, ctx, env.Client, "leader", 60_000)
	grant(t, ctx, env.Client, "c", 0, "leader", sid)

	var ids []string
	after := ""
	for page := 0; page < 10; page++ {
		resp, err := env.Client.ListRanges(ctx, connect.NewRequest(&tenurev1.ListRangesRequest{AfterRangeId: after, Limit: 2}))
		if err != nil {
			t.Fatalf("ListRanges(after %q) = %v", after, err)
		}
		for _, r := range resp.Msg.GetRanges() {
			ids = append(ids, r.GetRangeId())
			if r.GetRangeId() == "c" && (r.GetEpoch() != 1 || !r.GetLease().GetLive() || r.GetLease().GetHolderId() != "leader") {
				t.Fatalf("ListRanges: range c = %v, want epoch 1 with a live lease of leader", r)
			}
			after = r.GetRangeId()
		}
		if !resp.Msg.GetMore() {
			break
		}
	}
	if got, want := ids, []string{"a", "b", "c", "d", "e"}; !slices.Equal(got, want) {
		t.Fatalf("ListRanges pages = %v, want %v", got, want)
	}
}
