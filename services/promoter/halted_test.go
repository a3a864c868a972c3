package promoter

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// inconsistentLeader is a peer that answers every fetch with a divergence
// that leaves the follower nothing to cut. No correct leader says that to a
// consistent follower, so the follower stops its copy of the range for a
// safety violation (the replica's follower.go; the replica package's
// TestDivergenceWithNothingToCutStopsTheRange): the real halt path, reached
// without a bug in a real replica, which no API can put one into.
type inconsistentLeader struct {
	tenurev1connect.UnimplementedReplicaServiceHandler
}

func (inconsistentLeader) Fetch(_ context.Context, req *connect.Request[tenurev1.FetchRequest]) (*connect.Response[tenurev1.FetchResponse], error) {
	m := req.Msg
	return connect.NewResponse(&tenurev1.FetchResponse{
		Epoch:         m.GetEpoch(),
		HighWaterMark: m.GetFetchOffset(),
		LogEnd:        m.GetFetchOffset(),
		Diverging:     &tenurev1.DivergingEpoch{Epoch: m.GetLastFetchedEpoch(), EndOffset: m.GetFetchOffset()},
	}), nil
}

// haltBySafety stops replica id's copy of rangeID for a safety violation:
// fenced at epoch (above the range's, which no promotion reached) and
// adopted as a follower of an inconsistentLeader. Its log stays as it was.
// The returned function stops the inconsistent leader (a restarted replica
// would follow it again, and halt again).
func (c *cluster) haltBySafety(id, rangeID string, epoch uint64) (stop func()) {
	c.t.Helper()
	path, h := tenurev1connect.NewReplicaServiceHandler(inconsistentLeader{}, transport.HandlerOptions()...)
	srv, err := transport.Serve("127.0.0.1:0", transport.Registration{Name: tenurev1connect.ReplicaServiceName, Path: path, Handler: h})
	if err != nil {
		c.t.Fatal(err)
	}
	stop = sync.OnceFunc(func() { _ = srv.Close() })
	c.t.Cleanup(stop)
	tr := c.byID[id]
	rc := c.replicaClient(tr.srv.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := rc.Fence(ctx, connect.NewRequest(&tenurev1.FenceRequest{RangeId: rangeID, Epoch: epoch, FencerId: "test"})); err != nil {
		c.t.Fatalf("fence %s at %d: %v", id, epoch, err)
	}
	if _, err := rc.Adopt(ctx, connect.NewRequest(&tenurev1.AdoptRequest{
		RangeId: rangeID, Epoch: epoch, Role: tenurev1.Role_ROLE_FOLLOWER,
		LeaderId: "liar", LeaderAddress: srv.URL(),
		Replicas: []*tenurev1.Replica{{Id: id, Address: transport.Scheme() + "://" + tr.listen}, {Id: "liar", Address: srv.URL()}},
	})); err != nil {
		c.t.Fatalf("adopt %s as a follower of the inconsistent leader: %v", id, err)
	}
	waitFor(c.t, id+" to stop "+rangeID+" on the safety violation", 10*time.Second, func() bool {
		return strings.Contains(c.status(id, rangeID).GetHalted(), "nothing to cut")
	})
	return stop
}

// caughtUp waits until every running replica but skip holds rangeID's
// leader's log end and HWM.
func (c *cluster) caughtUp(rangeID, leader string, skip ...string) {
	c.t.Helper()
	waitFor(c.t, "the followers of "+rangeID+" to catch up", 10*time.Second, func() bool {
		l := c.status(leader, rangeID)
		if l == nil {
			return false
		}
		for _, tr := range c.replicas {
			if tr.id == leader || tr.srv == nil || strings.Contains(strings.Join(skip, " "), tr.id) {
				continue
			}
			if f := c.status(tr.id, rangeID); f == nil || f.GetLogEnd() != l.GetLogEnd() || f.GetHighWaterMark() != l.GetHighWaterMark() {
				return false
			}
		}
		return true
	})
}

// leaderBy is leader, with what every replica, the lease service and p
// think of rangeID in the failure message.
func (c *cluster) leaderBy(p *Promoter, rangeID string, minEpoch uint64, within time.Duration) (string, uint64) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		for _, tr := range c.replicas {
			if st := c.status(tr.id, rangeID); st.GetRole() == tenurev1.Role_ROLE_LEADER && st.GetEpoch() >= minEpoch && st.GetEpoch() == st.GetFencedEpoch() {
				return tr.id, st.GetEpoch()
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("no leader of %s at epoch >= %d within %v\n%s", rangeID, minEpoch, within, c.describe(p, rangeID))
	return "", 0
}

// checkHaltedRecord checks rangeID's transition record of epoch: id was
// fenced, not counted, not truncated, and the record says it had halted
// and why it was not adopted.
func (c *cluster) checkHaltedRecord(p *Promoter, rangeID string, epoch uint64, id string) {
	c.t.Helper()
	var tr *tenurev1.Transition
	waitFor(c.t, "the transition record of epoch "+fmt.Sprint(epoch), 10*time.Second, func() bool {
		trs, err := p.transitions(context.Background(), rangeID, 5)
		if err != nil {
			return false
		}
		for _, x := range trs {
			if x.GetEpoch() == epoch {
				tr = x
				return true
			}
		}
		return false
	})
	f := fencedReplica(tr, id)
	if f == nil || !f.GetFenced() || f.GetCounted() || !strings.Contains(f.GetHalted(), "nothing to cut") || !strings.Contains(f.GetError(), "not truncated, not adopted") {
		c.t.Fatalf("%s in the transition record: %v; want fenced, not counted, halted with the violation, the error saying it was not adopted", id, f)
	}
	for _, x := range tr.GetTruncations() {
		if x.GetReplicaId() == id {
			c.t.Fatalf("the promotion truncated the halted %s: %v", id, x)
		}
	}
}

// waitForHalted has a promoter wait for every fence answer (a dead
// replica's refusal comes at once): the halted copy's answer is always in,
// as it is in a promotion that is not racing its grace, so the test never
// passes because the halted copy happened to answer late.
func waitForHalted(cfg *Config) { cfg.FenceTimeout, cfg.FenceGrace = 5*time.Second, 5*time.Second }

// A copy of a range stopped by a safety violation still answers fences
// with its whole log (it may hold the only copy of committed records, so
// its facts are not hidden), but it refuses Truncate and Adopt until its
// replica restarts. Five replicas; r1 leads; r3's copy halts; r1 dies.
// r2, r4 and r5 are a fenced quorum on their own. Before, the promotion
// picked r3 whenever it was the most complete log or the preferred replica
// on a tie, had its Adopt refused, and retried at a new epoch forever: the
// range stayed leaderless until someone restarted r3. Now a halted copy is
// never the candidate and never counts toward the quorum; the others are
// promoted, r3 is left fenced and named in the transition record, and no
// acknowledged record is lost.
func TestHaltedCopyIsNotPromoted(t *testing.T) {
	for _, tc := range []struct {
		name string
		// preferred is the range's preferred replica.
		preferred string
		// tail: r3 alone holds an uncommitted tail, so it is the most
		// complete log; otherwise every log is equal and r3 wins the tie
		// as the preferred replica.
		tail bool
	}{
		{name: "preferred on a tie", preferred: "r3"},
		{name: "most complete log", tail: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 5)
			c.createRange("h", tc.preferred)
			ctx := context.Background()
			// r1 leads first, whatever the range prefers (named, so preferred).
			if _, err := c.newPromoter("p0", false).promote(ctx, "h", 0, "r1", "initial"); err != nil {
				t.Fatal(err)
			}
			var acks []acked
			for i := range 5 {
				a, err := c.appendOne("h", fmt.Sprintf("acked-%d", i), 10*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				acks = append(acks, a)
			}
			c.caughtUp("h", "r1")
			committed := c.status("r1", "h").GetHighWaterMark()
			if tc.tail {
				// Only r3 fetches: r1's next append reaches r3 and commits
				// nowhere (it needs three of five).
				for _, id := range []string{"r2", "r4", "r5"} {
					c.byID[id].gate.Close()
				}
				time.Sleep(3 * c.fetchWait)
				actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				_, err := c.log_(c.byID["r1"].srv.URL()).Append(actx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: "h", Records: [][]byte{[]byte("tail")}}))
				cancel()
				if err == nil {
					t.Fatal("an append only r3 fetched was acknowledged")
				}
				waitFor(t, "r3 to hold the tail", 10*time.Second, func() bool { return c.logEnd("r3", "h") == committed+1 })
			}
			// Epoch 2, above the range's 1: the failover's grant is 2 too,
			// and r3 answers its fence as a repeat.
			c.haltBySafety("r3", "h", 2)
			h3 := c.status("r3", "h")

			p := c.newPromoter("p1", true, waitForHalted)
			waitFor(t, "the promoter to see r1 lead", 10*time.Second, func() bool { return promotionOf(p, "h").GetLeaderId() == "r1" })
			c.stop(c.byID["r1"])
			for _, id := range []string{"r2", "r4", "r5"} {
				c.byID[id].gate.Open()
			}
			leader, epoch := c.leaderBy(p, "h", 2, 15*time.Second)
			if leader == "r1" || leader == "r3" {
				t.Fatalf("leader after r1 died = %s", leader)
			}
			a, err := c.appendOne("h", "after", 10*time.Second)
			if err != nil {
				t.Fatalf("%v\n%s", err, c.describe(p, "h"))
			}
			c.checkAcked("h", append(acks, a))

			// r3 was fenced, not counted, not truncated, not adopted: its
			// copy is as it stopped, and the record says why.
			if st := c.status("r3", "h"); st.GetLogEnd() != h3.GetLogEnd() || st.GetHighWaterMark() != h3.GetHighWaterMark() || st.GetHalted() == "" {
				t.Fatalf("r3 after the promotion: %v; want its copy as it stopped (%v)", st, h3)
			}
			c.checkHaltedRecord(p, "h", epoch, "r3")
		})
	}
}

// A halted copy that is not the candidate but holds a tail the candidate
// lacks (above its HWM: a deposed leader's uncommitted records) would be
// truncated by the plan, and a halted copy refuses Truncate. Before, the
// promotion failed after its fence and retried at a new epoch with the same
// plan, forever. Now a halted copy is never truncated: it stays fenced with
// its tail, which the fetch check cuts once its replica restarts and
// follows.
func TestHaltedCopyIsNotTruncated(t *testing.T) {
	c := newCluster(t, 5)
	c.createRange("h", "")
	ctx := context.Background()
	p0 := c.newPromoter("p0", false)
	if _, err := p0.promote(ctx, "h", 0, "r1", "initial"); err != nil {
		t.Fatal(err)
	}
	var acks []acked
	for i := range 5 {
		a, err := c.appendOne("h", fmt.Sprintf("acked-%d", i), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		acks = append(acks, a)
	}
	c.caughtUp("h", "r1")
	committed := c.status("r1", "h").GetHighWaterMark()
	// r1's next append reaches r3 alone and commits nowhere.
	for _, id := range []string{"r2", "r4", "r5"} {
		c.byID[id].gate.Close()
	}
	time.Sleep(3 * c.fetchWait)
	actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := c.log_(c.byID["r1"].srv.URL()).Append(actx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: "h", Records: [][]byte{[]byte("tail")}}))
	cancel()
	if err == nil {
		t.Fatal("an append only r3 fetched was acknowledged")
	}
	waitFor(t, "r3 to hold the tail", 10*time.Second, func() bool { return c.logEnd("r3", "h") == committed+1 })

	// r1 and r3 stop; epoch 2 is led from r2, r4 and r5, which lack the tail.
	c.stop(c.byID["r1"])
	c.stop(c.byID["r3"])
	for _, id := range []string{"r2", "r4", "r5"} {
		c.byID[id].gate.Open()
	}
	tr2, err := p0.promote(ctx, "h", -1, "", "test: epoch 2 without r1 and r3")
	if err != nil {
		t.Fatal(err)
	}
	a, err := c.appendOne("h", "epoch2", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	acks = append(acks, a)
	// r3 comes back and follows the dead r1 (its fetches are refused), so it
	// keeps the tail; it halts at epoch 3, above the range's.
	c.start(c.byID["r3"])
	stopLiar := c.haltBySafety("r3", "h", 3)
	h3 := c.status("r3", "h")
	if h3.GetLogEnd() != committed+1 || h3.GetHighWaterMark() != committed {
		t.Fatalf("r3 halted with %v; want the tail at %d beyond its HWM %d", h3, committed, committed)
	}
	// r1 comes back; the promoter's reconcile loop makes it a follower of
	// epoch 2's leader, whose fetch check cuts its copy of the tail.
	c.start(c.byID["r1"])
	p := c.newPromoter("p1", true, waitForHalted)
	c.caughtUp("h", tr2.GetLeaderId(), "r3")

	// Epoch 2's leader dies: r1 and the other two are a fenced quorum, and
	// the candidate is one of them, ahead of r3 by epoch; the plan would
	// cut r3's tail back to the committed end.
	c.stop(c.byID[tr2.GetLeaderId()])
	leader, epoch := c.leaderBy(p, "h", 3, 15*time.Second)
	if leader == "r3" || leader == tr2.GetLeaderId() {
		t.Fatalf("leader after %s died = %s", tr2.GetLeaderId(), leader)
	}
	a, err = c.appendOne("h", "after", 10*time.Second)
	if err != nil {
		t.Fatalf("%v\n%s", err, c.describe(p, "h"))
	}
	acks = append(acks, a)
	c.checkAcked("h", acks)
	if st := c.status("r3", "h"); st.GetLogEnd() != h3.GetLogEnd() || st.GetHalted() == "" {
		t.Fatalf("r3 after the promotion at %d: %v; want its copy as it stopped (%v)", epoch, st, h3)
	}
	c.checkHaltedRecord(p, "h", epoch, "r3")

	// Restarted, r3 is no longer halted: the next promotion counts it and
	// adopts it as a follower, and the fetch check cuts the tail.
	stopLiar()
	c.stop(c.byID["r3"])
	c.start(c.byID["r3"])
	trNext, err := p.promote(ctx, "h", -1, "", "test: r3 restarted")
	if err != nil {
		t.Fatalf("promotion with r3 restarted: %v\n%s", err, c.describe(p, "h"))
	}
	if f := fencedReplica(trNext, "r3"); f == nil || !f.GetCounted() || f.GetHalted() != "" {
		t.Fatalf("restarted r3 in the transition record: %v; want counted, not halted", f)
	}
	leader = trNext.GetLeaderId()
	c.caughtUp("h", leader)
	// Same log end, HWM and history as the leader: epoch 2 starts at the
	// committed end on both, so r3's epoch-1 tail there is gone.
	if got, want := fmt.Sprint(c.history("r3", "h")), fmt.Sprint(c.history(leader, "h")); got != want {
		t.Fatalf("r3's history after it rejoined = %s, want the leader's %s", got, want)
	}
}

// Three replicas; r3's copy halts and r1 dies. r2 alone is no quorum, and
// a halted copy never counts: the range waits, and the promoter's status
// says why (before, r3 led as the preferred replica with its Adopt refused
// at every epoch, or r2 led with a follower that never fetched, which could
// commit nothing). Once r3's replica restarts, the next retry counts it and
// the range is served, with nothing acknowledged lost.
func TestHaltedCopyNeededForQuorum(t *testing.T) {
	c := newCluster(t, 3)
	c.createRange("h", "r3")
	ctx := context.Background()
	if _, err := c.newPromoter("p0", false).promote(ctx, "h", 0, "r1", "initial"); err != nil {
		t.Fatal(err)
	}
	var acks []acked
	for i := range 5 {
		a, err := c.appendOne("h", fmt.Sprintf("acked-%d", i), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		acks = append(acks, a)
	}
	c.caughtUp("h", "r1")
	stopLiar := c.haltBySafety("r3", "h", 2)
	p := c.newPromoter("p1", true, waitForHalted)
	waitFor(t, "the promoter to see r1 lead", 10*time.Second, func() bool { return promotionOf(p, "h").GetLeaderId() == "r1" })
	c.stop(c.byID["r1"])

	waitFor(t, "the promoter to say the halted r3 leaves no quorum", 10*time.Second, func() bool {
		st := promotionOf(p, "h")
		return st.GetState() == "unavailable" && strings.Contains(st.GetLastError(), "no quorum") &&
			strings.Contains(st.GetLastError(), "r3 fenced, stopped serving (safety violation")
	})
	for _, id := range []string{"r2", "r3"} {
		if st := c.status(id, "h"); st.GetRole() == tenurev1.Role_ROLE_LEADER {
			t.Fatalf("%s leads without a quorum that can serve: %v", id, st)
		}
	}

	stopLiar()
	c.stop(c.byID["r3"])
	c.start(c.byID["r3"])
	leader, _ := c.leaderBy(p, "h", 2, 20*time.Second)
	if leader == "r1" {
		t.Fatalf("leader = %s, the dead replica", leader)
	}
	a, err := c.appendOne("h", "after", 10*time.Second)
	if err != nil {
		t.Fatalf("%v\n%s", err, c.describe(p, "h"))
	}
	c.checkAcked("h", append(acks, a))
}
