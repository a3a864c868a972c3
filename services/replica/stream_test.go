package replica_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/appender"
	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// Appends on AppendStream follow Append's rules: one acknowledgement per
// message, in order, each only once committed; a refusal ends the stream
// with Append's error and the next append opens a new one.
func TestAppendStream(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	ctx := ctxT(t)

	a := appender.New(r1.lc)
	defer a.Close()
	next := uint64(1) // offset 0 is epoch 1's epoch-start record
	for i := range 20 {
		vals := values("s", 1+i%3)
		ack, err := a.Append(ctx, rangeID, vals)
		if err != nil {
			t.Fatalf("stream append %d: %v", i, err)
		}
		if ack.GetBaseOffset() != next || ack.GetEpoch() != 1 || ack.GetHighWaterMark() < next+uint64(len(vals)) {
			t.Fatalf("stream append %d = %v, want base %d at epoch 1 and an HWM past the batch", i, ack, next)
		}
		next += uint64(len(vals))
	}
	// Refused: a follower names no leader it could serve; nothing is written.
	_, err := appender.New(r2.lc).Append(ctx, rangeID, values("f", 1))
	wantCode(t, "stream append to a follower", err, connect.CodeFailedPrecondition)
	// A bad message fails its stream with InvalidArgument, and the
	// appender's next call works on a new stream.
	_, err = a.Append(ctx, rangeID, nil)
	wantCode(t, "stream append of an empty batch", err, connect.CodeInvalidArgument)
	ack, err := a.Append(ctx, rangeID, values("after", 1))
	if err != nil || ack.GetBaseOffset() != next {
		t.Fatalf("append after a refused one = %v, %v; want base %d", ack, err, next)
	}
	// A message without an append is refused, not taken as an empty one.
	// Its envelope is complete after the 5-byte prefix, so the refusal can
	// end the stream before Send's last (empty) write: Send then fails
	// with io.EOF and the refusal is what Receive returns (CI saw it).
	st := r1.lc.AppendStream(ctx)
	if err := st.Send(&tenurev1.AppendStreamRequest{}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	_, err = st.Receive()
	wantCode(t, "stream message without an append", err, connect.CodeInvalidArgument)
	_ = st.CloseRequest()
	_ = st.CloseResponse()

	c.waitCaughtUp(r1, r2, r3)
	c.sameLogs(c.storeLog(r1), r2, r3)
	if got := c.readAll(r1); uint64(len(got)) != next+1 {
		t.Fatalf("read %d records, want %d", len(got), next+1)
	}
}

// A follower whose leader has no FetchStream (an older replica) replicates
// with unary Fetch calls.
func TestFollowerFallsBackToUnaryFetch(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	for _, n := range []*node{r2, r3} {
		n.gate.mu.Lock()
		n.gate.noStream = true
		n.gate.mu.Unlock()
	}
	c.elect(1, r1, r2, r3)
	for i := range 5 {
		c.mustAppend(r1, values("u", i+1)...)
	}
	c.waitCaughtUp(r1, r2, r3)
	c.sameLogs(c.storeLog(r1), r2, r3)
	if logs := c.logs.String(); strings.Count(logs, "leader has no FetchStream") < 2 {
		t.Fatalf("followers did not report falling back to unary Fetch; logs:\n%s", logs)
	}
}

// A graceful Shutdown of a leader's server completes while followers hold
// FetchStreams and a producer holds an idle AppendStream: the streams end
// after the request in hand instead of holding Shutdown until its deadline.
func TestShutdownEndsOpenStreams(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	ctx := ctxT(t)
	a := appender.New(r1.lc)
	defer a.Close()
	if _, err := a.Append(ctx, rangeID, values("before", 3)); err != nil {
		t.Fatal(err)
	}
	// And one stream of our own, idle after one append.
	st := r1.lc.AppendStream(ctx)
	defer func() { _ = st.CloseResponse() }()
	if err := st.Send(&tenurev1.AppendStreamRequest{Append: &tenurev1.AppendRequest{RangeId: rangeID, Records: values("own", 1)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Receive(); err != nil {
		t.Fatal(err)
	}
	c.waitCaughtUp(r1, r2, r3)

	// Far below the bound, FetchWait (300 ms here) is the longest a stream
	// takes to end: a long poll in hand is answered first.
	const bound = 10 * time.Second
	sctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	if err := r1.srv.Shutdown(sctx); err != nil {
		t.Fatalf("graceful shutdown with open streams: %v (streams held it for %v)", err, bound)
	}
	r1.srv = nil
	// The idle stream ended with Unavailable, marked as never handled: the
	// append sent on it now wrote nothing, and the producer may send it
	// again.
	err := st.Send(&tenurev1.AppendStreamRequest{Append: &tenurev1.AppendRequest{RangeId: rangeID, Records: values("after", 1)}})
	if err == nil || errors.Is(err, io.EOF) {
		_, err = st.Receive()
	}
	if code := connect.CodeOf(err); code != connect.CodeUnavailable || !transport.NotHandled(err) {
		t.Fatalf("append on a stream the server ended = %v (not handled: %v), want unavailable, marked not handled", err, transport.NotHandled(err))
	}
	// The appender resends such an append on a new stream, which finds
	// the server gone: Unavailable, with nothing written either way.
	_, err = a.Append(ctx, rangeID, values("after", 1))
	if code := connect.CodeOf(err); code != connect.CodeUnavailable {
		t.Fatalf("append on a stream the server ended = %v, want unavailable", err)
	}
	if end := c.storeLog(r1); len(end) != 5 {
		t.Fatalf("log holds %d records after the stop, want 5 (epoch start, 3 before, 1 own)", len(end))
	}
}

// A producer's pooled streams do not survive a graceful restart of the
// leader, but its appends do: the first append after the restart meets the
// drained stream's "never handled" end and is sent again on a new stream,
// where it commits once.
func TestAppenderResendsAnAppendADrainedStreamNeverHandled(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	ctx := ctxT(t)
	// A client of its own, kept across the restart (the cluster's are
	// replaced at every start).
	hc := transport.NewHTTPClient()
	defer hc.CloseIdleConnections()
	a := appender.New(tenurev1connect.NewLogServiceClient(hc, r1.url, transport.ClientOptions()...))
	defer a.Close()
	if _, err := a.Append(ctx, rangeID, values("before", 2)); err != nil {
		t.Fatal(err)
	}

	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := r1.srv.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	r1.srv = nil
	c.restart(r1)
	// A restarted leader acknowledges nothing until told again that it
	// leads.
	c.elect(2, r1, r2, r3)

	ack, err := a.Append(ctx, rangeID, values("after", 1))
	if err != nil {
		t.Fatalf("first append after the restart = %v, want it resent on a new stream and acknowledged", err)
	}
	if ack.GetEpoch() != 2 {
		t.Fatalf("append acknowledged at epoch %d, want 2", ack.GetEpoch())
	}
	c.waitCaughtUp(r1, r2, r3)
	var after int
	for _, rec := range c.readAll(r1) {
		if string(rec.GetValue()) == string(values("after", 1)[0]) {
			after++
		}
	}
	if after != 1 {
		t.Fatalf("the resent append is in the log %d times, want once", after)
	}
}

// When the server starts stopping while a request is in hand and that
// request then fails, the stream ends with the request's own error: it was
// handled (here: written, then its leader fenced), so the stream must not
// claim it never was, or a producer would resend it and write it twice.
func TestStreamStopKeepsTheErrorOfTheRequestInHand(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("a", 2)...)
	c.waitCaughtUp(r1, r2, r3)
	ctx := ctxT(t)

	// No follower can fetch, so the append below is written and waits in
	// hand for a commit that never comes.
	r2.gate.block()
	r3.gate.block()
	end := c.status(r1).GetLogEnd()
	st := r1.lc.AppendStream(ctx)
	defer func() { _ = st.CloseResponse() }()
	if err := st.Send(&tenurev1.AppendStreamRequest{Append: &tenurev1.AppendRequest{RangeId: rangeID, Records: values("in-hand", 1)}}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 5*time.Second, "the append in hand written", func() bool { return c.status(r1).GetLogEnd() == end+1 })

	// Begin a graceful stop; it waits for the request in hand.
	stopped := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		stopped <- r1.srv.Shutdown(sctx)
	}()
	// The listener closes as the stop begins; then give the stream's
	// watcher a moment to see the drain before the request fails.
	waitUntil(t, 5*time.Second, "the listener closed", func() bool {
		conn, err := net.DialTimeout("tcp", r1.listen, time.Second)
		if err == nil {
			conn.Close()
		}
		return err != nil
	})
	time.Sleep(200 * time.Millisecond)
	// A promotion fences the leader in place; the append in hand fails.
	if _, err := r1.r.Fence(ctx, connect.NewRequest(&tenurev1.FenceRequest{RangeId: rangeID, Epoch: 2, FencerId: "driver"})); err != nil {
		t.Fatal(err)
	}
	_, err := st.Receive()
	if code := connect.CodeOf(err); code != connect.CodeFailedPrecondition || transport.NotHandled(err) {
		t.Fatalf("append in hand when its leader was fenced during a stop = %v (not handled: %v), want the fence's FailedPrecondition, not marked never handled", err, transport.NotHandled(err))
	}
	if err := <-stopped; err != nil {
		t.Fatalf("graceful stop: %v", err)
	}
	r1.srv = nil
}

// A leader that crashes while an append waits to commit drops the
// connection under the stream. The producer must hear Unavailable (the
// outcome is unknown: the record was written and may commit under the next
// leader), not the Internal "protocol error" connect-go reports for a body
// that ends mid-stream, which reads as a server bug and is not retried.
func TestAppenderReportsALostConnectionAsUnavailable(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("a", 2)...)
	c.waitCaughtUp(r1, r2, r3)
	ctx := ctxT(t)

	a := appender.New(r1.lc)
	defer a.Close()
	// Warm the pool: the append below goes on an open stream, so the crash
	// ends a stream mid-body rather than failing a new request.
	if _, err := a.Append(ctx, rangeID, values("warm", 1)); err != nil {
		t.Fatal(err)
	}
	// No follower can fetch, so the append is written and waits for a
	// commit that never comes.
	r2.gate.block()
	r3.gate.block()
	end := c.status(r1).GetLogEnd()
	done := make(chan error, 1)
	go func() {
		_, err := a.Append(ctx, rangeID, values("in-flight", 1))
		done <- err
	}()
	waitUntil(t, 5*time.Second, "the append written on the leader", func() bool { return c.status(r1).GetLogEnd() == end+1 })
	c.stop(r1)

	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the append did not return within 10s of its leader's crash")
	}
	if code := connect.CodeOf(err); code != connect.CodeUnavailable || transport.NotHandled(err) {
		t.Fatalf("append whose leader crashed = %v (code %v, not handled: %v), want Unavailable, not marked never handled", err, code, transport.NotHandled(err))
	}
}

// An append written but not committed when its leader is deposed has an
// unknown outcome; here the same replica leads the next epoch and commits
// it. The appender sends it again with the same producer sequence, and the
// leader answers with the original offset instead of writing it twice.
func TestAppenderRetriesAnUnknownAppendOnce(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	ctx := ctxT(t)
	a := appender.New(r1.lc)
	defer a.Close()
	if _, err := a.Append(ctx, rangeID, values("warm", 1)); err != nil {
		t.Fatal(err)
	}
	c.waitCaughtUp(r1, r2, r3)
	r2.gate.block()
	r3.gate.block()
	end := c.status(r1).GetLogEnd()
	type result struct {
		ack *tenurev1.AppendResponse
		err error
	}
	done := make(chan result, 1)
	go func() {
		ack, err := a.Append(ctx, rangeID, values("once", 1))
		done <- result{ack, err}
	}()
	waitUntil(t, 5*time.Second, "the append written on the leader", func() bool { return c.status(r1).GetLogEnd() == end+1 })
	// Deposed and re-elected (its log is the most complete): the append
	// in hand fails, and commits at epoch 2 once the followers fetch.
	c.elect(2, r1, r2, r3)
	r2.gate.open()
	r3.gate.open()
	var res result
	select {
	case res = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the append did not return")
	}
	if res.err != nil || res.ack.GetBaseOffset() != end || !res.ack.GetDuplicate() {
		t.Fatalf("append across the re-election = %v, %v; want the original offset %d, as a duplicate", res.ack, res.err, end)
	}
	c.waitCaughtUp(r1, r2, r3)
	n := 0
	for _, rec := range c.readAll(r1) {
		if string(rec.GetValue()) == string(values("once", 1)[0]) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("the retried append is in the log %d times, want once", n)
	}
}
