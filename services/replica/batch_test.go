package replica_test

import (
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// FenceRanges keeps every rule of Fence per range: a stale epoch is refused
// for that range alone (naming the current fence), a repeat at the current
// fence is an idempotent answer, a malformed entry fails alone, and every
// answered fence is durable: a restart keeps it, and refuses the epochs
// below it.
func TestFenceRangesPerRangeRules(t *testing.T) {
	c := newCluster(t, 1)
	n := c.node(1)
	ids := []string{"b0", "b1", "b2", "b3"}
	fence := func(id string, epoch uint64) *tenurev1.FenceRequest {
		return &tenurev1.FenceRequest{RangeId: id, Epoch: epoch, FencerId: "driver"}
	}
	fenceRanges := func(fs ...*tenurev1.FenceRequest) []*tenurev1.FenceRangeResult {
		t.Helper()
		resp, err := n.rc.FenceRanges(ctxT(t), connect.NewRequest(&tenurev1.FenceRangesRequest{Fences: fs}))
		if err != nil {
			t.Fatalf("FenceRanges() = %v", err)
		}
		if got := len(resp.Msg.GetResults()); got != len(fs) {
			t.Fatalf("FenceRanges() answered %d results for %d fences", got, len(fs))
		}
		for i, r := range resp.Msg.GetResults() {
			if r.GetRangeId() != fs[i].GetRangeId() || (r.GetFence() == nil) == (r.GetError() == nil) {
				t.Fatalf("result %d = %v, want exactly one of fence and error for %s", i, r, fs[i].GetRangeId())
			}
		}
		return resp.Msg.GetResults()
	}
	wantFenced := func(r *tenurev1.FenceRangeResult, epoch uint64, prev tenurev1.Role) {
		t.Helper()
		if f := r.GetFence(); f == nil || f.GetFencedEpoch() != epoch || f.GetReplicaId() != n.id || f.GetPreviousRole() != prev {
			t.Errorf("%s: %v, want fenced at %d by %s, previous role %s", r.GetRangeId(), r, epoch, n.id, prev)
		}
	}
	wantRefused := func(r *tenurev1.FenceRangeResult, code connect.Code, says string) {
		t.Helper()
		if e := r.GetError(); e == nil || connect.Code(e.GetCode()) != code || !strings.Contains(e.GetMessage(), says) {
			t.Errorf("%s: %v, want %v saying %q", r.GetRangeId(), r, code, says)
		}
	}

	// The first fence hosts the ranges.
	first := []uint64{2, 2, 2, 5}
	for i, r := range fenceRanges(fence(ids[0], 2), fence(ids[1], 2), fence(ids[2], 2), fence(ids[3], 5)) {
		wantFenced(r, first[i], tenurev1.Role_ROLE_UNSPECIFIED)
	}
	rs := fenceRanges(
		fence("b0", 1),     // below the fence: refused, naming it
		fence("b1", 2),     // a repeat: the same answer
		fence("b2", 3),     // higher: fenced
		fence("b3", 4),     // below b3's fence of 5
		fence("bad/id", 3), // malformed
		fence("b4", 0),     // epoch 0 is never granted
	)
	wantRefused(rs[0], connect.CodeFailedPrecondition, "already fenced at epoch 2")
	wantFenced(rs[1], 2, tenurev1.Role_ROLE_FENCED)
	wantFenced(rs[2], 3, tenurev1.Role_ROLE_FENCED)
	wantRefused(rs[3], connect.CodeFailedPrecondition, "already fenced at epoch 5")
	wantRefused(rs[4], connect.CodeInvalidArgument, "")
	wantRefused(rs[5], connect.CodeInvalidArgument, "positive")

	// Durable: after a restart the fences stand and lower epochs stay refused.
	c.restart(n)
	want := map[string]uint64{"b0": 2, "b1": 2, "b2": 3, "b3": 5}
	st, err := n.rc.GetStatus(ctxT(t), connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range st.Msg.GetRanges() {
		if w, ok := want[r.GetRangeId()]; ok && r.GetFencedEpoch() != w {
			t.Errorf("after restart %s is fenced at %d, want %d", r.GetRangeId(), r.GetFencedEpoch(), w)
		}
		delete(want, r.GetRangeId())
	}
	if len(want) > 0 {
		t.Errorf("after restart ranges %v are not hosted", want)
	}
	rs = fenceRanges(fence("b2", 2), fence("b3", 5))
	wantRefused(rs[0], connect.CodeFailedPrecondition, "already fenced at epoch 3")
	wantFenced(rs[1], 5, tenurev1.Role_ROLE_FENCED)
}

// AdoptRanges keeps Adopt's rules per range: only at exactly the fenced
// epoch; one range's refusal leaves the others adopted.
func TestAdoptRangesPerRangeRules(t *testing.T) {
	c := newCluster(t, 2)
	r1, r2 := c.node(1), c.node(2)
	members := replicas(r1, r2)
	for _, id := range []string{"a0", "a1", "a2"} {
		for _, n := range []*node{r1, r2} {
			if _, err := n.rc.Fence(ctxT(t), connect.NewRequest(&tenurev1.FenceRequest{RangeId: id, Epoch: 3, FencerId: "driver"})); err != nil {
				t.Fatal(err)
			}
		}
	}
	adopt := func(id string, epoch uint64) *tenurev1.AdoptRequest {
		return &tenurev1.AdoptRequest{RangeId: id, Epoch: epoch, Role: tenurev1.Role_ROLE_LEADER, LeaderId: r1.id, LeaderAddress: r1.url, Replicas: members}
	}
	resp, err := r1.rc.AdoptRanges(ctxT(t), connect.NewRequest(&tenurev1.AdoptRangesRequest{Adopts: []*tenurev1.AdoptRequest{
		adopt("a0", 3),
		adopt("a1", 2), // a deposed promoter's late command
		adopt("a2", 4), // an epoch never fenced here
		adopt("nowhere", 3),
	}}))
	if err != nil {
		t.Fatalf("AdoptRanges() = %v", err)
	}
	rs := resp.Msg.GetResults()
	if a := rs[0].GetAdopt(); rs[0].GetError() != nil || a == nil || len(a.GetHistory()) != 1 || a.GetHistory()[0].GetEpoch() != 3 || a.GetLogEnd() != 1 {
		t.Errorf("AdoptRanges(a0 at 3) = %v, want leader at 3 with its epoch-start record", rs[0])
	}
	for i, code := range map[int]connect.Code{1: connect.CodeFailedPrecondition, 2: connect.CodeFailedPrecondition, 3: connect.CodeNotFound} {
		if e := rs[i].GetError(); rs[i].GetAdopt() != nil || connect.Code(e.GetCode()) != code {
			t.Errorf("AdoptRanges(%s) = %v, want %v", rs[i].GetRangeId(), rs[i], code)
		}
	}
	// The same adoption again is a retry, answered as the first time.
	resp, err = r1.rc.AdoptRanges(ctxT(t), connect.NewRequest(&tenurev1.AdoptRangesRequest{Adopts: []*tenurev1.AdoptRequest{adopt("a0", 3)}}))
	if err != nil || resp.Msg.GetResults()[0].GetError() != nil {
		t.Errorf("repeated AdoptRanges(a0 at 3) = %v, %v", resp, err)
	}
	// A follower adopted in a batch fetches from the leader.
	resp, err = r2.rc.AdoptRanges(ctxT(t), connect.NewRequest(&tenurev1.AdoptRangesRequest{Adopts: []*tenurev1.AdoptRequest{
		{RangeId: "a0", Epoch: 3, Role: tenurev1.Role_ROLE_FOLLOWER, LeaderId: r1.id, LeaderAddress: r1.url, Replicas: members},
	}}))
	if err != nil || resp.Msg.GetResults()[0].GetError() != nil {
		t.Fatalf("AdoptRanges(r2 follows a0) = %v, %v", resp, err)
	}
	if _, err := r1.lc.Append(ctxT(t), connect.NewRequest(&tenurev1.AppendRequest{RangeId: "a0", Records: values("x", 3)})); err != nil {
		t.Errorf("Append(a0) after batched adoption = %v", err)
	}
}

// A batch that is empty, too large, or names a range twice is malformed as
// a whole; nothing in it is fenced.
func TestFenceRangesBounds(t *testing.T) {
	c := newCluster(t, 1)
	n := c.node(1)
	f := func(id string) *tenurev1.FenceRequest { return &tenurev1.FenceRequest{RangeId: id, Epoch: 1} }
	var tooMany []*tenurev1.FenceRequest
	for i := range wire.MaxRangesPerBatch + 1 {
		tooMany = append(tooMany, f(fmt.Sprintf("t%d", i)))
	}
	for name, fs := range map[string][]*tenurev1.FenceRequest{
		"empty":     nil,
		"too many":  tooMany,
		"duplicate": {f("d0"), f("d1"), f("d0")},
	} {
		_, err := n.rc.FenceRanges(ctxT(t), connect.NewRequest(&tenurev1.FenceRangesRequest{Fences: fs}))
		wantCode(t, "FenceRanges("+name+")", err, connect.CodeInvalidArgument)
	}
	st, err := n.rc.GetStatus(ctxT(t), connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{}))
	if err != nil || len(st.Msg.GetRanges()) != 0 {
		t.Errorf("after malformed batches the replica hosts %v (%v), want nothing", st.Msg.GetRanges(), err)
	}
}
