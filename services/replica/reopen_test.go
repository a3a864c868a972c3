package replica_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// walFault is a node's WAL write seam (logstore.Options.WALWriteFault):
// while err is set, every WAL entry write fails with it.
type walFault struct{ err atomic.Pointer[error] }

func (f *walFault) fault() error {
	if e := f.err.Load(); e != nil {
		return *e
	}
	return nil
}

func (f *walFault) set(err error) {
	if err == nil {
		f.err.Store(nil)
		return
	}
	f.err.Store(&err)
}

// withWALFaults restarts every node of c with a WAL write seam and a free
// space seam (reserve 0: no preventive refusal, so a write meets ENOSPC);
// each starts with room and writes going through.
func withWALFaults(c *cluster) ([]*walFault, []*freeSpace) {
	var faults []*walFault
	var frees []*freeSpace
	for _, n := range c.nodes {
		f, free := &walFault{}, &freeSpace{}
		free.n.Store(1 << 30)
		n.opts.WALWriteFault = f.fault
		n.opts.FreeBytes = free.free
		c.restart(n)
		faults, frees = append(faults, f), append(frees, free)
	}
	return faults, frees
}

// tryDisk is n's GetStatus disk, nil if it did not answer.
func (c *cluster) tryDisk(n *node) *tenurev1.DiskStatus {
	resp, err := n.rc.GetStatus(ctxT(c.t), connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{}))
	if err != nil {
		return nil
	}
	return resp.Msg.GetDisk()
}

// tryStatus is n's range status, nil if it did not answer one.
func (c *cluster) tryStatus(n *node) *tenurev1.RangeStatus {
	resp, err := n.rc.GetStatus(ctxT(c.t), connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: rangeID}))
	if err != nil || len(resp.Msg.GetRanges()) == 0 {
		return nil
	}
	return resp.Msg.GetRanges()[0]
}

// ackedAppender appends one record at a time to the node in leader until
// stopped, and keeps every acknowledged record (offset and value). A failed
// append's value is never sent again: its outcome is unknown.
type ackedAppender struct {
	c      *cluster
	leader atomic.Pointer[node]
	mu     sync.Mutex
	acked  map[uint64]string
	fails  int
	stop   chan struct{}
	done   chan struct{}
}

// maxAppends bounds the appender's loop (it runs for seconds).
const maxAppends = 20000

func startAppender(c *cluster, leader *node) *ackedAppender {
	a := &ackedAppender{c: c, acked: map[uint64]string{}, stop: make(chan struct{}), done: make(chan struct{})}
	a.leader.Store(leader)
	go func() {
		defer close(a.done)
		for i := range maxAppends {
			select {
			case <-a.stop:
				return
			default:
			}
			v := fmt.Sprintf("v-%d", i)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, err := c.append(ctx, a.leader.Load(), []byte(v))
			cancel()
			a.mu.Lock()
			if err == nil {
				a.acked[resp.GetBaseOffset()] = v
			} else {
				a.fails++
			}
			a.mu.Unlock()
			if err != nil {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}()
	return a
}

func (a *ackedAppender) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.acked)
}

// waitAcks waits, bounded, until more records than n are acknowledged.
func (a *ackedAppender) waitAcks(n int, what string) {
	a.c.t.Helper()
	waitUntil(a.c.t, 15*time.Second, what, func() bool { return a.count() > n })
}

func (a *ackedAppender) halt() map[uint64]string {
	close(a.stop)
	<-a.done
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.acked
}

// A WAL entry write that fails with ENOSPC fails the leader's store (its
// records had offsets): the replica reports its disk full and answers
// appends ResourceExhausted, the range is promoted away and keeps
// acknowledging through the other two, and once writes go through and the
// free space is back the replica reopens its store by itself, without a
// restart: the range comes back FENCED as after one, rejoins as a follower,
// catches up, and every acknowledged record is on every replica.
func TestStoreFailedForSpaceReopensByItself(t *testing.T) {
	c := newCluster(t, 3)
	faults, frees := withWALFaults(c)
	n1, n2, n3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, n1, n2, n3)
	app := startAppender(c, n1)
	app.waitAcks(20, "acks from r1")

	// The filesystem fills (less than the 8 MiB an ENOSPC needs to clear)
	// and r1's next WAL entry write fails for want of space.
	frees[0].n.Store(1 << 20)
	faults[0].set(fmt.Errorf("staged: %w", syscall.ENOSPC))
	waitUntil(t, 10*time.Second, "r1's disk full after the failed WAL write", func() bool {
		d := c.tryDisk(n1)
		return d != nil && d.GetFull() && strings.Contains(d.GetReason(), "want of space")
	})
	_, err := c.append(ctxT(t), n1, []byte("refused"))
	wantCode(t, "Append to r1 after its store failed", err, connect.CodeResourceExhausted)
	if !strings.Contains(err.Error(), "reopens by itself") {
		t.Errorf("refusal %q does not say the store reopens by itself", err)
	}

	// Promoted away: the more complete of r2 and r3 leads at epoch 2.
	f2, f3 := c.mustFence(n2, 2), c.mustFence(n3, 2)
	lead, follow := n2, n3
	if f3.GetLogEnd() > f2.GetLogEnd() {
		lead, follow = n3, n2
	}
	bound := max(f2.GetHighWaterMark(), f3.GetHighWaterMark())
	c.mustAdopt(lead, 2, tenurev1.Role_ROLE_LEADER, lead, bound)
	c.mustAdopt(follow, 2, tenurev1.Role_ROLE_FOLLOWER, lead, 0)
	before := app.count()
	app.leader.Store(lead)
	app.waitAcks(before+50, "acks through "+lead.id+" and "+follow.id)

	// Still full: no reopen while the space is not back.
	time.Sleep(time.Second)
	if d := c.tryDisk(n1); d == nil || !d.GetFull() {
		t.Fatalf("r1's disk with 1 MiB free after the failure = %v, want full", d)
	}
	if strings.Contains(c.logs.String(), "store reopened") {
		t.Fatalf("r1 reopened its store while the space was not back")
	}

	// Space is back: r1 reopens by itself, as after a restart.
	faults[0].set(nil)
	frees[0].n.Store(1 << 30)
	waitUntil(t, 15*time.Second, "r1 to reopen its store", func() bool {
		st, d := c.tryStatus(n1), c.tryDisk(n1)
		return st != nil && d != nil && !d.GetFull() && st.GetHalted() == "" && st.GetRole() == tenurev1.Role_ROLE_FENCED && st.GetFencedEpoch() == 1
	})
	logs := c.logs.String()
	for _, want := range []string{"store failed for want of space", "store reopened after a want of space"} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs do not say %q", want)
		}
	}

	// The promoter's reconcile loop brings it back: fence, adopt as a
	// follower; the fetch check truncates whatever of its tail diverged.
	c.mustFence(n1, 2)
	c.mustAdopt(n1, 2, tenurev1.Role_ROLE_FOLLOWER, lead, 0)
	before = app.count()
	app.waitAcks(before+20, "acks with r1 following again")
	acked := app.halt()
	c.waitCaughtUp(lead, follow, n1)
	want := c.readAll(lead)
	c.sameLogs(want, n1, n2, n3)
	for off, v := range acked {
		if off >= uint64(len(want)) || string(want[off].GetValue()) != v {
			t.Fatalf("acknowledged record %d = %q is not in the log (%d records)", off, v, len(want))
		}
	}
	t.Logf("%d acknowledged records, %d failed appends, log of %d records on every replica", len(acked), app.fails, len(want))
}

// A store that fails for another reason than a want of space (EIO from
// the same WAL write) is not reopened: the range stays halted, the disk is
// not reported full, and the replica says a restart is needed.
func TestStoreFailedNotForSpaceStaysFailed(t *testing.T) {
	c := newCluster(t, 1)
	faults, _ := withWALFaults(c)
	n1 := c.node(1)
	c.elect(1, n1)
	c.mustAppend(n1, values("a", 3)...)
	faults[0].set(fmt.Errorf("staged: %w", syscall.EIO))
	if _, err := c.append(ctxT(t), n1, []byte("lost")); err == nil {
		t.Fatalf("Append with the WAL write failing with EIO = nil error")
	}
	waitUntil(t, 10*time.Second, "r1 halted", func() bool {
		st := c.tryStatus(n1)
		return st != nil && st.GetHalted() != ""
	})
	faults[0].set(nil)
	// Several watch intervals and free-space readings: a reopen would
	// have happened by now.
	time.Sleep(2 * time.Second)
	st := c.status(n1)
	if st.GetHalted() == "" {
		t.Fatalf("r1 after an EIO: %v, want still halted", st)
	}
	if d := c.diskOf(n1); d.GetFull() {
		t.Fatalf("r1's disk after an EIO = %v, want not full", d)
	}
	_, err := c.append(ctxT(t), n1, []byte("refused"))
	if code := connect.CodeOf(err); err == nil || code == connect.CodeResourceExhausted {
		t.Fatalf("Append after an EIO = %v, want an error that is not ResourceExhausted", err)
	}
	logs := c.logs.String()
	if strings.Contains(logs, "store reopened") || !strings.Contains(logs, "not reopening it") {
		t.Fatalf("logs: want no reopen and the reason; got:\n%s", logs)
	}
}
