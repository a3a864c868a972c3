package replica_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// The design's divergence story. Leader r1 at epoch 1 writes a tail that
// reaches r2 but commits nowhere (r2's acknowledgement never arrives, r3 is
// partitioned). Epoch 2 fences r1 and r3 and makes r3 leader; it writes.
// r1 and r2 rejoin as followers and the fetch check truncates each to
// exactly the divergence point; committed records survive on all three,
// byte for byte.
func TestDivergentTailTruncatedByFetchCheck(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("committed", 5)...)
	c.waitCaughtUp(r1, r2, r3)
	committed := c.status(r1).GetLogEnd() // 6: the epoch-start record and 5 records

	// r3 hears nothing more; r2 may fetch from the committed end but its
	// next fetch, which would acknowledge the tail, never reaches r1.
	r3.gate.block()
	r2.gate.set(func(m *tenurev1.FetchRequest) bool { return m.GetFetchOffset() <= committed })
	tailCtx, cancelTail := context.WithCancel(context.Background())
	defer cancelTail()
	tailDone := make(chan error, 1)
	go func() {
		_, err := c.append(tailCtx, r1, values("tail", 3)...)
		tailDone <- err
	}()
	waitUntil(t, 10*time.Second, "the tail to reach r2", func() bool { return c.status(r2).GetLogEnd() == committed+3 })
	// A leader serves a batch to its followers before its own write of it
	// has committed (ReadTail), so r2 can hold the tail before r1 does.
	waitUntil(t, 10*time.Second, "r1 to write the tail", func() bool { return c.status(r1).GetLogEnd() == committed+3 })
	if st := c.status(r1); st.GetLogEnd() != committed+3 || st.GetHighWaterMark() != committed {
		t.Fatalf("r1 log end %d HWM %d, want the tail written (%d) but not committed (%d)", st.GetLogEnd(), st.GetHighWaterMark(), committed+3, committed)
	}

	// Epoch 2 reaches r1 and r3 only. The committed bound is their largest HWM.
	f1, f3 := c.mustFence(r1, 2), c.mustFence(r3, 2)
	bound := max(f1.GetHighWaterMark(), f3.GetHighWaterMark())
	if bound != committed || f1.GetPreviousRole() != tenurev1.Role_ROLE_LEADER || f3.GetLogEnd() != committed {
		t.Fatalf("fence answers r1 %v, r3 %v: want bound %d, r1 previously leader, r3 at %d", f1, f3, committed, committed)
	}
	select {
	case err := <-tailDone:
		wantCode(t, "the tail append after r1 was fenced", err, connect.CodeFailedPrecondition)
	case <-time.After(5 * time.Second):
		t.Fatal("the tail append was not failed by the fence")
	}
	r3.gate.open()
	c.mustAdopt(r3, 2, tenurev1.Role_ROLE_LEADER, r3, bound)
	c.mustAdopt(r1, 2, tenurev1.Role_ROLE_FOLLOWER, r3, 0)
	c.mustAppend(r3, values("epoch2", 4)...)
	// Epoch 2 overwrote offsets [committed, committed+3) on r3's log.
	c.waitCaughtUp(r3, r1)

	// r2 rejoins (the reconcile loop): fence at the current epoch, follow.
	r2.gate.open()
	c.mustFence(r2, 2)
	c.mustAdopt(r2, 2, tenurev1.Role_ROLE_FOLLOWER, r3, 0)
	c.waitCaughtUp(r3, r2)

	want := c.storeLog(r3)
	c.sameLogs(want, r1, r2)
	if len(want) != int(committed)+1+4 {
		t.Fatalf("r3 holds %d records, want %d", len(want), committed+5)
	}
	for i, r := range want {
		switch {
		case uint64(i) < committed && r.GetEpoch() != 1,
			uint64(i) == committed && (!r.GetEpochStart() || r.GetEpoch() != 2),
			uint64(i) > committed && (r.GetEpoch() != 2 || !strings.HasPrefix(string(r.GetValue()), "epoch2-")):
			t.Fatalf("record %d = %v", i, r)
		}
	}
	// Truncated to exactly the divergence point: the history says epoch 2
	// starts where the committed prefix ends, on every replica.
	for _, n := range c.nodes {
		h := c.history(n).GetHistory()
		if got := fmt.Sprint(h); len(h) != 2 || h[0].GetEpoch() != 1 || h[0].GetStartOffset() != 0 || h[1].GetEpoch() != 2 || h[1].GetStartOffset() != committed {
			t.Fatalf("%s history = %s, want [(1,0) (2,%d)]", n.id, got, committed)
		}
	}
	if !strings.Contains(c.logs.String(), fmt.Sprintf("to=%d removed=3", committed)) {
		t.Fatalf("no replica logged a truncation of the 3-record tail to %d", committed)
	}
}

// A follower whose log diverges from the leader's at the same length is not
// counted toward the commit for bytes it lacks: its fetches alone do not move
// the leader's HWM, and status shows its offset unchecked, until it has
// truncated and fetched again.
func TestDivergedFollowerNotCounted(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("committed", 3)...)
	c.waitCaughtUp(r1, r2, r3)
	committed := c.status(r1).GetLogEnd() // 4

	// r1 writes a 4-record tail nobody receives.
	r2.gate.block()
	r3.gate.block()
	tailCtx, cancelTail := context.WithCancel(context.Background())
	defer cancelTail()
	go func() { _, _ = c.append(tailCtx, r1, values("tail", 4)...) }()
	waitUntil(t, 5*time.Second, "r1's tail", func() bool { return c.status(r1).GetLogEnd() == committed+4 })
	same := committed + 4

	// Epoch 2: r2 leads with r3 and commits its epoch-start record and two
	// records, one short of r1's log end.
	c.mustFence(r1, 2)
	c.mustFence(r2, 2)
	c.mustFence(r3, 2)
	r2.gate.open()
	r3.gate.open()
	c.mustAdopt(r2, 2, tenurev1.Role_ROLE_LEADER, r2, committed)
	c.mustAdopt(r3, 2, tenurev1.Role_ROLE_FOLLOWER, r2, 0)
	c.mustAppend(r2, values("epoch2", 2)...)
	c.waitCaughtUp(r2, r3)

	// With r3 gone, only r1 could make a quorum with r2. One more record
	// puts r2's log end exactly at r1's, with different records behind it.
	c.stop(r3)
	pending := make(chan error, 1)
	go func() {
		_, err := c.append(ctxT(t), r2, []byte("needs-r1"))
		pending <- err
	}()
	waitUntil(t, 5*time.Second, "the pending append to be written", func() bool { return c.status(r2).GetLogEnd() == same })
	if end := c.status(r1).GetLogEnd(); end != same {
		t.Fatalf("r1 log end %d, r2 log end %d: want the same length", end, same)
	}
	hwm := c.status(r2).GetHighWaterMark()
	if hwm != same-1 {
		t.Fatalf("r2 HWM = %d, want %d (everything but the pending record)", hwm, same-1)
	}

	// Fetch exactly as r1 would with its diverged log: (epoch 1, its log end).
	for i := 0; i < 5; i++ {
		resp, err := r2.rc.Fetch(ctxT(t), connect.NewRequest(&tenurev1.FetchRequest{
			RangeId: rangeID, Epoch: 2, ReplicaId: r1.id, FetchOffset: same, LastFetchedEpoch: 1, MaxWaitMs: 50,
		}))
		if err != nil {
			t.Fatalf("diverged fetch = %v", err)
		}
		d := resp.Msg.GetDiverging()
		if d == nil || d.GetEpoch() != 1 || d.GetEndOffset() != committed || len(resp.Msg.GetRecords()) != 0 {
			t.Fatalf("diverged fetch answer = %v, want diverging (1, %d) and no records", resp.Msg, committed)
		}
	}
	st := c.status(r2)
	if st.GetHighWaterMark() != hwm {
		t.Fatalf("leader HWM moved %d -> %d on a diverged follower's fetches", hwm, st.GetHighWaterMark())
	}
	for _, f := range st.GetFollowers() {
		if f.GetReplicaId() == r1.id && f.GetFetchOffset() != 0 {
			t.Fatalf("r1's progress = %v, want its offset unchecked (0)", f)
		}
	}
	select {
	case err := <-pending:
		t.Fatalf("append committed on a diverged follower's fetches: %v", err)
	default:
	}

	// r1 rejoins for real: its fetch check truncates it, it refetches, and
	// only then does it count.
	c.mustAdopt(r1, 2, tenurev1.Role_ROLE_FOLLOWER, r2, 0)
	select {
	case err := <-pending:
		if err != nil {
			t.Fatalf("append after r1 reconciled = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("append did not commit after r1 reconciled")
	}
	c.waitCaughtUp(r2, r1)
	c.sameLogs(c.storeLog(r2), r1)
}

// A follower told to truncate below its own HWM refuses: it stops fetching
// and the range stops serving, rather than discard a committed record.
func TestFollowerRefusesDivergenceBelowHWM(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("committed", 3)...)
	c.waitCaughtUp(r1, r2, r3)

	// Build a leader that lacks committed records: r2 restarts on an empty
	// data directory and is (wrongly) made leader of epoch 2. r3's committed
	// records are not in its log.
	c.stop(r2)
	r2.dir = c.freshDir(r2.id)
	c.start(r2)
	c.mustFence(r2, 2)
	c.mustFence(r3, 2)
	c.mustAdopt(r2, 2, tenurev1.Role_ROLE_LEADER, r2, 0)
	c.mustAdopt(r3, 2, tenurev1.Role_ROLE_FOLLOWER, r2, 0)
	waitUntil(t, 10*time.Second, "r3 to stop on the violation", func() bool { return r3.r.Halted(rangeID) != nil })
	if err := r3.r.Halted(rangeID); !strings.Contains(err.Error(), "below our HWM") {
		t.Fatalf("r3 halted with %v, want a divergence below its HWM", err)
	}
	st := c.status(r3)
	if st.GetLogEnd() != 4 || st.GetHighWaterMark() != 4 {
		t.Fatalf("r3 log end %d HWM %d after refusing: want 4, 4 (nothing truncated)", st.GetLogEnd(), st.GetHighWaterMark())
	}
	// GetStatus says so, with the reason, for the operator.
	if !strings.Contains(st.GetHalted(), "below our HWM") {
		t.Fatalf("r3 status halted = %q, want the violation", st.GetHalted())
	}
	if h := c.status(r2).GetHalted(); h != "" {
		t.Fatalf("r2 (serving) status halted = %q, want empty", h)
	}
	// It serves nothing that acts on the log until restarted.
	_, err := r3.rc.Truncate(ctxT(t), connect.NewRequest(&tenurev1.TruncateRequest{RangeId: rangeID, Epoch: 2, TargetOffset: 4}))
	wantCode(t, "Truncate on a stopped range", err, connect.CodeDataLoss)
	if !strings.Contains(c.logs.String(), "range stopped serving") {
		t.Fatal("the violation was not logged as an error")
	}
}
