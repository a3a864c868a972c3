package replica_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// inconsistentLeader is a peer that answers every fetch with a divergence
// that leaves the follower nothing to cut: "your epoch ends exactly at your
// log end, yet you diverge". No correct leader says that to a consistent
// follower (see follower.apply), so it stands for the states that produce
// it: a leader, or a follower, whose history and records disagree. A real
// replica cannot be brought into either through its API, hence a peer of
// its own, served over real HTTP/2 on loopback. It has no FetchStream, so
// the follower fetches with unary calls.
type inconsistentLeader struct {
	tenurev1connect.UnimplementedReplicaServiceHandler
	fetches atomic.Int64
}

func (l *inconsistentLeader) Fetch(_ context.Context, req *connect.Request[tenurev1.FetchRequest]) (*connect.Response[tenurev1.FetchResponse], error) {
	l.fetches.Add(1)
	m := req.Msg
	return connect.NewResponse(&tenurev1.FetchResponse{
		Epoch:         m.GetEpoch(),
		HighWaterMark: m.GetFetchOffset(),
		LogEnd:        m.GetFetchOffset(),
		Diverging:     &tenurev1.DivergingEpoch{Epoch: m.GetLastFetchedEpoch(), EndOffset: m.GetFetchOffset()},
	}), nil
}

// A divergence answer that leaves the follower nothing to cut can never be
// satisfied by fetching again (the leader's history below its epoch is
// fixed, and the follower's pair comes from the same store). The follower
// stops the range with the reason, instead of retrying it forever while
// reporting FOLLOWER, and cuts nothing.
func TestDivergenceWithNothingToCutStopsTheRange(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("committed", 3)...)
	c.waitCaughtUp(r1, r2, r3)
	end := c.status(r2).GetLogEnd()

	liar := &inconsistentLeader{}
	path, h := tenurev1connect.NewReplicaServiceHandler(liar, transport.HandlerOptions()...)
	srv, err := transport.Serve("127.0.0.1:0", transport.Registration{Name: tenurev1connect.ReplicaServiceName, Path: path, Handler: h})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })

	c.mustFence(r2, 2)
	_, err = r2.rc.Adopt(ctxT(t), connect.NewRequest(&tenurev1.AdoptRequest{
		RangeId: rangeID, Epoch: 2, Role: tenurev1.Role_ROLE_FOLLOWER,
		LeaderId: "liar", LeaderAddress: srv.URL(),
		Replicas: append(replicas(r2), &tenurev1.Replica{Id: "liar", Address: srv.URL()}),
	}))
	if err != nil {
		t.Fatalf("Adopt(r2, 2, follower of the inconsistent leader) = %v", err)
	}
	waitUntil(t, 10*time.Second, "r2 to stop on the unsatisfiable divergence", func() bool { return r2.r.Halted(rangeID) != nil })
	st := c.status(r2)
	if !strings.Contains(st.GetHalted(), "nothing to cut") {
		t.Fatalf("r2 status halted = %q, want the unsatisfiable divergence named", st.GetHalted())
	}
	if st.GetLogEnd() != end || st.GetHighWaterMark() != end {
		t.Fatalf("r2 log end %d HWM %d after stopping; want %d, %d (nothing cut)", st.GetLogEnd(), st.GetHighWaterMark(), end, end)
	}
	// Stopped means stopped: the question is not asked again. (A fetch in
	// flight when the range stopped is the only one allowed after.)
	n := liar.fetches.Load()
	time.Sleep(300 * time.Millisecond)
	if got := liar.fetches.Load(); got > n+1 {
		t.Fatalf("the stopped follower fetched %d more times", got-n)
	}

	// Fenced, the stopped copy answers its log as it stands and says it is
	// halted, at a new epoch and on a repeat: a promotion must neither make
	// it the candidate nor count it, since it refuses Adopt and Truncate.
	// A serving copy's answer says nothing of the kind.
	for _, f := range []*tenurev1.FenceResponse{c.mustFence(r2, 3), c.mustFence(r2, 3)} {
		if !strings.Contains(f.GetHalted(), "nothing to cut") || strings.Contains(f.GetHalted(), "logstore: ") || f.GetLogEnd() != end || f.GetHighWaterMark() != end {
			t.Fatalf("Fence(r2, 3) = %v; want log end and HWM %d and halted naming the violation", f, end)
		}
	}
	_, err = r2.rc.Adopt(ctxT(t), connect.NewRequest(&tenurev1.AdoptRequest{
		RangeId: rangeID, Epoch: 3, Role: tenurev1.Role_ROLE_LEADER, LeaderId: r2.id, Replicas: replicas(r1, r2, r3),
	}))
	wantCode(t, "Adopt of the stopped copy", err, connect.CodeDataLoss)
	if h := c.mustFence(r3, 3).GetHalted(); h != "" {
		t.Fatalf("Fence(r3, 3) of a serving copy: halted = %q, want empty", h)
	}
}
