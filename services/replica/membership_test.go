package replica_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// fenceAs fences n at epoch as a promoter that records n as incarnation inc
// (empty: none recorded) of the range's generation gen (0: unknown).
func (c *cluster) fenceAs(n *node, epoch uint64, inc string, gen uint64) (*tenurev1.FenceResponse, error) {
	resp, err := n.rc.Fence(ctxT(c.t), connect.NewRequest(&tenurev1.FenceRequest{RangeId: rangeID, Epoch: epoch, FencerId: "driver", Incarnation: inc, RangeGeneration: gen}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// members is the replica set of the given nodes with their incarnations
// recorded, the ones in learners as learners.
func members(learners []*node, ns ...*node) []*tenurev1.Replica {
	out := replicas(ns...)
	for i, n := range ns {
		out[i].Incarnation = n.r.Incarnation()
		for _, l := range learners {
			out[i].Learner = out[i].Learner || l == n
		}
	}
	return out
}

// electSet plays a promotion at epoch with the replica set set: fence
// leader and followers with their recorded incarnations, adopt them.
func (c *cluster) electSet(epoch uint64, set []*tenurev1.Replica, leader *node, followers ...*node) {
	c.t.Helper()
	var bound uint64
	for _, n := range append([]*node{leader}, followers...) {
		a, err := c.fenceAs(n, epoch, n.r.Incarnation(), 0)
		if err != nil {
			c.t.Fatalf("Fence(%s, %d) = %v", n.id, epoch, err)
		}
		bound = max(bound, a.GetHighWaterMark())
	}
	adopt := func(n *node, role tenurev1.Role, bound uint64) {
		_, err := n.rc.Adopt(ctxT(c.t), connect.NewRequest(&tenurev1.AdoptRequest{
			RangeId: rangeID, Epoch: epoch, Role: role, LeaderId: leader.id, LeaderAddress: leader.url,
			Replicas: set, CommittedBound: bound,
		}))
		if err != nil {
			c.t.Fatalf("Adopt(%s, %d, %s) = %v", n.id, epoch, role, err)
		}
	}
	adopt(leader, tenurev1.Role_ROLE_LEADER, bound)
	for _, f := range followers {
		adopt(f, tenurev1.Role_ROLE_FOLLOWER, 0)
	}
}

// A follower whose data directory is wiped and that restarts under its old
// id is a stranger with the member's name: a fence naming the incarnation
// the membership recorded is refused (naming both), the replica hosts
// nothing, reports the range lost in its status and logs it once.
func TestWipedReplicaIsRefusedAndReportsTheLostRange(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.electSet(1, members(nil, r1, r2, r3), r1, r2, r3)
	c.mustAppend(r1, values("acked", 5)...)
	c.waitCaughtUp(r1, r2, r3)
	recorded := r2.r.Incarnation()

	c.stop(r2)
	if err := os.RemoveAll(r2.dir); err != nil {
		t.Fatal(err)
	}
	c.start(r2)
	if r2.r.Incarnation() == recorded {
		t.Fatalf("a wiped data directory kept its incarnation %s", recorded)
	}
	for epoch := uint64(2); epoch <= 3; epoch++ {
		_, err := c.fenceAs(r2, epoch, recorded, 0)
		wantCode(t, "Fence of the wiped replica", err, connect.CodeFailedPrecondition)
		if msg := err.Error(); !strings.Contains(msg, recorded) || !strings.Contains(msg, r2.r.Incarnation()) || !strings.Contains(msg, "wiped") {
			t.Fatalf("refusal %q does not name both incarnations and say the disk was wiped", msg)
		}
		// And the one command that brings it back (the promoter's
		// status shows this refusal to operators).
		if msg, want := err.Error(), "tenurectl range rebuild "+rangeID+" --replica "+r2.id; !strings.Contains(msg, want) {
			t.Fatalf("refusal %q does not name %q", msg, want)
		}
	}
	// FenceRanges refuses it the same way.
	batch, err := r2.rc.FenceRanges(ctxT(t), connect.NewRequest(&tenurev1.FenceRangesRequest{Fences: []*tenurev1.FenceRequest{{RangeId: rangeID, Epoch: 4, Incarnation: recorded}}}))
	if err != nil || connect.Code(batch.Msg.GetResults()[0].GetError().GetCode()) != connect.CodeFailedPrecondition {
		t.Fatalf("FenceRanges of the wiped replica = %v, %v; want FailedPrecondition", batch, err)
	}
	st, err := r2.rc.GetStatus(ctxT(t), connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Msg.GetRanges()) != 0 {
		t.Fatalf("the wiped replica hosts %v, want nothing", st.Msg.GetRanges())
	}
	lost := st.Msg.GetLostRanges()
	if len(lost) != 1 || lost[0].GetRangeId() != rangeID || lost[0].GetMemberIncarnation() != recorded || lost[0].GetSinceUnixMs() == 0 {
		t.Fatalf("lost ranges = %v, want %s (member incarnation %s)", lost, rangeID, recorded)
	}
	one, err := r2.rc.GetStatus(ctxT(t), connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: rangeID}))
	if err != nil || len(one.Msg.GetLostRanges()) != 1 || len(one.Msg.GetRanges()) != 0 {
		t.Fatalf("GetStatus(%s) on the wiped replica = %v, %v; want it reported lost", rangeID, one, err)
	}
	if n := strings.Count(c.logs.String(), "this disk lost the range"); n != 1 {
		t.Fatalf("the lost range was logged %d times, want once", n)
	}
	// Added again (its new incarnation not recorded yet), it hosts the
	// range afresh and no longer reports it lost.
	a, err := c.fenceAs(r2, 5, "", 0)
	if err != nil || a.GetLogEnd() != 0 || a.GetIncarnation() != r2.r.Incarnation() {
		t.Fatalf("Fence of the re-added replica = %v, %v; want an empty log under its new incarnation", a, err)
	}
	st, err = r2.rc.GetStatus(ctxT(t), connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{}))
	if err != nil || len(st.Msg.GetLostRanges()) != 0 {
		t.Fatalf("status after re-adding = %v, %v; want no lost range", st, err)
	}
	// An adoption whose replica set still records the old incarnation for
	// it is refused too: it would make this empty log the member's.
	set := members(nil, r1, r2, r3)
	set[1].Incarnation = recorded
	_, err = r2.rc.Adopt(ctxT(t), connect.NewRequest(&tenurev1.AdoptRequest{
		RangeId: rangeID, Epoch: 5, Role: tenurev1.Role_ROLE_FOLLOWER, LeaderId: r1.id, LeaderAddress: r1.url, Replicas: set,
	}))
	wantCode(t, "Adopt naming the wiped replica's old incarnation", err, connect.CodeFailedPrecondition)
}

// A learner fetches like a follower, but its copy never counts toward the
// HWM, and the quorum is a majority of the voters only: with voters
// {r1, r2, r3} and learner r4, r3 stopped and r2 cut off, a record on the
// leader and the learner is not committed; once r2 fetches, it is.
func TestLearnerNeverCountsTowardTheHWM(t *testing.T) {
	c := newCluster(t, 4)
	r1, r2, r3, r4 := c.node(1), c.node(2), c.node(3), c.node(4)
	c.electSet(1, members([]*node{r4}, r1, r2, r3, r4), r1, r2, r3, r4)
	c.mustAppend(r1, values("before", 2)...)
	c.waitCaughtUp(r1, r2, r4)
	c.stop(r3)
	r2.gate.block()
	hwm := c.status(r1).GetHighWaterMark()

	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	acked := make(chan error, 1)
	go func() {
		_, err := c.append(ctx, r1, []byte("on the leader and the learner only"))
		acked <- err
	}()
	waitUntil(t, 10*time.Second, "the learner to hold the record", func() bool {
		return c.status(r4).GetLogEnd() == hwm+1
	})
	var learner *tenurev1.FollowerProgress
	waitUntil(t, 10*time.Second, "the leader to see the learner's fetch past the record", func() bool {
		for _, f := range c.status(r1).GetFollowers() {
			if f.GetReplicaId() == r4.id {
				learner = f
			}
		}
		return learner.GetFetchOffset() == hwm+1
	})
	if !learner.GetLearner() {
		t.Fatalf("status of %s = %v, want it marked a learner", r4.id, learner)
	}
	// Bounded wait for something that must not happen.
	select {
	case err := <-acked:
		t.Fatalf("append acknowledged (%v) with only the leader's and the learner's copy", err)
	case <-time.After(500 * time.Millisecond):
	}
	if got := c.status(r1).GetHighWaterMark(); got != hwm {
		t.Fatalf("leader HWM = %d with only the learner's copy, want %d", got, hwm)
	}
	r2.gate.open()
	select {
	case err := <-acked:
		if err != nil {
			t.Fatalf("append once a voter holds it = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("append not acknowledged with 2 of 3 voters holding it")
	}
}

// A fetch that names a member's id with another incarnation than the
// replica set records (a wiped disk's replica still running its old
// loop, or a replacement under the same id) is refused and never counted:
// the leader's HWM does not move on it, and moves on the member's own.
func TestFetchFromAnotherIncarnationIsRefusedAndNotCounted(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	// Only the leader adopts: the followers' fetches are the test's.
	for _, n := range []*node{r1, r2, r3} {
		if _, err := c.fenceAs(n, 1, n.r.Incarnation(), 0); err != nil {
			t.Fatal(err)
		}
	}
	_, err := r1.rc.Adopt(ctxT(t), connect.NewRequest(&tenurev1.AdoptRequest{
		RangeId: rangeID, Epoch: 1, Role: tenurev1.Role_ROLE_LEADER, LeaderId: r1.id, LeaderAddress: r1.url,
		Replicas: members(nil, r1, r2, r3),
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	acked := make(chan error, 1)
	go func() {
		_, err := c.append(ctx, r1, []byte("needs a follower"))
		acked <- err
	}()
	waitUntil(t, 10*time.Second, "the record on the leader", func() bool { return c.status(r1).GetLogEnd() == 2 })
	lc := tenurev1connect.NewReplicaServiceClient(r1.hc, r1.url)
	fetch := func(inc string) error {
		_, err := lc.Fetch(ctxT(t), connect.NewRequest(&tenurev1.FetchRequest{
			RangeId: rangeID, Epoch: 1, ReplicaId: r2.id, Incarnation: inc,
			FetchOffset: 2, LastFetchedEpoch: 1, MaxWaitMs: 0,
		}))
		return err
	}
	stranger := strings.Repeat("f", 32)
	err = fetch(stranger)
	wantCode(t, "Fetch from another incarnation", err, connect.CodeFailedPrecondition)
	if !strings.Contains(err.Error(), stranger) || !strings.Contains(err.Error(), r2.r.Incarnation()) {
		t.Fatalf("refusal %q does not name both incarnations", err)
	}
	select {
	case err := <-acked:
		t.Fatalf("append acknowledged (%v) on a fetch from another incarnation", err)
	case <-time.After(500 * time.Millisecond):
	}
	st := c.status(r1)
	if st.GetHighWaterMark() != 0 {
		t.Fatalf("leader HWM = %d after a refused fetch, want 0", st.GetHighWaterMark())
	}
	for _, f := range st.GetFollowers() {
		if f.GetFetchOffset() != 0 {
			t.Fatalf("follower %s counted at %d after a refused fetch", f.GetReplicaId(), f.GetFetchOffset())
		}
	}
	// The member's own incarnation counts.
	if err := fetch(r2.r.Incarnation()); err != nil {
		t.Fatalf("Fetch from the member's incarnation = %v", err)
	}
	select {
	case err := <-acked:
		if err != nil {
			t.Fatalf("append = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("append not acknowledged once the member's own fetch counted")
	}
}

// A fence for a newer generation of the range finds the data here to be a
// deleted range's and drops it before hosting the new one; an older
// generation is refused; a range hosted before generations adopts the
// first one it is told, keeping its data. All of it survives a restart.
func TestRangeGenerationDropsAnOlderGenerationsData(t *testing.T) {
	c := newCluster(t, 1)
	r1 := c.node(1)
	// Hosted without a generation, then told one: it keeps its data.
	c.mustFence(r1, 1)
	c.mustAdopt(r1, 1, tenurev1.Role_ROLE_LEADER, r1, 0)
	c.mustAppend(r1, values("gen5", 4)...)
	a, err := c.fenceAs(r1, 2, "", 5)
	if err != nil || a.GetLogEnd() != 5 || a.GetFencedEpoch() != 2 {
		t.Fatalf("Fence at generation 5 of a range hosted at 0 = %v, %v; want its 5 records kept", a, err)
	}
	c.restart(r1)
	_, err = c.fenceAs(r1, 3, "", 4)
	wantCode(t, "Fence at an older generation after a restart", err, connect.CodeFailedPrecondition)
	if st := c.status(r1); st.GetLogEnd() != 5 || st.GetFencedEpoch() != 2 {
		t.Fatalf("a refused fence changed the range: %v", st)
	}
	// The range was deleted and created again: generation 6, and the lease
	// service's epochs continue above the deleted range's.
	a, err = c.fenceAs(r1, 7, "", 6)
	if err != nil {
		t.Fatal(err)
	}
	if a.GetLogEnd() != 0 || len(a.GetHistory()) != 0 || a.GetHighWaterMark() != 0 || a.GetFencedEpoch() != 7 {
		t.Fatalf("Fence at generation 6 over generation 5's data = %v; want an empty range fenced at 7", a)
	}
	c.mustAdopt(r1, 7, tenurev1.Role_ROLE_LEADER, r1, 0)
	c.mustAppend(r1, []byte("gen6"))
	c.restart(r1)
	_, err = c.fenceAs(r1, 8, "", 5)
	wantCode(t, "Fence at generation 5 after generation 6", err, connect.CodeFailedPrecondition)
	a, err = c.fenceAs(r1, 8, "", 6)
	if err != nil || a.GetLogEnd() != 2 {
		t.Fatalf("Fence at generation 6 after a restart = %v, %v; want generation 6's 2 records", a, err)
	}
}

// A leader confirms it still leads with a quorum of its voters before it
// serves a read; learners' answers count for nothing. Counted, two
// learners' answers confirmed a leader cut off from both other voters,
// which a later leader may have fenced: a stale read. Counted in the size
// only, learners down failed reads a voter quorum would serve.
func TestReadConfirmationCountsVotersOnly(t *testing.T) {
	c := newCluster(t, 5)
	r1, r2, r3, r4, r5 := c.node(1), c.node(2), c.node(3), c.node(4), c.node(5)
	c.electSet(1, members([]*node{r4, r5}, r1, r2, r3, r4, r5), r1, r2, r3, r4, r5)
	c.mustAppend(r1, values("before", 2)...)
	c.waitCaughtUp(r1, r2, r3, r4, r5)
	read := func() error {
		ctx, cancel := context.WithTimeout(ctxT(t), 10*time.Second)
		defer cancel()
		_, err := r1.lc.Read(ctx, connect.NewRequest(&tenurev1.ReadRequest{RangeId: rangeID}))
		return err
	}
	// One voter and both learners down: r1 and r2 are a voter quorum.
	c.stop(r3)
	c.stop(r4)
	c.stop(r5)
	if err := read(); err != nil {
		t.Errorf("Read with 2 of 3 voters up and the learners down = %v", err)
	}
	// Both other voters down, both learners up: no voter quorum.
	c.start(r4)
	c.start(r5)
	c.stop(r2)
	if err := read(); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("Read with only the leader and the learners up = %v, want unavailable", err)
	}
}
