package replica_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// freeSpace is a node's FreeBytes seam (logstore.Options), moved by the test.
type freeSpace struct{ n atomic.Uint64 }

func (f *freeSpace) free() (uint64, error) { return f.n.Load(), nil }

const testReserve = 64 << 20

// withFreeSpace restarts every node of c with a disk reserve and a free
// space the test sets; each starts with room.
func withFreeSpace(c *cluster) []*freeSpace {
	var fs []*freeSpace
	for _, n := range c.nodes {
		f := &freeSpace{}
		f.n.Store(1 << 30)
		n.opts.DiskReserveBytes = testReserve
		n.opts.FreeBytes = f.free
		c.restart(n)
		fs = append(fs, f)
	}
	return fs
}

// diskOf is n's GetStatus disk.
func (c *cluster) diskOf(n *node) *tenurev1.DiskStatus {
	c.t.Helper()
	resp, err := n.rc.GetStatus(ctxT(c.t), connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{}))
	if err != nil {
		c.t.Fatalf("GetStatus(%s) = %v", n.id, err)
	}
	return resp.Msg.GetDisk()
}

// waitDisk waits, bounded, for n's disk to be full or not: the store reads
// the free space every 500 ms by itself.
func (c *cluster) waitDisk(n *node, full bool) {
	c.t.Helper()
	waitUntil(c.t, 5*time.Second, n.id+"'s disk full = "+map[bool]string{true: "true", false: "false"}[full], func() bool {
		return c.diskOf(n).GetFull() == full
	})
}

// A leader whose disk is below its reserve answers appends with
// ResourceExhausted naming the replica and the space, says so in
// GetStatus, and keeps serving reads; a full follower lags without
// halting; both resume by themselves once space is back, and a range can
// be fenced and led by a replica while its disk is full.
func TestDiskFullRefusesAppendsAndResumes(t *testing.T) {
	c := newCluster(t, 3)
	free := withFreeSpace(c)
	n1, n2, n3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, n1, n2, n3)
	c.mustAppend(n1, values("a", 5)...)
	c.waitCaughtUp(n1, n2, n3)
	if d := c.diskOf(n1); d.GetFull() || d.GetFreeBytes() != 1<<30 || d.GetReserveBytes() != testReserve || d.GetUsedBytes() == 0 {
		t.Fatalf("GetStatus(r1).disk = %v, want not full, 1 GiB free, the reserve, some bytes used", d)
	}

	// A full follower: the quorum (r1, r2) commits without it, and it
	// lags, fetching again with backoff, not halted.
	free[2].n.Store(testReserve / 2)
	c.waitDisk(n3, true)
	lagEnd := c.status(n3).GetLogEnd()
	c.mustAppend(n1, values("b", 5)...)
	c.waitCaughtUp(n1, n2)
	time.Sleep(time.Second) // several of its fetch retries
	if st := c.status(n3); st.GetLogEnd() != lagEnd || st.GetHalted() != "" || st.GetRole() != tenurev1.Role_ROLE_FOLLOWER {
		t.Fatalf("full follower r3: %v, want log end %d, following, not halted", st, lagEnd)
	}

	// A full leader refuses appends, not reads.
	free[0].n.Store(testReserve - 1)
	c.waitDisk(n1, true)
	d := c.diskOf(n1)
	if !strings.Contains(d.GetReason(), "below the reserve") || d.GetFullSinceUnixMs() <= 0 {
		t.Fatalf("GetStatus(r1).disk = %v, want full below the reserve, with a time", d)
	}
	_, err := c.append(ctxT(t), n1, []byte("refused"))
	wantCode(t, "Append to a full leader", err, connect.CodeResourceExhausted)
	for _, want := range []string{"replica r1", "disk full", "below the reserve", "resume"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	if got := len(c.readAll(n1)); got != 11 { // the epoch-start record and 10
		t.Fatalf("read %d records from the full leader, want 11", got)
	}
	if st := c.status(n1); st.GetHalted() != "" || st.GetRole() != tenurev1.Role_ROLE_LEADER || st.GetLogEnd() != 11 {
		t.Fatalf("full leader r1: %v, want leading, not halted, log end 11", st)
	}

	// Space back: both resume by themselves.
	free[0].n.Store(1 << 30)
	free[2].n.Store(1 << 30)
	c.waitDisk(n1, false)
	c.mustAppend(n1, values("c", 5)...)
	c.waitCaughtUp(n1, n2, n3)
	c.sameLogs(c.readAll(n1), n1, n2, n3)

	// A promotion onto a full replica: fences and its epoch-start record
	// go through (out of the reserve), client appends do not.
	free[1].n.Store(0)
	c.waitDisk(n2, true)
	c.elect(2, n2, n1, n3)
	_, err = c.append(ctxT(t), n2, []byte("refused"))
	wantCode(t, "Append to a full new leader", err, connect.CodeResourceExhausted)
	free[1].n.Store(1 << 30)
	c.waitDisk(n2, false)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.append(ctx, n2, values("d", 3)...); err != nil {
		t.Fatalf("Append to r2 once space is back = %v", err)
	}
	c.waitCaughtUp(n2, n1, n3)
	c.sameLogs(c.readAll(n2), n1, n2, n3)
}
