package replica_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/replica"
)

// appendTo appends vals to range id on n.
func (c *cluster) appendTo(ctx context.Context, n *node, id string, vals ...[]byte) error {
	_, err := n.lc.Append(ctx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: id, Records: vals}))
	return err
}

// waitRangeCaughtUp waits until every node holds range id up to the
// leader's log end, HWM included.
func (c *cluster) waitRangeCaughtUp(leader *node, id string) {
	c.t.Helper()
	for _, f := range c.nodes {
		waitUntil(c.t, 20*time.Second, f.id+" catching up on "+id, func() bool {
			l, s := c.rangeStatus(leader, id), c.rangeStatus(f, id)
			return s.GetLogEnd() == l.GetLogEnd() && s.GetHighWaterMark() == l.GetHighWaterMark() && l.GetHighWaterMark() == l.GetLogEnd()
		})
	}
}

// Many ranges replicate over one fetch session per (follower, leader)
// pair: no per-range stream is opened, every range's records reach every
// follower, and idle ranges cost only the sessions' heartbeats, not a long
// poll each.
func TestFetchSessionCarriesEveryRange(t *testing.T) {
	c := newCluster(t, 3)
	const ranges = 24
	ids := make([]string, ranges)
	for i := range ids {
		ids[i] = fmt.Sprintf("s%02d", i)
		// Leaders spread over the three: each follower has a session to
		// each of the two other replicas.
		leader := c.node(i%3 + 1)
		var followers []*node
		for _, n := range c.nodes {
			if n != leader {
				followers = append(followers, n)
			}
		}
		c.electRange(ids[i], 1, leader, followers...)
	}
	ctx := ctxT(t)
	var wg sync.WaitGroup
	errs := make(chan error, ranges)
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 10 {
				if err := c.appendTo(ctx, c.node(i%3+1), id, values(fmt.Sprintf("%s-%d-", id, j), 3)...); err != nil {
					errs <- fmt.Errorf("append to %s: %w", id, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i, id := range ids {
		c.waitRangeCaughtUp(c.node(i%3+1), id)
	}
	for _, n := range c.nodes {
		// The first range elected on each leader was followed alone for a
		// moment, on its own FetchStream (see the next test): one each.
		if got := n.gate.count("FetchStream") + n.gate.count("Fetch"); got > 2 {
			t.Errorf("%s opened %d per-range fetch calls, beyond one per leader for the first range; every range should ride the sessions", n.id, got)
		}
		// One session to each other replica; a few more only if one broke.
		if got := n.gate.count("FetchSession"); got < 2 || got > 6 {
			t.Errorf("%s opened %d fetch sessions for %d ranges on 2 leaders, want 2 (a few more only after a failure)", n.id, got, ranges)
		}
	}

	// Idle: per-range long polls (300 ms here) would be ranges*2/0.3 = 160
	// answers a second in all; sessions send a heartbeat per FetchWait, 6
	// streams / 0.3 s = 20 a second. Counted over a second, with room.
	before := make([]uint64, len(c.nodes))
	for i, n := range c.nodes {
		before[i] = n.r.SessionMessages()
	}
	time.Sleep(time.Second)
	var idle uint64
	for i, n := range c.nodes {
		idle += n.r.SessionMessages() - before[i]
	}
	if idle > 60 {
		t.Errorf("%d session messages in an idle second for %d ranges: idle ranges are being answered, not held", idle, ranges)
	}
	t.Logf("%d session messages received in an idle second (24 ranges, 6 sessions, heartbeat 300ms)", idle)

	// And a write after the idle spell still reaches every follower at
	// once: a held pull is answered on news, however long it was held.
	if err := c.appendTo(ctx, c.node(1), ids[0], values("late", 1)...); err != nil {
		t.Fatal(err)
	}
	c.waitRangeCaughtUp(c.node(1), ids[0])
}

// A session message that carries records for many ranges is written by
// the session itself, every range's records in one group commit (one WAL
// sync), not by each range's fetch loop on its own. The test gate holds
// r2's session messages while one record is appended to each range, then
// hands them over as one message, as a leader combines the answers that
// became ready while it was sending; r3 meanwhile acknowledges the appends.
func TestFetchSessionWritesManyRangesInOneCommit(t *testing.T) {
	c := newCluster(t, 3)
	const ranges = 8
	ids := sessionRanges(c, "b", ranges)
	r2 := c.node(2)
	before := r2.r.SessionAppliedAnswers()
	r2.gate.holding.Store(true)
	held := r2.gate.heldRecordAnswers.Load()
	if err := appendEach(ctxT(t), c, ids); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "r2's session holding an answer with records for every range", func() bool {
		return r2.gate.heldRecordAnswers.Load()-held >= ranges
	})
	r2.gate.holding.Store(false)
	for _, id := range ids {
		c.waitRangeCaughtUp(c.node(1), id)
	}
	if got := r2.r.SessionAppliedAnswers() - before; got != ranges {
		t.Fatalf("r2's session wrote %d of the %d ranges' answers itself; want all, in one commit", got, ranges)
	}
	for _, id := range ids {
		l, err := c.node(1).r.LogForTest(id)
		if err != nil {
			t.Fatal(err)
		}
		f, err := r2.r.LogForTest(id)
		if err != nil {
			t.Fatal(err)
		}
		if len(l) != 2 || len(f) != len(l) || string(f[1].GetValue()) != string(l[1].GetValue()) {
			t.Fatalf("range %s: r2 holds %d records, the leader %d; want the epoch start and the one appended, the same", id, len(f), len(l))
		}
	}
}

// sessionRanges elects n ranges led by r1 and followed by r2 and r3, waits
// until they have caught up and until every pull rides r2's and r3's
// sessions, and returns their ids.
func sessionRanges(c *cluster, prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s%d", prefix, i)
		c.electRange(ids[i], 1, c.node(1), c.node(2), c.node(3))
	}
	for _, id := range ids {
		c.waitRangeCaughtUp(c.node(1), id)
	}
	// The first range was followed alone for a moment, on a FetchStream of
	// its own (TestFetchSessionOnceTwoRangesShareALeader): its long poll
	// there ends within a FetchWait, and its next pull rides the session.
	time.Sleep(3 * c.fetchWait)
	return ids
}

// appendEach appends one record to each range on r1, all at once, and
// waits for every append to be acknowledged.
func appendEach(ctx context.Context, c *cluster, ids []string) error {
	var wg sync.WaitGroup
	errs := make(chan error, len(ids))
	for _, id := range ids {
		wg.Go(func() {
			if err := c.appendTo(ctx, c.node(1), id, values(id+"-", 1)...); err != nil {
				errs <- fmt.Errorf("append to %s: %w", id, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// waitQueued stands in for the goroutines a session's sender lets run
// before it builds a message (under load, those about to post answers or
// hand in pulls): while armed, it waits until n are queued, for at most
// 10 s. Unarmed, it returns at once. It is installed before the cluster
// starts and removed once it has stopped (t.Cleanup runs in reverse), as
// every session's sender reads it.
func waitQueued(n int, armed *atomic.Bool) func(queued func() int) {
	return func(queued func() int) {
		for deadline := time.Now().Add(10 * time.Second); armed.Load() && queued() < n && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
	}
}

// Answers that become ready while the leader's session sender lets other
// goroutines run go out in its message, not after it: under load, the
// pulls of ranges appended to at once make one message, not one each.
func TestFetchSessionSendsAnswersReadyTogetherInOneMessage(t *testing.T) {
	const ranges = 8
	var armed atomic.Bool
	t.Cleanup(replica.SetBeforeSessionMessage(waitQueued(ranges, &armed), nil))
	c := newCluster(t, 3)
	ids := sessionRanges(c, "a", ranges)
	r2 := c.node(2)
	before := len(r2.gate.sizes(&r2.gate.recordMessages))
	armed.Store(true)
	err := appendEach(ctxT(t), c, ids)
	armed.Store(false)
	if err != nil {
		t.Fatal(err)
	}
	got := r2.gate.sizes(&r2.gate.recordMessages)[before:]
	if len(got) == 0 || got[0] != ranges {
		t.Fatalf("r2 received the %d ranges' records in messages of %v answers; want all in the first", ranges, got)
	}
}

// Likewise on the follower's side: pulls handed in while the session's
// sender lets other goroutines run go out in its message.
func TestFetchSessionSendsPullsReadyTogetherInOneMessage(t *testing.T) {
	const ranges = 8
	var armed atomic.Bool
	t.Cleanup(replica.SetBeforeSessionMessage(nil, waitQueued(ranges, &armed)))
	c := newCluster(t, 3)
	ids := sessionRanges(c, "p", ranges)
	r2 := c.node(2)
	// Every range's answer reaches r2 in one message (the gate holds them
	// until all have come), so that every range's next pull is made after
	// it, and the sender waits until all of them are queued.
	before := len(r2.gate.sizes(&r2.gate.pullMessages))
	r2.gate.holding.Store(true)
	held := r2.gate.heldRecordAnswers.Load()
	armed.Store(true)
	defer armed.Store(false)
	appended := make(chan error, 1)
	go func() { appended <- appendEach(ctxT(t), c, ids) }()
	waitUntil(t, 10*time.Second, "r2's session holding an answer with records for every range", func() bool {
		return r2.gate.heldRecordAnswers.Load()-held >= ranges
	})
	r2.gate.holding.Store(false)
	// The appends may be acknowledged already (r3 counts toward the
	// quorum): the hook stays armed until r2's next pulls have gone out.
	waitUntil(t, 20*time.Second, "r2 pulling again", func() bool {
		return len(r2.gate.sizes(&r2.gate.pullMessages)) > before
	})
	armed.Store(false)
	if err := <-appended; err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		c.waitRangeCaughtUp(c.node(1), id)
	}
	got := r2.gate.sizes(&r2.gate.pullMessages)[before:]
	if len(got) == 0 || got[0] != ranges {
		t.Fatalf("r2 sent the %d ranges' next pulls in messages of %v pulls; want all in the first", ranges, got)
	}
}

// secondRange is a range led by the same replica as rangeID in the session
// tests: a follower uses a session once it follows two ranges there.
const secondRange = "second"

// A range followed alone on its leader keeps its own FetchStream (already
// the one stream to that leader, without the session's hand-off); once a
// second range is followed there, both ride one session.
func TestFetchSessionOnceTwoRangesShareALeader(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("alone", 3)...)
	c.waitCaughtUp(r1, r2, r3)
	for _, n := range []*node{r2, r3} {
		if n.gate.count("FetchStream") == 0 || n.gate.count("FetchSession") != 0 {
			t.Fatalf("%s following one range: %d FetchStreams, %d sessions; want its own stream only", n.id, n.gate.count("FetchStream"), n.gate.count("FetchSession"))
		}
	}
	c.electRange(secondRange, 1, r1, r2, r3)
	streams := r2.gate.count("FetchStream")
	ctx := ctxT(t)
	for i := range 5 {
		if err := c.appendTo(ctx, r1, secondRange, values(fmt.Sprintf("two-%d-", i), 2)...); err != nil {
			t.Fatal(err)
		}
		c.mustAppend(r1, values(fmt.Sprintf("one-%d-", i), 2)...)
	}
	c.waitCaughtUp(r1, r2, r3)
	c.waitRangeCaughtUp(r1, secondRange)
	c.sameLogs(c.storeLog(r1), r2, r3)
	for _, n := range []*node{r2, r3} {
		if n.gate.count("FetchSession") == 0 {
			t.Errorf("%s follows two ranges on r1 without a session", n.id)
		}
	}
	if got := r2.gate.count("FetchStream"); got != streams {
		t.Errorf("r2 opened %d more FetchStreams after the second range: both should ride the session", got-streams)
	}
}

// A follower whose leader has FetchStream but no FetchSession (an older
// replica) replicates on per-range streams, and says so once per leader.
func TestFollowerFallsBackToPerRangeStreams(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	for _, n := range []*node{r2, r3} {
		n.gate.mu.Lock()
		n.gate.noSession = true
		n.gate.mu.Unlock()
	}
	c.elect(1, r1, r2, r3)
	c.electRange(secondRange, 1, r1, r2, r3) // two ranges: a session is tried
	for i := range 5 {
		c.mustAppend(r1, values("p", i+1)...)
		if err := c.appendTo(ctxT(t), r1, secondRange, values("q", i+1)...); err != nil {
			t.Fatal(err)
		}
	}
	c.waitCaughtUp(r1, r2, r3)
	c.waitRangeCaughtUp(r1, secondRange)
	c.sameLogs(c.storeLog(r1), r2, r3)
	if logs := c.logs.String(); strings.Count(logs, "leader has no FetchSession") != 2 {
		t.Fatalf("want each follower to report the fallback once; logs:\n%s", logs)
	}
	for _, n := range []*node{r2, r3} {
		if n.gate.count("FetchStream") == 0 {
			t.Errorf("%s never opened a FetchStream", n.id)
		}
	}
}

// A partition between a follower and its leader fails the session (the
// answers stop, heartbeats too), the follower's ranges back off and pull
// again on a new session once it heals, and nothing is lost.
func TestFetchSessionSurvivesAPartition(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	c.electRange(secondRange, 1, r1, r2, r3)
	ctx := ctxT(t)
	c.mustAppend(r1, values("a", 3)...)
	c.waitCaughtUp(r1, r2, r3)
	// Both ranges pull on r3's session to r1 (the first left its own
	// stream once the second was followed, at its next pull).
	waitUntil(t, 10*time.Second, "r3 opening a session to r1", func() bool { return r3.gate.count("FetchSession") > 0 })
	before := r3.gate.count("FetchSession")
	r3.gate.block()
	for i := range 5 {
		c.mustAppend(r1, values(fmt.Sprintf("b%d-", i), 2)...) // r1 and r2 are a quorum
		if err := c.appendTo(ctx, r1, secondRange, values(fmt.Sprintf("c%d-", i), 2)...); err != nil {
			t.Fatal(err)
		}
	}
	r3.gate.open()
	c.waitCaughtUp(r1, r2, r3)
	c.waitRangeCaughtUp(r1, secondRange)
	c.sameLogs(c.storeLog(r1), r2, r3)
	// The answers carrying the records written during the partition broke
	// the session open before it: r3 caught up on a new one.
	if got := r3.gate.count("FetchSession"); got <= before {
		t.Fatalf("r3 caught up on the session it had before the partition (%d opened, %d before): the partition did not break it", got, before)
	}
}

// The leader refuses a session message that breaks its rules, ending the
// stream with InvalidArgument; a pull for a range it does not lead is
// answered with Fetch's own error, and the stream goes on.
func TestFetchSessionRefusesBadMessages(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	ctx := ctxT(t)
	pull := func(id uint64, rangeID string) *tenurev1.SessionPull {
		return &tenurev1.SessionPull{Id: id, Fetch: &tenurev1.FetchRequest{RangeId: rangeID, Epoch: 1, ReplicaId: "r2"}}
	}
	bad := []struct {
		name string
		m    *tenurev1.FetchSessionRequest
	}{
		{"a pull without a fetch", &tenurev1.FetchSessionRequest{Pulls: []*tenurev1.SessionPull{{Id: 1}}}},
		{"one range pulled twice", &tenurev1.FetchSessionRequest{Pulls: []*tenurev1.SessionPull{pull(1, rangeID), pull(2, rangeID)}}},
		{"a heartbeat above the limit", &tenurev1.FetchSessionRequest{HeartbeatMs: wire.MaxFetchWaitMillis + 1}},
		{"too many pulls", &tenurev1.FetchSessionRequest{Pulls: make([]*tenurev1.SessionPull, wire.MaxSessionPulls+1)}},
	}
	for _, tc := range bad {
		st := r1.rc.FetchSession(ctx)
		err := st.Send(tc.m)
		if err == nil {
			_, err = st.Receive()
		} else {
			_, err = st.Receive()
		}
		wantCode(t, tc.name, err, connect.CodeInvalidArgument)
		_ = st.CloseRequest()
		_ = st.CloseResponse()
	}

	st := r1.rc.FetchSession(ctx)
	defer func() { _ = st.CloseRequest(); _ = st.CloseResponse() }()
	if err := st.Send(&tenurev1.FetchSessionRequest{HeartbeatMs: 50, Pulls: []*tenurev1.SessionPull{pull(7, "no-such-range")}}); err != nil {
		t.Fatal(err)
	}
	m, err := st.Receive()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.GetAnswers()) != 1 || m.GetAnswers()[0].GetId() != 7 || connect.Code(m.GetAnswers()[0].GetErrorCode()) != connect.CodeNotFound {
		t.Fatalf("answer to a pull for an unknown range = %v, want pull 7 answered NotFound", m)
	}
	// The stream lives on: heartbeats at the 50 ms the follower asked.
	for range 3 {
		m, err := st.Receive()
		if err != nil {
			t.Fatal(err)
		}
		if len(m.GetAnswers()) != 0 {
			t.Fatalf("heartbeat carries answers: %v", m)
		}
	}
}

// A follower that goes silent on its session (gone, or cut off without
// the connection breaking) has its session ended by the leader after its
// heartbeat plus 5 s: its held pulls no longer count as fetches in hand,
// so status calls it "not fetching". A live follower heartbeats and keeps
// its session.
func TestLeaderEndsASilentFollowersSession(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	c.electRange(secondRange, 1, r1, r2, r3)
	c.mustAppend(r1, values("a", 2)...)
	c.waitCaughtUp(r1, r2, r3)
	ctx := ctxT(t)
	st := r1.rc.FetchSession(ctx)
	defer func() { _ = st.CloseRequest(); _ = st.CloseResponse() }()
	// A pull at r2's position, as r2's own session would send it, and then
	// silence.
	pos := c.status(r2)
	if err := st.Send(&tenurev1.FetchSessionRequest{HeartbeatMs: 100, Pulls: []*tenurev1.SessionPull{{Id: 1, Fetch: &tenurev1.FetchRequest{
		RangeId: rangeID, Epoch: 1, ReplicaId: "r2", FetchOffset: pos.GetLogEnd(), LastFetchedEpoch: 1,
	}}}}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var err error
	for err == nil && time.Since(start) < 20*time.Second {
		_, err = st.Receive() // heartbeats, until the leader ends it
	}
	if connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "no message from the follower") {
		t.Fatalf("a silent follower's session ended with %v after %v, want Unavailable naming the silence", err, time.Since(start))
	}
	// r2's and r3's own sessions heartbeat: they lived through the same
	// spell, and the ranges still replicate on them.
	opened := r2.gate.count("FetchSession")
	c.mustAppend(r1, values("b", 2)...)
	c.waitCaughtUp(r1, r2, r3)
	if got := r2.gate.count("FetchSession"); got != opened {
		t.Errorf("r2 opened %d new sessions: its live session was ended too", got-opened)
	}
}
