package replica_test

import (
	"errors"
	"testing"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

func (c *cluster) drop(n *node, epoch uint64) (*tenurev1.DropRangeResponse, error) {
	resp, err := n.rc.DropRange(ctxT(c.t), connect.NewRequest(&tenurev1.DropRangeRequest{RangeId: rangeID, Epoch: epoch}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// notHosted fails unless n hosts no range.
func (c *cluster) notHosted(n *node) {
	c.t.Helper()
	st, err := n.rc.GetStatus(ctxT(c.t), connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{}))
	if err != nil {
		c.t.Fatal(err)
	}
	if len(st.Msg.GetRanges()) != 0 {
		c.t.Fatalf("%s hosts %v, want nothing", n.id, st.Msg.GetRanges())
	}
	_, err = n.rc.GetStatus(ctxT(c.t), connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: rangeID}))
	wantCode(c.t, "GetStatus of a dropped range", err, connect.CodeNotFound)
}

// DropRange is refused below the fenced epoch and on the leader; at the
// fenced epoch it stops the follower, deletes the range (for good: a
// restart does not bring it back) and is idempotent; the next fence hosts
// an empty range.
func TestDropRangeThenFenceHostsAnEmptyRange(t *testing.T) {
	c := newCluster(t, 2)
	r1, r2 := c.node(1), c.node(2)
	c.elect(1, r1, r2)
	c.mustFence(r2, 2)
	c.elect(3, r1, r2)
	c.mustAppend(r1, values("old", 5)...)
	c.waitCaughtUp(r1, r2)

	_, err := c.drop(r2, 2)
	wantCode(t, "DropRange below the fenced epoch", err, connect.CodeFailedPrecondition)
	_, err = c.drop(r1, 3)
	wantCode(t, "DropRange on the leader", err, connect.CodeFailedPrecondition)
	if st := c.status(r2); st.GetLogEnd() != c.status(r1).GetLogEnd() || st.GetRole() != tenurev1.Role_ROLE_FOLLOWER {
		t.Fatalf("refused drops changed the follower: %v", st)
	}
	if a, err := c.drop(r2, 3); err != nil || !a.GetExisted() {
		t.Fatalf("DropRange(r2, 3) = %v, %v; want existed", a, err)
	}
	c.notHosted(r2)
	if a, err := c.drop(r2, 3); err != nil || a.GetExisted() {
		t.Fatalf("DropRange(r2, 3) again = %v, %v; want existed=false", a, err)
	}
	c.restart(r2)
	c.notHosted(r2)
	a := c.mustFence(r2, 4)
	if a.GetLogEnd() != 0 || a.GetHighWaterMark() != 0 || len(a.GetHistory()) != 0 {
		t.Fatalf("Fence after the drop = %v; want an empty range", a)
	}
	// It catches up from scratch like any new member.
	c.elect(5, r1, r2)
	c.waitCaughtUp(r1, r2)
	c.sameLogs(c.storeLog(r1), r2)
}

// A crash in the middle of a drop leaves a consistent store: the restarted
// replica finishes the drop before it hosts anything, so it never serves a
// range over part of its log, and the next fence hosts an empty range.
func TestCrashMidDropLeavesAConsistentStore(t *testing.T) {
	c := newCluster(t, 2)
	r1, r2 := c.node(1), c.node(2)
	c.elect(1, r1, r2)
	c.mustAppend(r1, values("old", 20)...)
	c.waitCaughtUp(r1, r2)
	crash := errors.New("crash mid-drop")
	c.stop(r2)
	r2.opts.CrashAt = func(p string) error {
		if p == logstore.CrashDropLog {
			return crash
		}
		return nil
	}
	c.start(r2)
	c.mustFence(r2, 2)
	_, err := c.drop(r2, 2)
	wantCode(t, "DropRange with a crash mid-way", err, connect.CodeInternal)
	c.crash(r2)
	r2.opts.CrashAt = nil
	c.start(r2)
	c.notHosted(r2)
	a := c.mustFence(r2, 3)
	if a.GetLogEnd() != 0 || len(a.GetHistory()) != 0 {
		t.Fatalf("Fence after a crash mid-drop = %v; want an empty range", a)
	}
}
