package replica_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// A consumer tails a leader that a promotion passed over without fencing
// it (cut off from the promoter, not from the consumer): it still believes
// it leads, and its HWM is frozen while the new leader commits. The tail
// must end with FailedPrecondition naming the new leader within its
// confirmation bound (tailConfirmEvery + confirmTimeout, 2 s), so that the
// consumer, following it, sees the new leader's records.
func TestTailOnADeposedLeaderEndsAndNamesTheNewOne(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("a", 2)...)
	c.waitCaughtUp(r1, r2, r3)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := r1.lc.Tail(ctx, connect.NewRequest(&tenurev1.TailRequest{RangeId: rangeID, Offset: 1}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() || len(stream.Msg().GetRecords()) != 2 {
		t.Fatalf("first tail message = %v, %v; want the 2 records", stream.Msg(), stream.Err())
	}
	next := uint64(3)

	// Epoch 2 over r2 and r3 only: r1 is never fenced.
	c.elect(2, r2, r3)
	c.mustAppend(r2, values("b", 1)...)
	deposedAt := time.Now()
	ended := make(chan error, 1)
	go func() {
		for stream.Receive() {
			next += uint64(len(stream.Msg().GetRecords()))
		}
		ended <- stream.Err()
	}()
	// The bound the tail documents is 2 s; a loaded machine gets slack,
	// the assertion is only that it ends, not how fast.
	select {
	case err = <-ended:
	case <-time.After(15 * time.Second):
		t.Fatal("the tail on the deposed leader was still open 15 s after the new leader committed")
	}
	wantCode(t, "tail on the deposed leader", err, connect.CodeFailedPrecondition)
	if !strings.Contains(err.Error(), "leader is r2") {
		t.Fatalf("tail on the deposed leader ended with %v, want it to name the new leader r2", err)
	}
	t.Logf("tail ended %v after the new leader committed: %v", time.Since(deposedAt).Round(time.Millisecond), err)

	// Following it, the consumer carries on at the new leader from where it was.
	stream2, err := r2.lc.Tail(ctx, connect.NewRequest(&tenurev1.TailRequest{RangeId: rangeID, Offset: next}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream2.Close()
	for stream2.Receive() {
		for _, rec := range stream2.Msg().GetRecords() {
			if string(rec.GetValue()) == string(values("b", 1)[0]) {
				return
			}
		}
	}
	t.Fatalf("tail on the new leader ended before the new record: %v", stream2.Err())
}
