package replica_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenurelog/tenure/services/replica/logstore"
)

// A follower's fetch loop does not wait for its log start to advance
// (AdvanceLogStart syncs Badger and the journal): with r2's advance held
// at its first step, r2 goes on fetching, and with r3 partitioned the
// appends commit on r2's acknowledgements alone. Once released, r2's log
// start reaches the leader's.
func TestFollowerFetchesWhileItsLogStartAdvances(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	var hold atomic.Bool
	held := make(chan struct{}, 1)
	release := make(chan struct{})
	r2.opts.CrashAt = func(point string) error {
		if point == logstore.CrashAdvanceStart && hold.Load() {
			select {
			case held <- struct{}{}:
			default:
			}
			<-release // r2's disk stalls with the new log start persisted
		}
		return nil
	}
	c.restart(r2)
	unhold := sync.OnceFunc(func() { hold.Store(false); close(release) })
	// Registered after the cluster's cleanup, so it runs first: a held
	// advance would keep r2 from closing.
	t.Cleanup(unhold)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("a", 30)...)
	c.waitCaughtUp(r1, r2, r3)

	hold.Store(true)
	c.advanceLogStart(r1, 20)
	c.mustAppend(r1, values("b", 5)...) // the answers carry the log start 20
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("r2 did not start advancing its log start within 10s")
	}
	r3.gate.block()
	// Committed only once r2 fetched it: r3 fetches nothing.
	c.mustAppend(r1, values("c", 5)...)
	if st := c.status(r2); st.GetLogStart() != 0 {
		t.Fatalf("r2's log start %d while its advance is held, want 0", st.GetLogStart())
	}
	unhold()
	waitUntil(t, 10*time.Second, "r2 to follow the log start to 20", func() bool { return c.status(r2).GetLogStart() == 20 })
	r3.gate.open()
	c.waitCaughtUp(r1, r2, r3)
}
