package replica_test

import (
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// A new leader serves no reads until its epoch-start record is committed.
// Before that its HWM is the promotion's committed bound, which can be below
// what the previous leader acknowledged: the chaos suite (kill, seed 3) saw
// a read at the new leader answer HWM 20 after offsets 20-22 had been
// acknowledged. Here the followers cannot fetch, so the epoch-start record
// cannot commit, and a read must be refused rather than answered from the
// bound (Unavailable: it does lead, and serves in a moment, so a client that
// followed a not-leader answer here retries rather than looking elsewhere);
// once they fetch, reads see every acknowledged record.
func TestNewLeaderReadsOnlyAfterEpochStartCommits(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	acked := c.mustAppend(r1, values("acked", 5)...)
	c.waitCaughtUp(r1, r2, r3)

	r2.gate.block()
	r3.gate.block()
	c.elect(2, r1, r2, r3)
	read := func() (*tenurev1.ReadResponse, error) {
		resp, err := r1.lc.Read(ctxT(t), connect.NewRequest(&tenurev1.ReadRequest{RangeId: rangeID, Offset: 0}))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}
	resp, err := read()
	if err == nil {
		t.Fatalf("Read on a leader whose epoch-start record is not committed answered HWM %d; want it refused", resp.GetHighWaterMark())
	}
	wantCode(t, "Read before the epoch-start record commits", err, connect.CodeUnavailable)
	tail, err := r1.lc.Tail(ctxT(t), connect.NewRequest(&tenurev1.TailRequest{RangeId: rangeID}))
	if err != nil {
		t.Fatal(err)
	}
	for tail.Receive() {
		t.Fatal("Tail sent records before the epoch-start record commits")
	}
	wantCode(t, "Tail before the epoch-start record commits", tail.Err(), connect.CodeUnavailable)
	tail.Close()

	r2.gate.open()
	r3.gate.open()
	end := acked.GetBaseOffset() + 5
	waitUntil(t, 10*time.Second, "reads served after the epoch-start record commits", func() bool {
		resp, err := read()
		return err == nil && resp.GetHighWaterMark() > end
	})
}

// A leader deposed without being fenced answers no reads. The promoter
// deposes a leader that misses its probes without waiting for its lease to
// run out, so the old leader can still believe its lease valid while a newer
// epoch commits records on the other replicas. The chaos suite (flaky, seed
// 1) saw such a leader answer a read whose HWM missed acknowledged records.
// Here r1 leads epoch 1 and is never fenced (no lease service: its lease is
// always valid); r2 and r3 are fenced at 2, r2 leads and commits more. A
// read at r1 must be refused, not answered from its old HWM.
func TestUnfencedDeposedLeaderServesNoReads(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("old", 3)...)
	c.waitCaughtUp(r1, r2, r3)
	read := func(n *node) (*tenurev1.ReadResponse, error) {
		resp, err := n.lc.Read(ctxT(t), connect.NewRequest(&tenurev1.ReadRequest{RangeId: rangeID, Offset: 0}))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}
	before, err := read(r1)
	if err != nil {
		t.Fatalf("Read at the leader of epoch 1 before any promotion: %v", err)
	}

	// Epoch 2 without r1: the quorum r2, r3 is enough to promote.
	c.elect(2, r2, r3)
	acked := c.mustAppend(r2, values("new", 2)...)
	newEnd := acked.GetBaseOffset() + 2

	if got := c.status(r1); got.GetRole() != tenurev1.Role_ROLE_LEADER || got.GetFencedEpoch() != 1 {
		t.Fatalf("r1 is %v fenced at %d; the test needs it still leading epoch 1, unfenced", got.GetRole(), got.GetFencedEpoch())
	}
	resp, err := read(r1)
	if err == nil {
		t.Fatalf("Read at deposed, unfenced r1 answered HWM %d (before the promotion: %d) after epoch 2 acknowledged records up to %d; want it refused",
			resp.GetHighWaterMark(), before.GetHighWaterMark(), newEnd)
	}
	wantCode(t, "Read at a leader a later epoch deposed", err, connect.CodeFailedPrecondition)

	// The new leader serves reads, and they include what it acknowledged.
	waitUntil(t, 10*time.Second, "reads at the new leader", func() bool {
		resp, err := read(r2)
		return err == nil && resp.GetHighWaterMark() >= newEnd
	})
}
