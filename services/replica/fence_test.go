package replica_test

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// Truncate never cuts below the HWM, names both offsets when it refuses, and
// is accepted only at exactly the fenced epoch and only while fenced.
func TestTruncateRefusals(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("committed", 5)...)
	c.waitCaughtUp(r1, r2, r3)
	hwm := c.status(r2).GetHighWaterMark() // 6

	truncate := func(n *node, epoch, to uint64) (*tenurev1.TruncateResponse, error) {
		resp, err := n.rc.Truncate(ctxT(t), connect.NewRequest(&tenurev1.TruncateRequest{RangeId: rangeID, Epoch: epoch, TargetOffset: to}))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}
	// Never as leader, never as an adopted follower.
	_, err := truncate(r1, 1, hwm)
	wantCode(t, "Truncate on the leader", err, connect.CodeFailedPrecondition)
	_, err = truncate(r2, 1, hwm)
	wantCode(t, "Truncate on a follower", err, connect.CodeFailedPrecondition)

	c.mustFence(r2, 2)
	_, err = truncate(r2, 2, hwm-1)
	wantCode(t, "Truncate below the HWM", err, connect.CodeFailedPrecondition)
	if msg := err.Error(); !strings.Contains(msg, fmt.Sprint(hwm-1)) || !strings.Contains(msg, fmt.Sprint(hwm)) {
		t.Fatalf("Truncate below the HWM failed with %q, want it to name %d and %d", msg, hwm-1, hwm)
	}
	_, err = truncate(r2, 1, hwm)
	wantCode(t, "Truncate at a stale epoch", err, connect.CodeFailedPrecondition)
	_, err = truncate(r2, 3, hwm)
	wantCode(t, "Truncate at an epoch never fenced", err, connect.CodeFailedPrecondition)
	if st := c.status(r2); st.GetLogEnd() != hwm {
		t.Fatalf("refused truncations changed the log: end %d, want %d", st.GetLogEnd(), hwm)
	}
	// At the HWM, and beyond the log end, there is nothing to cut.
	for _, to := range []uint64{hwm, hwm + 10} {
		a, err := truncate(r2, 2, to)
		if err != nil || a.GetLogEnd() != hwm || a.GetRecordsRemoved() != 0 || len(a.GetHistory()) != 1 {
			t.Fatalf("Truncate(2, %d) = %v, %v; want a no-op at log end %d", to, a, err, hwm)
		}
	}
}

// A fence at a lower epoch is refused, naming the current fence, also after
// a restart; Adopt and Fetch at stale epochs are refused too; a repeated
// fence is idempotent.
func TestStaleEpochsRefusedAcrossRestart(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("x", 2)...)
	c.waitCaughtUp(r1, r2, r3)

	c.mustFence(r3, 3)
	for round := 0; round < 2; round++ {
		_, err := c.fence(r3, 2)
		wantCode(t, "Fence at 2 after a fence at 3", err, connect.CodeFailedPrecondition)
		if !strings.Contains(err.Error(), "fenced at epoch 3") {
			t.Fatalf("stale fence refused with %q, want it to name epoch 3", err)
		}
		_, err = c.adopt(r3, 2, tenurev1.Role_ROLE_FOLLOWER, r1, 0)
		wantCode(t, "Adopt at a stale epoch", err, connect.CodeFailedPrecondition)
		a := c.mustFence(r3, 3)
		if a.GetFencedEpoch() != 3 || a.GetLogEnd() != 3 || a.GetHighWaterMark() != 3 || a.GetPreviousRole() != tenurev1.Role_ROLE_FENCED {
			t.Fatalf("repeated Fence(3) = %v", a)
		}
		c.restart(r3)
	}
	if st := c.status(r3); st.GetFencedEpoch() != 3 || st.GetRole() != tenurev1.Role_ROLE_FENCED {
		t.Fatalf("status after restart = %v, want fenced at 3", st)
	}

	// r1 still leads epoch 1: a fetch at any other epoch is refused.
	for _, epoch := range []uint64{3} {
		_, err := r1.rc.Fetch(ctxT(t), connect.NewRequest(&tenurev1.FetchRequest{RangeId: rangeID, Epoch: epoch, ReplicaId: r2.id, FetchOffset: 3, LastFetchedEpoch: 1}))
		wantCode(t, fmt.Sprintf("Fetch at epoch %d from leader at 1", epoch), err, connect.CodeFailedPrecondition)
	}
	// A leader at epoch 2 refuses a fetch at epoch 1.
	c.elect(2, r1, r2)
	_, err := r1.rc.Fetch(ctxT(t), connect.NewRequest(&tenurev1.FetchRequest{RangeId: rangeID, Epoch: 1, ReplicaId: r2.id, FetchOffset: 3, LastFetchedEpoch: 1}))
	wantCode(t, "Fetch at stale epoch 1 from leader at 2", err, connect.CodeFailedPrecondition)
	if !strings.Contains(err.Error(), "stale") {
		t.Fatalf("stale fetch refused with %q", err)
	}
}

// A leader that restarts does not act until fenced higher and adopted again.
func TestRestartedLeaderWaitsForNewEpoch(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("x", 2)...)
	c.waitCaughtUp(r1, r2, r3)

	c.restart(r1)
	st := c.status(r1)
	if st.GetRole() != tenurev1.Role_ROLE_FENCED || st.GetEpoch() != 1 || st.GetFencedEpoch() != 1 || st.GetHighWaterMark() > st.GetLogEnd() {
		t.Fatalf("restarted leader status = %v, want not serving at epoch 1", st)
	}
	_, err := c.append(ctxT(t), r1, []byte("y"))
	wantCode(t, "Append on a restarted leader", err, connect.CodeFailedPrecondition)
	_, err = c.adopt(r1, 1, tenurev1.Role_ROLE_LEADER, r1, 0)
	wantCode(t, "Adopt at its old epoch", err, connect.CodeFailedPrecondition)
	_, err = r1.rc.Truncate(ctxT(t), connect.NewRequest(&tenurev1.TruncateRequest{RangeId: rangeID, Epoch: 1, TargetOffset: 3}))
	wantCode(t, "Truncate at its old epoch", err, connect.CodeFailedPrecondition)

	a := c.mustFence(r1, 2)
	if a.GetPreviousRole() != tenurev1.Role_ROLE_LEADER {
		t.Fatalf("fence of a restarted leader: previous role %v, want LEADER", a.GetPreviousRole())
	}
	// Its HWM is the persisted one, which may lag what it acknowledged
	// before the restart: a planned handover must not take it as the
	// leader's last word.
	if a.GetActingLeader() {
		t.Fatalf("fence of a restarted leader says acting_leader")
	}
	c.elect(2, r1, r2, r3)
	c.mustAppend(r1, values("z", 3)...)
	c.waitCaughtUp(r1, r2, r3)
	c.sameLogs(c.storeLog(r1), r2, r3)
	// A leader serving when fenced says so; a follower does not; nor does a
	// repeat of the fence (the leadership already ended).
	if a := c.mustFence(r1, 3); !a.GetActingLeader() {
		t.Fatalf("fence of the serving leader: acting_leader false")
	}
	if a := c.mustFence(r2, 3); a.GetActingLeader() {
		t.Fatalf("fence of a follower says acting_leader")
	}
	if a := c.mustFence(r1, 3); a.GetActingLeader() {
		t.Fatalf("repeated fence says acting_leader")
	}
}

// A crash in the middle of a truncation, at each of the store's crash
// points, leaves journal and log consistent after the replica restarts.
func TestCrashDuringTruncateRecovers(t *testing.T) {
	for _, point := range []string{logstore.CrashTruncateIntent, logstore.CrashTruncateJournal, logstore.CrashTruncateLog} {
		t.Run(point, func(t *testing.T) {
			c := newCluster(t, 3)
			r1, r2, r3 := c.node(1), c.node(2), c.node(3)
			var armed atomic.Bool
			r1.opts.CrashAt = func(p string) error {
				if p == point && armed.Load() {
					return errors.New("injected crash at " + p)
				}
				return nil
			}
			c.restart(r1)
			c.elect(1, r1, r2, r3)
			c.mustAppend(r1, values("committed", 4)...)
			c.waitCaughtUp(r1, r2, r3)
			committed := c.storeLog(r1)

			// An uncommitted tail on r1, then a promotion that cuts it.
			r2.gate.block()
			r3.gate.block()
			go func() { _, _ = c.append(ctxT(t), r1, values("tail", 3)...) }()
			waitUntil(t, 5*time.Second, "the tail", func() bool { return c.status(r1).GetLogEnd() == uint64(len(committed))+3 })
			c.mustFence(r1, 2)

			armed.Store(true)
			_, err := r1.rc.Truncate(ctxT(t), connect.NewRequest(&tenurev1.TruncateRequest{RangeId: rangeID, Epoch: 2, TargetOffset: uint64(len(committed))}))
			if err == nil {
				t.Fatalf("Truncate with a crash at %s succeeded", point)
			}
			armed.Store(false)
			c.restart(r1)

			st := c.status(r1)
			h := c.history(r1).GetHistory()
			if st.GetLogEnd() != uint64(len(committed)) || st.GetFencedEpoch() != 2 || len(h) != 1 || h[0].GetEpoch() != 1 {
				t.Fatalf("after the crash at %s and a restart: log end %d, fenced %d, history %v; want %d, 2, [(1,0)]",
					point, st.GetLogEnd(), st.GetFencedEpoch(), h, len(committed))
			}
			c.sameLogs(committed, r1)
			// The range serves again: it can be made leader of epoch 2.
			r2.gate.open()
			r3.gate.open()
			c.elect(2, r1, r2, r3)
			c.mustAppend(r1, []byte("after"))
			c.waitCaughtUp(r1, r2, r3)
			c.sameLogs(c.storeLog(r1), r2, r3)
		})
	}
}

// A follower that crashes between journaling a new epoch and writing its
// first record comes back consistent and catches up: the history it
// reports mirrors the leader's.
func TestFollowerCrashBetweenJournalAndRecords(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	var armed atomic.Bool
	r2.opts.CrashAt = func(p string) error {
		if p == logstore.CrashAppendJournal && armed.Load() {
			return errors.New("injected crash at " + p)
		}
		return nil
	}
	c.restart(r2)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("one", 3)...)
	c.waitCaughtUp(r1, r2, r3)

	armed.Store(true)
	c.elect(2, r1, r2, r3)
	waitUntil(t, 10*time.Second, "r2 to crash on epoch 2's first record", func() bool { return r2.r.Halted(rangeID) != nil })
	armed.Store(false)
	c.mustAppend(r1, values("two", 3)...) // r1 and r3 commit it
	c.restart(r2)
	c.waitCaughtUp(r1, r2, r3)
	c.sameLogs(c.storeLog(r1), r2, r3)
	want := fmt.Sprint(c.history(r1).GetHistory())
	if got := fmt.Sprint(c.history(r2).GetHistory()); got != want {
		t.Fatalf("r2 history after the crash = %s, want the leader's %s", got, want)
	}
}
