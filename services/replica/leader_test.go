package replica_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenurelog/tenure/services/replica/logstore"
)

// Followers receive a batch while the leader's own write of it is still in
// progress (ReadTail), but that changes nothing about when it is
// acknowledged: only once a quorum holds it durably (a follower counts for
// the offset its next fetch reports, which it sends only once its fsync
// returned; the leader for its own fsynced end) and the leader has written
// it, so that a committed record is readable where it is committed.
func TestAckWaitsForQuorumDurabilityWhileLeaderWriteIsHeld(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	var hold atomic.Bool
	release := make(chan struct{})
	r1.opts.CrashAt = func(point string) error {
		if point == logstore.CrashCommitWrite && hold.Load() {
			<-release // the leader's disk stalls before this batch reaches Badger
		}
		return nil
	}
	c.restart(r1)
	var releaseOnce sync.Once
	unhold := func() { releaseOnce.Do(func() { hold.Store(false); close(release) }) }
	// Registered after the cluster's cleanup, so it runs first: a failing
	// test must not leave the leader's committer stuck, or closing it hangs.
	t.Cleanup(unhold)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("committed", 2)...) // log: epoch start, 2 records
	const end = 3

	r3.gate.block()
	hold.Store(true)
	done := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() {
		a, err := c.append(ctx, r1, []byte("held"))
		if err == nil && a.GetBaseOffset() != end {
			t.Errorf("held append at %d, want %d", a.GetBaseOffset(), end)
		}
		done <- err
	}()
	followerAt := func(id string, off uint64) func() bool {
		return func() bool {
			for _, f := range c.status(r1).GetFollowers() {
				if f.GetReplicaId() == id {
					return f.GetFetchOffset() == off
				}
			}
			return false
		}
	}
	notAcked := func(when string) {
		t.Helper()
		select {
		case err := <-done:
			t.Fatalf("append acknowledged %s: %v", when, err)
		default:
		}
		if st := c.status(r1); st.GetHighWaterMark() != end || st.GetLogEnd() != end {
			t.Fatalf("%s: leader HWM %d, log end %d; want both %d", when, st.GetHighWaterMark(), st.GetLogEnd(), end)
		}
	}

	// r2 fetched the record from the leader's memory, fsynced it and said
	// so: one durable copy of three is not a quorum.
	waitUntil(t, 10*time.Second, "r2 to report the held record durable", followerAt("r2", end+1))
	notAcked("with one durable copy (r2's) and the leader's write held")

	// Both followers durable is a quorum, but the leader has not written
	// the record: the HWM waits for the write, so the ack does too.
	r3.gate.open()
	waitUntil(t, 10*time.Second, "r3 to report the held record durable", followerAt("r3", end+1))
	notAcked("before the leader wrote the record")

	unhold()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("append after the leader's write = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("append not acknowledged after the leader's write")
	}
	c.waitCaughtUp(r1, r2, r3)
	c.sameLogs(c.storeLog(r1), r2, r3)
}

// A leader syncs on demand (after a fetch took its records) only while its
// quorum needs a follower's copy: a leader of three does; its followers, a
// deposed leader and a leader alone sync every write at once.
func TestLeaderSyncsOnDemandOnlyWithFollowers(t *testing.T) {
	onDemand := func(n *node) bool {
		t.Helper()
		on, err := n.r.SyncsOnDemandForTest(rangeID)
		if err != nil {
			t.Fatalf("%s: %v", n.id, err)
		}
		return on
	}
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("three", 2)...)
	if !onDemand(r1) || onDemand(r2) || onDemand(r3) {
		t.Fatalf("on demand: leader %v, followers %v %v; want only the leader", onDemand(r1), onDemand(r2), onDemand(r3))
	}
	c.mustFence(r1, 2)
	if onDemand(r1) {
		t.Fatal("a deposed leader still syncs on demand")
	}

	solo := newCluster(t, 1)
	s1 := solo.node(1)
	solo.elect(1, s1)
	solo.mustAppend(s1, values("alone", 2)...)
	if onDemand(s1) {
		t.Fatal("a leader alone syncs on demand: its own copy is the quorum")
	}
}
