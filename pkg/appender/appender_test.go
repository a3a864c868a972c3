package appender_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/appender"
	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
	"github.com/tenurelog/tenure/services/lease/leasetest"
	"github.com/tenurelog/tenure/services/replica"
)

// member is one real replica: Badger in a temp dir, HTTP/2 on 127.0.0.1.
type member struct {
	id, url string
	rc      tenurev1connect.ReplicaServiceClient
	lc      tenurev1connect.LogServiceClient
	// stop closes the server and the replica, as a crash ends both.
	stop func()
}

func startMembers(t *testing.T, hc *http.Client, ids ...string) []*member {
	t.Helper()
	var out []*member
	for _, id := range ids {
		r, srv, err := replica.Start(replica.Config{ID: id, DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler), FetchWait: 100 * time.Millisecond,
			// Often, so a test of retention sees it at once; the other
			// tests keep the default policy, which removes nothing of theirs.
			RetentionInterval: 50 * time.Millisecond}, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var once sync.Once
		stop := func() { once.Do(func() { srv.Close(); r.Close() }) }
		t.Cleanup(stop)
		out = append(out, &member{id: id, url: srv.URL(), stop: stop,
			rc: tenurev1connect.NewReplicaServiceClient(hc, srv.URL(), transport.ClientOptions()...),
			lc: tenurev1connect.NewLogServiceClient(hc, srv.URL(), transport.ClientOptions()...)})
	}
	return out
}

// elect makes leader lead range "r" at epoch, the others follow, as a
// promoter would: fence all, adopt the leader, then the followers.
func elect(ctx context.Context, t *testing.T, ms []*member, epoch uint64, leader *member) {
	t.Helper()
	electWith(ctx, t, ms, epoch, leader, nil)
}

// electWith is elect with the range's retention policy in the adoptions
// (nil: the default).
func electWith(ctx context.Context, t *testing.T, ms []*member, epoch uint64, leader *member, retention *tenurev1.RetentionPolicy) {
	t.Helper()
	var set []*tenurev1.Replica
	for _, m := range ms {
		set = append(set, &tenurev1.Replica{Id: m.id, Address: m.url})
	}
	var bound uint64
	for _, m := range ms {
		resp, err := m.rc.Fence(ctx, connect.NewRequest(&tenurev1.FenceRequest{RangeId: "r", Epoch: epoch, FencerId: "test"}))
		if err != nil {
			t.Fatalf("Fence(%s, %d): %v", m.id, epoch, err)
		}
		bound = max(bound, resp.Msg.GetHighWaterMark())
	}
	adopt := func(m *member, role tenurev1.Role) {
		if _, err := m.rc.Adopt(ctx, connect.NewRequest(&tenurev1.AdoptRequest{RangeId: "r", Epoch: epoch, Role: role,
			LeaderId: leader.id, LeaderAddress: leader.url, Replicas: set, CommittedBound: bound, Retention: retention})); err != nil {
			t.Fatalf("Adopt(%s, %d, %v): %v", m.id, epoch, role, err)
		}
	}
	adopt(leader, tenurev1.Role_ROLE_LEADER)
	for _, m := range ms {
		if m != leader {
			adopt(m, tenurev1.Role_ROLE_FOLLOWER)
		}
	}
}

// An Appender told to follow the leader appends to whichever replica leads:
// a follower's not-leader answer names the leader, and the refused append
// goes there. It follows again when leadership moves back. Without
// FollowLeader the refusal is the answer.
func TestAppenderFollowsTheNotLeaderDetail(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hc := transport.NewHTTPClient()
	ms := startMembers(t, hc, "r1", "r2")
	r1, r2 := ms[0], ms[1]
	elect(ctx, t, ms, 1, r1)

	if _, err := appender.New(r2.lc).Append(ctx, "r", [][]byte{[]byte("x")}); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("Append to the follower without FollowLeader = %v, want failed precondition", err)
	}
	dial := func(url string) tenurev1connect.LogServiceClient {
		return tenurev1connect.NewLogServiceClient(hc, url, transport.ClientOptions()...)
	}
	a := appender.New(r2.lc, appender.FollowLeader(dial))
	defer a.Close()
	for i, want := range []struct {
		leader *member
		epoch  uint64
	}{{r1, 1}, {r1, 1}, {r2, 2}, {r2, 2}} {
		if i == 2 {
			elect(ctx, t, ms, 2, r2) // the appender's streams now reach a follower
		}
		ack, err := a.Append(ctx, "r", [][]byte{[]byte(fmt.Sprint("v", i))})
		if err != nil {
			t.Fatalf("append %d (leader %s): %v", i, want.leader.id, err)
		}
		if ack.GetEpoch() != want.epoch {
			t.Fatalf("append %d acknowledged at epoch %d, want %d (leader %s)", i, ack.GetEpoch(), want.epoch, want.leader.id)
		}
	}
}

// streamCounter counts the AppendStreams a client opens: the Appender
// opens one per try after a failed one.
type streamCounter struct{ n atomic.Int64 }

func (c *streamCounter) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc { return next }
func (c *streamCounter) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		c.n.Add(1)
		return next(ctx, spec)
	}
}
func (c *streamCounter) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// A follower's not-leader answer naming the leader wrote nothing and is
// refused the same way every time: without FollowLeader it is Append's
// answer after one try, not after DefaultRetries tries and their backoff
// (about 3 s) as if its outcome were unknown. A replica fenced by a
// promotion that names no leader yet is tried again, and the append
// succeeds once that replica is adopted as the leader.
func TestAppenderNotLeaderIsARefusal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hc := transport.NewHTTPClient()
	ms := startMembers(t, hc, "r1", "r2")
	r1, r2 := ms[0], ms[1]
	elect(ctx, t, ms, 1, r1)

	var opened streamCounter
	c := tenurev1connect.NewLogServiceClient(hc, r2.url, transport.ClientOptions(connect.WithInterceptors(&opened))...)
	a := appender.New(c)
	defer a.Close()
	began := time.Now()
	_, err := a.Append(ctx, "r", [][]byte{[]byte("x")})
	if nl := wire.NotLeader(err); nl.GetLeaderId() != "r1" {
		t.Fatalf("Append to the follower = %v, want a not-leader answer naming r1", err)
	}
	if n := opened.n.Load(); n != 1 {
		t.Fatalf("Append to the follower tried %d times in %v, want once: the refusal wrote nothing and is the answer", n, time.Since(began))
	}

	// r2 fenced at epoch 2 and not yet adopted knows no leader: the
	// Appender tries again, and the append lands once r2 leads.
	for _, m := range ms {
		if _, err := m.rc.Fence(ctx, connect.NewRequest(&tenurev1.FenceRequest{RangeId: "r", Epoch: 2, FencerId: "test"})); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() {
		_, err := a.Append(ctx, "r", [][]byte{[]byte("y")})
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for opened.n.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("the Appender did not try again on a fenced replica that names no leader (%d streams)", opened.n.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	elect(ctx, t, ms, 3, r2)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Append while r2 was fenced, then made leader: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Append did not return")
	}
}

// A leader that crashes answers nothing, so no not-leader answer names its
// successor. With LocateLeader, an append whose outcome the crash left
// unknown is sent again where locate finds the new leader, with the same
// sequence: it is written once. Without it, every retry goes to the dead
// address and the append fails.
func TestAppenderLocatesTheLeaderAfterACrash(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hc := transport.NewHTTPClient()
	ms := startMembers(t, hc, "r1", "r2", "r3")
	r1, r2, r3 := ms[0], ms[1], ms[2]
	elect(ctx, t, ms, 1, r1)
	dial := func(url string) tenurev1connect.LogServiceClient {
		return tenurev1connect.NewLogServiceClient(hc, url, transport.ClientOptions()...)
	}
	// locate asks the members that answer who leads, as a service might
	// (LeaseLeader asks the lease service instead).
	located := atomic.Int64{}
	locate := func(ctx context.Context, rangeID string) (string, error) {
		located.Add(1)
		for _, m := range ms {
			resp, err := m.rc.GetStatus(ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: rangeID}))
			if err != nil {
				continue
			}
			for _, st := range resp.Msg.GetRanges() {
				if st.GetRole() == tenurev1.Role_ROLE_LEADER {
					return m.url, nil
				}
			}
		}
		return "", nil
	}
	a := appender.New(r1.lc, appender.FollowLeader(dial), appender.LocateLeader(locate))
	defer a.Close()
	if _, err := a.Append(ctx, "r", [][]byte{[]byte("before")}); err != nil {
		t.Fatal(err)
	}
	r1.stop()
	// The survivors are promoted while the Appender retries.
	type result struct {
		ack *tenurev1.AppendResponse
		err error
	}
	done := make(chan result, 1)
	go func() {
		ack, err := a.Append(ctx, "r", [][]byte{[]byte("after")})
		done <- result{ack, err}
	}()
	for located.Load() == 0 {
		select {
		case r := <-done:
			t.Fatalf("Append after the leader crashed returned before looking for a leader: %v, %v", r.ack, r.err)
		case <-ctx.Done():
			t.Fatal("no locate call")
		case <-time.After(5 * time.Millisecond):
		}
	}
	elect(ctx, t, []*member{r2, r3}, 2, r2)
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		t.Fatal("Append did not return")
	}
	ack, err := r.ack, r.err
	if err != nil {
		t.Fatalf("Append after the leader crashed: %v (locate called %d times)", err, located.Load())
	}
	if ack.GetEpoch() != 2 {
		t.Fatalf("Append after the crash acknowledged at epoch %d, want 2 (r2 leads)", ack.GetEpoch())
	}
	resp, err := r2.lc.Read(ctx, connect.NewRequest(&tenurev1.ReadRequest{RangeId: "r"}))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, rec := range resp.Msg.GetRecords() {
		if string(rec.GetValue()) == "after" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("the new leader holds %d copies of the retried append, want 1", n)
	}
}

// LeaseLeader names the member holding the range's live lease at the
// current epoch, at its membership address; nobody while the lease is a
// promoter's (a promotion under way) or the range was never granted.
func TestLeaseLeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	env := leasetest.Start(t)
	lc := env.Client
	set := []*tenurev1.Replica{{Id: "r1", Address: "http://127.0.0.1:7101"}, {Id: "r2", Address: "http://127.0.0.1:7102"}}
	if _, err := lc.CreateRange(ctx, connect.NewRequest(&tenurev1.CreateRangeRequest{RangeId: "r", Replicas: set})); err != nil {
		t.Fatal(err)
	}
	locate := appender.LeaseLeader(lc)
	want := func(what, url string) {
		t.Helper()
		got, err := locate(ctx, "r")
		if err != nil || got != url {
			t.Fatalf("%s: LeaseLeader = %q, %v; want %q", what, got, err, url)
		}
	}
	want("never granted", "")
	session := func(holder string) int64 {
		resp, err := lc.OpenSession(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{HolderId: holder, HolderAddress: "http://elsewhere", TtlMs: 2000}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.GetSessionId()
	}
	p := session("promoter-1")
	if _, err := lc.GrantEpoch(ctx, connect.NewRequest(&tenurev1.GrantEpochRequest{RangeId: "r", PreviousEpoch: 0, HolderId: "promoter-1", SessionId: p})); err != nil {
		t.Fatal(err)
	}
	want("granted to a promoter", "")
	r2 := session("r2")
	if _, err := lc.BindLease(ctx, connect.NewRequest(&tenurev1.BindLeaseRequest{RangeId: "r", Epoch: 1, HolderId: "r2", SessionId: r2})); err != nil {
		t.Fatal(err)
	}
	want("bound to r2", "http://127.0.0.1:7102")
	if _, err := lc.CloseSession(ctx, connect.NewRequest(&tenurev1.CloseSessionRequest{SessionId: r2})); err != nil {
		t.Fatal(err)
	}
	want("r2's session closed", "")
	if _, err := locate(ctx, "nosuch"); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("LeaseLeader of an unknown range = %v, want NotFound", err)
	}
}

// A producer whose records retention removed is unknown to a leader that
// builds its dedupe state from the log (here a follower promoted after
// the removal): its next sequence is refused with OutOfRange, writing
// nothing. The Appender then goes on as a new producer, as Kafka's
// producer does after KIP-360, instead of failing a long-lived producer
// after a quiet spell longer than its range keeps records.
func TestAppenderRenewsAProducerRetentionForgot(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hc := transport.NewHTTPClient()
	ms := startMembers(t, hc, "a", "b", "c")
	electWith(ctx, t, ms, 1, ms[0], &tenurev1.RetentionPolicy{MaxAgeMs: 1})

	forgotten := appender.New(ms[0].lc, appender.FollowLeader(func(url string) tenurev1connect.LogServiceClient {
		return tenurev1connect.NewLogServiceClient(hc, url, transport.ClientOptions()...)
	}))
	defer forgotten.Close()
	if _, err := forgotten.Append(ctx, "r", [][]byte{[]byte("first")}); err != nil {
		t.Fatal(err)
	}
	// Another producer's appends, until retention has removed the first
	// producer's record on every member (the log start passes it).
	other := appender.New(ms[0].lc)
	defer other.Close()
	var passed uint64
	for deadline := time.Now().Add(30 * time.Second); ; {
		ack, err := other.Append(ctx, "r", [][]byte{[]byte("other")})
		if err != nil {
			t.Fatal(err)
		}
		passed = ack.GetBaseOffset()
		starts := 0
		for _, m := range ms {
			st, err := m.rc.GetStatus(ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: "r"}))
			if err == nil && st.Msg.GetRanges()[0].GetLogStart() >= 2 {
				starts++
			}
		}
		if starts == len(ms) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("retention did not remove offset 1 on every member within 30s (appended up to %d)", passed)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// b leads at epoch 2 and builds its dedupe state from what it keeps.
	electWith(ctx, t, ms, 2, ms[1], &tenurev1.RetentionPolicy{MaxAgeMs: 1})
	ack, err := forgotten.Append(ctx, "r", [][]byte{[]byte("second")})
	if err != nil {
		t.Fatalf("Append() by the producer retention forgot = %v, want it sent again by a new producer", err)
	}
	if ack.GetDuplicate() || ack.GetBaseOffset() <= passed {
		t.Errorf("Append() = %v, want a new record past offset %d", ack, passed)
	}
	// The renewed producer goes on with its next sequence.
	if _, err := forgotten.Append(ctx, "r", [][]byte{[]byte("third")}); err != nil {
		t.Errorf("the renewed producer's next Append() = %v", err)
	}
}

// Appends in flight together on one Appender, refused together by a
// replica that no longer leads, all go on to the leader it names: the
// first to follow moves the Appender, and the others, refused over the
// connection it left, follow it there. Each used to take the refusal for
// the named leader's own (the Appender already pointed there) and return
// it: `tenurectl bench` stopped on "not the leader" across a promotion
// (seen under load in TestCommandsAgainstACluster).
func TestAppenderConcurrentAppendsAllFollow(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	hc := transport.NewHTTPClient()
	ms := startMembers(t, hc, "r1", "r2")
	r2 := ms[1]
	elect(ctx, t, ms, 1, ms[0])
	dial := func(url string) tenurev1connect.LogServiceClient {
		return tenurev1connect.NewLogServiceClient(hc, url, transport.ClientOptions()...)
	}
	const rounds, inFlight = 30, 8
	for round := range rounds {
		// A fresh Appender at the follower each round: every append's
		// first try is refused with a detail naming r1.
		a := appender.New(r2.lc, appender.FollowLeader(dial))
		var wg sync.WaitGroup
		errs := make(chan error, inFlight)
		start := make(chan struct{})
		for i := range inFlight {
			wg.Go(func() {
				<-start
				if _, err := a.Append(ctx, "r", [][]byte{fmt.Appendf(nil, "%d-%d", round, i)}); err != nil {
					errs <- fmt.Errorf("round %d, append %d: %w", round, i, err)
				}
			})
		}
		close(start)
		wg.Wait()
		a.Close()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
}
