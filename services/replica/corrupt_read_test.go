package replica_test

import (
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// A leader's copy holds a damaged batch deep in its log (a byte flipped
// while it was down; Open checks only the record below the synced marker,
// so it starts and is promoted). A read that reaches the batch must
// quarantine the copy: it stops leading and refuses fences, naming the
// quarantine, so a promotion goes to the intact copies. Before, the read
// answered Internal and the copy kept leading, every later read failed at
// the same offset, and when a follower's fetch reached the batch the copy
// halted but still answered fences with its whole log: the promoter chose
// it again (most complete log, or the preferred replica on a tie), its
// Adopt was refused, and the range stayed without a leader (seen from
// outside: 31 failed promotions, epochs 62 to 93, 'adopt r2 as leader at
// epoch 93: ... stopped serving: ... corrupt', with an intact r1).
func TestDamagedRecordFoundByAReadQuarantinesTheCopy(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	// Batches at 1, 4, 7 and 10 (offset 0 is epoch 1's start record).
	for i := range 4 {
		c.mustAppend(r1, values(string(rune('a'+i)), 3)...)
	}
	c.waitCaughtUp(r1, r2, r3)
	c.stop(r1)
	flipStoredValue(t, r1.dir, binary.BigEndian.AppendUint64([]byte("l/"+rangeID+"/"), 4))
	c.start(r1)
	if st := c.status(r1); st.GetHalted() != "" {
		t.Fatalf("the copy was halted at startup (%s): the damage is meant to be deeper than Open looks", st.GetHalted())
	}
	c.elect(2, r1, r2, r3)
	// Reads are served once the new epoch's start record commits.
	waitUntil(t, 10*time.Second, "the epoch-start record to commit", func() bool {
		return c.status(r1).GetHighWaterMark() > 13
	})
	// And both followers hold it, so either can be the candidate below.
	c.waitCaughtUp(r1, r2, r3)

	_, err := r1.lc.Read(ctxT(t), connect.NewRequest(&tenurev1.ReadRequest{RangeId: rangeID, Offset: 0}))
	if err == nil {
		t.Fatal("Read across the damaged batch succeeded")
	}
	st := c.status(r1)
	if !strings.Contains(st.GetHalted(), "quarantined") || !strings.Contains(st.GetHalted(), "corrupt") {
		t.Fatalf("after the read found the damage: halted = %q, want quarantined with the reason", st.GetHalted())
	}
	_, err = c.fence(r1, 3)
	wantCode(t, "Fence of the copy a read found damaged", err, connect.CodeFailedPrecondition)
	if !strings.Contains(err.Error(), "quarantined") || !strings.Contains(err.Error(), "tenurectl range rebuild") {
		t.Fatalf("fence refusal %v does not name the quarantine and the rebuild", err)
	}
	if !strings.Contains(c.logs.String(), "range HALTED: quarantined, a read found its stored data damaged") {
		t.Fatal("no log line says the copy was quarantined")
	}
	// The intact copies are promoted (a quorum without it) and serve
	// every record.
	c.elect(3, r2, r3)
	waitUntil(t, 10*time.Second, "the new leader's epoch-start record to commit", func() bool {
		return c.status(r2).GetHighWaterMark() > 14
	})
	got := c.readAll(r2)
	var vals []string
	for _, r := range got {
		if len(r.GetValue()) > 0 {
			vals = append(vals, string(r.GetValue()))
		}
	}
	if len(vals) != 12 {
		t.Fatalf("the intact copy serves %d values %q, want the 12 appended", len(vals), vals)
	}
}

// The same damage reached by a follower's fetch: the leader's copy is
// quarantined (it was halted, and still answered fences).
func TestDamagedRecordFoundByAFetchQuarantinesTheCopy(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2)
	for i := range 4 {
		c.mustAppend(r1, values(string(rune('a'+i)), 3)...)
	}
	c.waitCaughtUp(r1, r2)
	c.stop(r1)
	flipStoredValue(t, r1.dir, binary.BigEndian.AppendUint64([]byte("l/"+rangeID+"/"), 4))
	c.start(r1)
	// r3 joins empty and fetches from 0: its fetch reaches the damage.
	c.elect(2, r1, r2, r3)
	waitUntil(t, 10*time.Second, "the leader's copy to stop on the damage", func() bool {
		return c.status(r1).GetHalted() != ""
	})
	if h := c.status(r1).GetHalted(); !strings.Contains(h, "quarantined") {
		t.Fatalf("leader halted %q, want quarantined", h)
	}
	_, err := c.fence(r1, 3)
	wantCode(t, "Fence of the copy a fetch found damaged", err, connect.CodeFailedPrecondition)
}
