package replica_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// advanceLogStart raises n's log start to to, as retention on the leader
// does, and checks it moved there.
func (c *cluster) advanceLogStart(n *node, to uint64) {
	c.t.Helper()
	got, err := n.r.AdvanceLogStartForTest(rangeID, to)
	if err != nil || got != to {
		c.t.Fatalf("AdvanceLogStart(%s, %d) = %d, %v; want %d", n.id, to, got, err, to)
	}
}

// tail returns the records n's log holds from from, committed or not.
func (c *cluster) logFrom(n *node, from uint64) []*tenurev1.Record {
	c.t.Helper()
	var out []*tenurev1.Record
	for _, r := range c.storeLog(n) {
		if r.GetOffset() >= from {
			out = append(out, r)
		}
	}
	return out
}

// A follower follows its leader's log start, capped at its own HWM (it never
// applies retention on its own), and Read and Tail below the log start are
// OutOfRange with a LogStartDetail naming it.
func TestFollowersFollowTheLeadersLogStart(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("a", 30)...)
	c.waitCaughtUp(r1, r2, r3)
	c.advanceLogStart(r1, 20)
	// The next answer carries the leader's log start.
	c.mustAppend(r1, values("b", 5)...)
	for _, n := range []*node{r2, r3} {
		waitUntil(t, 10*time.Second, n.id+" to follow the log start to 20", func() bool { return c.status(n).GetLogStart() == 20 })
	}
	if got := c.status(r1).GetLogStart(); got != 20 {
		t.Fatalf("leader's status log_start = %d, want 20", got)
	}
	c.waitCaughtUp(r1, r2, r3)
	c.sameLogs(c.storeLog(r1), r2, r3)
	if recs := c.storeLog(r2); len(recs) == 0 || recs[0].GetOffset() != 20 {
		t.Fatalf("r2's log starts at record %v, want offset 20", recs[:min(1, len(recs))])
	}

	_, err := r1.lc.Read(ctxT(t), connect.NewRequest(&tenurev1.ReadRequest{RangeId: rangeID, Offset: 12}))
	wantBelowStart(t, "Read(12)", err, 12, 20)
	stream, err := r1.lc.Tail(ctxT(t), connect.NewRequest(&tenurev1.TailRequest{RangeId: rangeID, Offset: 3}))
	if err == nil {
		for stream.Receive() {
			t.Fatalf("Tail(3) below the log start sent %v", stream.Msg())
		}
		err = stream.Err()
		stream.Close()
	}
	wantBelowStart(t, "Tail(3)", err, 3, 20)
	// At the log start the records are there.
	resp, err := r1.lc.Read(ctxT(t), connect.NewRequest(&tenurev1.ReadRequest{RangeId: rangeID, Offset: 20}))
	if err != nil || len(resp.Msg.GetRecords()) == 0 || resp.Msg.GetRecords()[0].GetOffset() != 20 || resp.Msg.GetLogStart() != 20 {
		t.Fatalf("Read(20) = %v, %v; want records from 20, log_start 20", resp, err)
	}
}

func wantBelowStart(t *testing.T, what string, err error, off, start uint64) {
	t.Helper()
	wantCode(t, what, err, connect.CodeOutOfRange)
	got, ok := wire.BelowLogStart(err)
	if !ok || got != start {
		t.Fatalf("%s: LogStartDetail = %d, %v; want %d", what, got, ok, start)
	}
	msg := fmt.Sprintf("offset %d is below the log start %d: records below it were deleted by retention", off, start)
	if !strings.Contains(err.Error(), msg) {
		t.Fatalf("%s = %v, want the message to say %q", what, err, msg)
	}
}

// A follower that was down while the leader's log start moved past its log
// end comes back, is told it is below the leader's log start, resets to it
// (everything it lacks is committed and was deleted on purpose), catches up
// from there, and then holds exactly the leader's log.
func TestFollowerBelowTheLeadersLogStartResets(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("a", 10)...)
	c.waitCaughtUp(r1, r2, r3)
	down := c.status(r3)
	c.stop(r3)
	c.mustAppend(r1, values("b", 40)...)
	start := c.status(r1).GetHighWaterMark() - 5
	if start <= down.GetLogEnd() {
		t.Fatalf("log start %d is not past r3's log end %d", start, down.GetLogEnd())
	}
	c.advanceLogStart(r1, start)

	c.start(r3)
	waitUntil(t, 10*time.Second, "r3 to reset to the leader's log start", func() bool { return c.status(r3).GetLogStart() == start })
	c.mustAppend(r1, values("c", 5)...)
	c.waitCaughtUp(r1, r2, r3)
	st := c.status(r3)
	if st.GetHalted() != "" {
		t.Fatalf("r3 halted: %s", st.GetHalted())
	}
	c.sameLogs(c.logFrom(r1, start), r3)
	var line string
	for _, l := range strings.Split(c.logs.String(), "\n") {
		if strings.Contains(l, "reset to the leader's log start") && strings.Contains(l, "replica=r3") {
			line = l
		}
	}
	for _, want := range []string{fmt.Sprintf("leader_log_start=%d", start), fmt.Sprintf("old_log_end=%d", down.GetLogEnd()), "leader=r1"} {
		if !strings.Contains(line, want) {
			t.Fatalf("r3's reset log line %q lacks %q", line, want)
		}
	}
}

// A follower whose log runs past the leader's log start under an epoch the
// leader's trimmed history no longer holds (an old leader's uncommitted
// tail), with its HWM below the start, cuts to the start (never below its
// HWM) and resets there; the leader's records from its start are then all
// it holds.
func TestFollowerWithAnOldTailAboveTheLogStartResets(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r3, r1, r2)
	c.mustAppend(r3, values("a", 5)...)
	c.waitCaughtUp(r3, r1, r2)
	hwm := c.status(r3).GetHighWaterMark()
	// An epoch-1 tail only r3 writes: it never commits.
	r1.gate.block()
	r2.gate.block()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _, _ = c.append(ctx, r3, values("tail", 60)...) }()
	waitUntil(t, 10*time.Second, "r3 to write its tail", func() bool { return c.status(r3).GetLogEnd() == hwm+60 })
	c.stop(r3)
	cancel()
	r1.gate.open()
	r2.gate.open()

	// Epoch 2 on r1 and r2 only; its log start moves past epoch 1 entirely,
	// so r1's journal keeps only epoch 2's entry.
	c.elect(2, r1, r2)
	c.mustAppend(r1, values("b", 40)...)
	c.waitCaughtUp(r1, r2)
	start := hwm + 20
	c.advanceLogStart(r1, start)
	if h := c.history(r1).GetHistory(); len(h) != 1 || h[0].GetEpoch() != 2 {
		t.Fatalf("r1's history after the log start passed epoch 1: %v, want only epoch 2", h)
	}

	c.start(r3)
	c.mustFence(r3, 2)
	c.mustAdopt(r3, 2, tenurev1.Role_ROLE_FOLLOWER, r1, 0)
	waitUntil(t, 10*time.Second, "r3 to reset to the leader's log start", func() bool { return c.status(r3).GetLogStart() == start })
	c.mustAppend(r1, values("c", 3)...)
	c.waitCaughtUp(r1, r2, r3)
	if st := c.status(r3); st.GetHalted() != "" {
		t.Fatalf("r3 halted: %s", st.GetHalted())
	}
	c.sameLogs(c.logFrom(r1, start), r3)
	if !strings.Contains(c.logs.String(), fmt.Sprintf("truncated_above_start=%d", hwm+60-start)) {
		t.Fatalf("no reset with the cut of r3's old tail logged: %s", c.logs.String())
	}
	if st := c.status(r3); st.GetFetchTruncations() != 1 || st.GetLastFetchTruncationFrom() != hwm+60 || st.GetLastFetchTruncationTo() != start {
		t.Fatalf("r3's fetch truncations: %d, last from %d to %d; want 1, from %d to %d", st.GetFetchTruncations(), st.GetLastFetchTruncationFrom(), st.GetLastFetchTruncationTo(), hwm+60, start)
	}
}

// belowStartLeader answers every fetch below_log_start at log start
// logStart: a leader claiming that a follower whose HWM is above logStart
// cannot be continued, which contradicts the follower's committed prefix.
// A real leader never says that to a consistent follower, hence a peer of
// its own over real HTTP/2, as inconsistentLeader.
type belowStartLeader struct {
	tenurev1connect.UnimplementedReplicaServiceHandler
	logStart uint64
	fetches  atomic.Int64
}

func (l *belowStartLeader) Fetch(_ context.Context, req *connect.Request[tenurev1.FetchRequest]) (*connect.Response[tenurev1.FetchResponse], error) {
	l.fetches.Add(1)
	m := req.Msg
	return connect.NewResponse(&tenurev1.FetchResponse{
		Epoch: m.GetEpoch(), HighWaterMark: m.GetFetchOffset() + 10, LogEnd: m.GetFetchOffset() + 10,
		LogStart: l.logStart, BelowLogStart: true,
	}), nil
}

// A below_log_start answer from a leader whose log start is below the
// follower's HWM contradicts the follower's committed records: it stops the
// range with the reason and discards nothing (no record at or above the
// leader's log start that is below its HWM is ever dropped).
func TestBelowLogStartUnderTheHWMStopsTheRange(t *testing.T) {
	c := newCluster(t, 2)
	r1, r2 := c.node(1), c.node(2)
	c.elect(1, r1, r2)
	c.mustAppend(r1, values("a", 10)...)
	c.waitCaughtUp(r1, r2)
	before := c.status(r2)

	liar := &belowStartLeader{logStart: 4}
	path, h := tenurev1connect.NewReplicaServiceHandler(liar, transport.HandlerOptions()...)
	srv, err := transport.Serve("127.0.0.1:0", transport.Registration{Name: tenurev1connect.ReplicaServiceName, Path: path, Handler: h})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	c.mustFence(r2, 2)
	if _, err := r2.rc.Adopt(ctxT(t), connect.NewRequest(&tenurev1.AdoptRequest{
		RangeId: rangeID, Epoch: 2, Role: tenurev1.Role_ROLE_FOLLOWER, LeaderId: "liar", LeaderAddress: srv.URL(),
		Replicas: append(replicas(r2), &tenurev1.Replica{Id: "liar", Address: srv.URL()}),
	})); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "r2 to stop on the contradicting answer", func() bool { return r2.r.Halted(rangeID) != nil })
	st := c.status(r2)
	if !strings.Contains(st.GetHalted(), "below its log start 4") || !strings.Contains(st.GetHalted(), "not resetting") {
		t.Fatalf("r2 halted = %q, want the contradiction named", st.GetHalted())
	}
	if st.GetLogStart() != 0 || st.GetLogEnd() != before.GetLogEnd() || st.GetHighWaterMark() != before.GetHighWaterMark() {
		t.Fatalf("r2 after stopping: log [%d, %d) HWM %d; want [0, %d) HWM %d (nothing discarded)",
			st.GetLogStart(), st.GetLogEnd(), st.GetHighWaterMark(), before.GetLogEnd(), before.GetHighWaterMark())
	}
}

// olderLeader forwards fetches to a real leader and drops the log start
// fields from its answers: what a leader older than log starts sends (0, not
// trimmed). It has no FetchStream, like the oldest peers.
type olderLeader struct {
	tenurev1connect.UnimplementedReplicaServiceHandler
	to tenurev1connect.ReplicaServiceClient
}

func (l *olderLeader) Fetch(ctx context.Context, req *connect.Request[tenurev1.FetchRequest]) (*connect.Response[tenurev1.FetchResponse], error) {
	resp, err := l.to.Fetch(ctx, connect.NewRequest(req.Msg))
	if err != nil {
		return nil, err
	}
	resp.Msg.LogStart, resp.Msg.BelowLogStart = 0, false
	return resp, nil
}

// A leader that sends no log start (an older peer) keeps working with a new
// follower: 0 means "not trimmed", so the follower replicates as before and
// never moves its own log start (it applies no retention on its own).
func TestFollowerOfALeaderWithoutLogStart(t *testing.T) {
	c := newCluster(t, 2)
	r1, r2 := c.node(1), c.node(2)
	old := &olderLeader{to: r1.rc}
	path, h := tenurev1connect.NewReplicaServiceHandler(old, transport.HandlerOptions()...)
	srv, err := transport.Serve("127.0.0.1:0", transport.Registration{Name: tenurev1connect.ReplicaServiceName, Path: path, Handler: h})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	// r2 reaches its leader r1 only through the downgrading proxy.
	proxied := &node{id: r1.id, url: srv.URL()}
	bound := max(c.mustFence(r1, 1).GetHighWaterMark(), c.mustFence(r2, 1).GetHighWaterMark())
	c.mustAdopt(r1, 1, tenurev1.Role_ROLE_LEADER, r1, bound)
	c.mustAdopt(r2, 1, tenurev1.Role_ROLE_FOLLOWER, proxied, 0)
	c.mustAppend(r1, values("a", 20)...)
	c.waitCaughtUp(r1, r2)
	c.advanceLogStart(r1, 10)
	c.mustAppend(r1, values("b", 5)...)
	c.waitCaughtUp(r1, r2)
	st := c.status(r2)
	if st.GetHalted() != "" || st.GetLogStart() != 0 {
		t.Fatalf("r2 following a leader without log starts: halted %q, log start %d; want serving, 0", st.GetHalted(), st.GetLogStart())
	}
	if got := len(c.storeLog(r2)); uint64(got) != st.GetLogEnd() {
		t.Fatalf("r2 holds %d records, want all %d", got, st.GetLogEnd())
	}
}

// A follower whose HWM lags below the leader's new log start but whose log
// runs past it under an epoch the leader's trimmed history still holds is
// checked as always, not reset: it keeps every record it holds at and above
// the leader's log start, raises its HWM over them, and then follows the log
// start (deleting only what is committed below it).
func TestFollowerWithALaggingHWMKeepsItsRecords(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("a", 10)...)
	c.waitCaughtUp(r1, r2, r3)
	held := c.status(r3).GetLogEnd()
	// r3 fetches from held (receiving the next batch with an HWM that
	// does not cover it yet) and no further: its HWM stays behind.
	r3.gate.set(func(m *tenurev1.FetchRequest) bool { return m.GetFetchOffset() <= held })
	c.mustAppend(r1, values("b", 30)...)
	end := held + 30
	waitUntil(t, 10*time.Second, "r3 to hold the batch", func() bool { return c.status(r3).GetLogEnd() == end })
	lagging := c.status(r3).GetHighWaterMark()
	start := end - 10
	if lagging >= start {
		t.Fatalf("r3's HWM %d is not below the log start %d", lagging, start)
	}
	c.advanceLogStart(r1, start)
	r3.gate.open()
	c.mustAppend(r1, values("c", 2)...)
	c.waitCaughtUp(r1, r2, r3)
	waitUntil(t, 10*time.Second, "r3 to follow the log start", func() bool { return c.status(r3).GetLogStart() == start })
	st := c.status(r3)
	if st.GetHalted() != "" || st.GetFetchTruncations() != 0 {
		t.Fatalf("r3: halted %q, fetch truncations %d; want serving, none", st.GetHalted(), st.GetFetchTruncations())
	}
	if strings.Contains(c.logs.String(), "reset to the leader's log start") {
		t.Fatalf("r3 was reset though the leader could check its log:\n%s", c.logs.String())
	}
	c.sameLogs(c.logFrom(r1, start), r3)
}

// A follower older than log starts ignores below_log_start and would ask
// again at once, forever: the leader answers the first such fetch at once,
// holds a repeat at the same offset for its long poll, and never gives it
// an HWM to raise over records the leader did not check.
func TestBelowLogStartRepeatedIsHeld(t *testing.T) {
	c := newCluster(t, 2)
	r1, r2 := c.node(1), c.node(2)
	c.elect(1, r1, r2)
	c.mustAppend(r1, values("a", 20)...)
	c.waitCaughtUp(r1, r2)
	c.advanceLogStart(r1, 15)
	c.stop(r2)
	// The fetches of an old r2 that was down at offset 5.
	const wait = 600 * time.Millisecond
	fetch := func() (*tenurev1.FetchResponse, time.Duration) {
		t.Helper()
		began := time.Now()
		resp, err := r1.rc.Fetch(ctxT(t), connect.NewRequest(&tenurev1.FetchRequest{
			RangeId: rangeID, Epoch: 1, ReplicaId: r2.id, FetchOffset: 5, LastFetchedEpoch: 1, MaxWaitMs: uint32(wait / time.Millisecond),
		}))
		if err != nil {
			t.Fatalf("Fetch below the log start: %v", err)
		}
		return resp.Msg, time.Since(began)
	}
	for i := range 2 {
		a, took := fetch()
		if !a.GetBelowLogStart() || a.GetLogStart() != 15 || a.GetHighWaterMark() != 0 || len(a.GetRecords()) != 0 {
			t.Fatalf("fetch %d below the log start = %v; want below_log_start at 15, HWM 0, no records", i, a)
		}
		if i == 1 && took < wait/2 {
			t.Fatalf("the repeated below_log_start answer came after %v; want it held for the long poll (%v)", took, wait)
		}
	}
}
