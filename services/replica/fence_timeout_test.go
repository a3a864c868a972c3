package replica_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// A fence whose wait for durability outlives the caller's deadline (a slow
// disk) changes nothing: the range goes on acting at its epoch, as if the
// fence had never arrived. It used to stop acting first and then fail,
// which left a follower reporting FOLLOWER with no fetch loop (and a leader
// stopped) until some later, higher fence. The range here is a leader:
// its records are written and readable while their sync is held, outside
// the range lock. A follower syncs its fetched records under the range
// lock unless another commit is running, a window no seam opens at will;
// its fence runs the same lines.
func TestFenceDeadlineDuringDurabilityWaitChangesNothing(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	var hold atomic.Bool
	release := make(chan struct{})
	r1.opts.CrashAt = func(point string) error {
		if point == logstore.CrashCommitSync && hold.Load() {
			<-release // r1's disk stalls: written records do not become durable
		}
		return nil
	}
	c.restart(r1)
	var releaseOnce sync.Once
	unhold := func() { releaseOnce.Do(func() { hold.Store(false); close(release) }) }
	// Runs before the cluster's cleanup: a failing test must not leave the
	// committer stuck, or closing r1 hangs.
	t.Cleanup(unhold)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("committed", 2)...)

	hold.Store(true)
	done := make(chan error, 1)
	go func() {
		_, err := c.append(ctxT(t), r1, []byte("held"))
		done <- err
	}()
	// r1 wrote the held record (its log end passed it) and the followers
	// fetched it; r1's own copy is not durable.
	waitUntil(t, 10*time.Second, "the held record to be written and fetched", func() bool {
		st := c.status(r1)
		fs := st.GetFollowers()
		return st.GetLogEnd() == 4 && len(fs) == 2 && fs[0].GetFetchOffset() == 4 && fs[1].GetFetchOffset() == 4
	})

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := r1.rc.Fence(ctx, connect.NewRequest(&tenurev1.FenceRequest{RangeId: rangeID, Epoch: 2, FencerId: "driver"}))
	cancel()
	wantCode(t, "Fence(r1, 2) while r1's disk stalls", err, connect.CodeDeadlineExceeded)
	if st := c.status(r1); st.GetFencedEpoch() != 1 || st.GetRole() != tenurev1.Role_ROLE_LEADER {
		t.Fatalf("after a fence that failed: fenced epoch %d, role %v; want 1, LEADER (nothing changed)", st.GetFencedEpoch(), st.GetRole())
	}

	unhold()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the held append after the disk recovered = %v, want acknowledged", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the held append was not answered after the disk recovered")
	}
	c.mustAppend(r1, []byte("after"))
	c.waitCaughtUp(r1, r2, r3)
	c.sameLogs(c.storeLog(r1), r2, r3)
	if st := c.status(r2); st.GetRole() != tenurev1.Role_ROLE_FOLLOWER || st.GetEpoch() != 1 {
		t.Fatalf("r2 after the failed fence of r1 = %v, want following at epoch 1", st)
	}
	// The fence at 2, retried once the disk is fast again, goes through.
	if a := c.mustFence(r1, 2); a.GetFencedEpoch() != 2 || a.GetPreviousRole() != tenurev1.Role_ROLE_LEADER {
		t.Fatalf("retried Fence(r1, 2) = %v", a)
	}
}
