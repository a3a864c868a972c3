package replica_test

import (
	"strings"
	"testing"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// TestStartRefusesAnotherReplicasDirectory swaps two stopped replicas'
// data directories (a mixed-up --data-dir or volume) and checks that each
// refuses to start on the other's, naming the owner, and that each starts
// again on its own with its range. Before, both started: every fence then
// named the member's incarnation, which the swapped directory did not
// carry, so status called both copies "lost" (disk replaced or wiped) and
// the advised rebuild would have discarded two intact copies.
func TestStartRefusesAnotherReplicasDirectory(t *testing.T) {
	c := newCluster(t, 2)
	r1, r2 := c.node(1), c.node(2)
	// A promotion at epoch 1: both fenced with their recorded
	// incarnations, r1 adopted as leader, r2 as follower, the replica set
	// carrying each member's incarnation as the promoter's does.
	set := []*tenurev1.Replica{
		{Id: r1.id, Address: r1.url, Incarnation: r1.r.Incarnation()},
		{Id: r2.id, Address: r2.url, Incarnation: r2.r.Incarnation()},
	}
	for _, n := range []*node{r1, r2} {
		if _, err := n.rc.Fence(ctxT(t), connect.NewRequest(&tenurev1.FenceRequest{RangeId: rangeID, Epoch: 1, FencerId: "driver", Incarnation: n.r.Incarnation()})); err != nil {
			t.Fatalf("Fence(%s) = %v", n.id, err)
		}
	}
	for _, n := range []*node{r1, r2} {
		role := tenurev1.Role_ROLE_FOLLOWER
		if n == r1 {
			role = tenurev1.Role_ROLE_LEADER
		}
		if _, err := n.rc.Adopt(ctxT(t), connect.NewRequest(&tenurev1.AdoptRequest{RangeId: rangeID, Epoch: 1, Role: role,
			LeaderId: r1.id, LeaderAddress: r1.url, Replicas: set})); err != nil {
			t.Fatalf("Adopt(%s) = %v", n.id, err)
		}
	}
	c.mustAppend(r1, []byte("acknowledged"))
	c.stop(r1)
	c.stop(r2)

	dir1, dir2 := r1.dir, r2.dir
	r1.dir, r2.dir = dir2, dir1
	for _, tc := range []struct {
		n          *node
		owner, dir string
	}{{r1, r2.id, dir2}, {r2, r1.id, dir1}} {
		err := c.tryStart(tc.n)
		if err == nil {
			t.Fatalf("%s started on %s's directory %s", tc.n.id, tc.owner, tc.dir)
		}
		for _, want := range []string{"belongs to replica " + tc.owner + ", not " + tc.n.id, tc.dir, "Start " + tc.owner + " on it"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s on %s's directory: %q does not say %q", tc.n.id, tc.owner, err, want)
			}
		}
	}

	r1.dir, r2.dir = dir1, dir2
	c.start(r1)
	c.start(r2)
	for _, n := range []*node{r1, r2} {
		if st := c.status(n); st.GetFencedEpoch() != 1 {
			t.Fatalf("%s on its own directory: fenced epoch %d, want 1", n.id, st.GetFencedEpoch())
		}
	}
}
