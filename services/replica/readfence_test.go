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
// bound; once they fetch, reads see every acknowledged record.
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
	wantCode(t, "Read before the epoch-start record commits", err, connect.CodeFailedPrecondition)

	r2.gate.open()
	r3.gate.open()
	end := acked.GetBaseOffset() + 5
	waitUntil(t, 10*time.Second, "reads served after the epoch-start record commits", func() bool {
		resp, err := read()
		return err == nil && resp.GetHighWaterMark() > end
	})
}
