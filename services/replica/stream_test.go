package replica_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/appender"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
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
	st := r1.lc.AppendStream(ctx)
	if err := st.Send(&tenurev1.AppendStreamRequest{}); err != nil {
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
	// The idle stream ended with Unavailable: the producer learns to go
	// elsewhere on its next append.
	_, err := a.Append(ctx, rangeID, values("after", 1))
	if code := connect.CodeOf(err); code != connect.CodeUnavailable {
		t.Fatalf("append on a stream the server ended = %v, want unavailable", err)
	}
}
