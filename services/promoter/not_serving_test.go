package promoter

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/lease"
	"github.com/tenurelog/tenure/services/replica"
)

// notServingTTL is the promoter's session TTL in these tests, and so its
// not-serving bound (notServingAfter); the replicas' keepers use 2 s too.
const notServingTTL = 2 * time.Second

// notServingSeen bounds how long the promoter takes to call a not-serving
// leader's range not-serving: one full status probe (StatusInterval, 1 s),
// plus slack for -race.
const notServingSeen = time.Second + 2*time.Second

// promotionState is the promoter's state of rangeID as its GetStatus
// answers it.
func promotionState(p *Promoter, rangeID string) *tenurev1.RangePromotionState {
	resp, err := (handler{p}).GetStatus(context.Background(), connect.NewRequest(&tenurev1.PromoterServiceGetStatusRequest{}))
	if err != nil {
		return nil
	}
	for _, st := range resp.Msg.GetRanges() {
		if st.GetRangeId() == rangeID {
			return st
		}
	}
	return nil
}

// A leader whose lease went while no promoter watched (the promoter's
// expiry event never came: here none ran when the session ended) leads at
// its epoch and refuses everything; nothing else would ever act. The
// promoter sees the leader report its lease not valid, calls the range
// not-serving (not healthy), and after a TTL binds the lease to the leader
// again; the leader's keeper takes it on its new session and serves. No
// epoch is spent on it.
func TestNotServingLeaderIsRebound(t *testing.T) {
	c := newCluster(t, 3)
	c.createRange("r", "r1")
	ctx := context.Background()
	tr, err := c.newPromoter("p1", false).promote(ctx, "r", 0, "", "initial")
	if err != nil {
		t.Fatal(err)
	}
	leader := tr.GetLeaderId()
	waitFor(t, "the leader's lease to be valid", 10*time.Second, func() bool { return c.status(leader, "r").GetLeaseValid() })

	// etcd ends the leader's session (as when the lease service stood
	// still past its TTL) and the lease with it; the keeper opens another.
	k := c.byID[leader].keeper
	old := k.SessionID()
	if _, err := c.lease.EtcdClient.Revoke(ctx, clientv3.LeaseID(old)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a new session of the leader's keeper", 10*time.Second, func() bool { s := k.SessionID(); return s != 0 && s != old })
	if c.status(leader, "r").GetLeaseValid() {
		t.Fatalf("leader %s calls its lease valid with the lease gone", leader)
	}

	p := c.newPromoter("p2", true, func(cfg *Config) { cfg.SessionTTL = notServingTTL })
	waitFor(t, "the promoter to call the range not-serving", notServingSeen+5*time.Second, func() bool {
		return promotionState(p, "r").GetState() == stateNotServing
	})
	// The rebind comes a TTL after it was first seen, and the keeper takes
	// it at its next renewal (a third of a TTL).
	if err := c.servesWithin("r", "after the rebind", notServingTTL+notServingSeen+time.Second); err != nil {
		t.Fatalf("%v\n%s", err, c.describe(p, "r"))
	}
	st := c.status(leader, "r")
	if st.GetEpoch() != tr.GetEpoch() || st.GetRole() != tenurev1.Role_ROLE_LEADER {
		t.Errorf("leader %s at epoch %d (role %v), want still leading at epoch %d: a rebind needs no promotion", leader, st.GetEpoch(), st.GetRole(), tr.GetEpoch())
	}
	waitFor(t, "the promoter to call the range healthy again", notServingSeen, func() bool {
		return promotionState(p, "r").GetState() == "healthy"
	})
}

// refusingGuard is a fault: a lease guard that never calls the lease of
// one epoch valid, whatever the lease service says. It stands for any
// cause that keeps a leader with a live lease from serving (issue 31's
// keeper was one).
type refusingGuard struct {
	*lease.Keeper
	refused uint64
}

func (g refusingGuard) Valid(rangeID string, epoch uint64) bool {
	return epoch != g.refused && g.Keeper.Valid(rangeID, epoch)
}

// A leader that still does not serve after its lease was bound to it again
// is promoted away: the promotion's new epoch (its adoption starts its
// lease afresh) serves. Meanwhile the range is not-serving, never healthy.
func TestNotServingLeaderIsPromoted(t *testing.T) {
	c := newCluster(t, 3)
	// Whichever replica leads at epoch 1 refuses its lease there (the
	// preferred r1, unless its first fence is late).
	for _, tr := range c.replicas {
		c.stop(tr)
		c.startGuarded(tr, func(k *lease.Keeper) replica.LeaseGuard { return refusingGuard{Keeper: k, refused: 1} })
	}
	c.createRange("r", "r1")
	p := c.newPromoter("p1", true, func(cfg *Config) { cfg.SessionTTL = notServingTTL })

	sawNotServing := false
	healthyWhileRefusing := false
	deadline := time.Now().Add(2*notServingTTL + 2*notServingSeen + 5*time.Second)
	for time.Now().Before(deadline) {
		st := promotionState(p, "r")
		if st.GetEpoch() >= 2 && st.GetState() == "healthy" {
			break
		}
		if st.GetEpoch() == 1 && st.GetLeaderId() != "" {
			sawNotServing = sawNotServing || st.GetState() == stateNotServing
			// The first full status probe after the adoption may not have
			// come yet; after one has, healthy is wrong.
			if st.GetState() == "healthy" && sawNotServing {
				healthyWhileRefusing = true
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !sawNotServing || healthyWhileRefusing {
		t.Errorf("promoter states while the leader refused at epoch 1: saw not-serving %v, healthy after it %v; want not-serving, never healthy", sawNotServing, healthyWhileRefusing)
	}
	if err := c.servesWithin("r", "after the promotion", 10*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, c.describe(p, "r"))
	}
	// An automatic promotion's record is written in the background.
	var trs []*tenurev1.Transition
	var err error
	recorded := func() bool {
		trs, err = p.transitions(context.Background(), "r", 1)
		return err == nil && len(trs) == 1 && trs[0].GetEpoch() >= 2
	}
	for deadline := time.Now().Add(5 * time.Second); !recorded() && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if !recorded() || !strings.Contains(trs[0].GetReason(), "not serving") {
		t.Errorf("last transition = %v, %v; want a promotion at epoch >= 2 for a leader not serving", trs, err)
	}
}

// startGuarded is cluster.start with the replica's lease guard made by
// guard from its keeper.
func (c *cluster) startGuarded(tr *testReplica, guard func(*lease.Keeper) replica.LeaseGuard) {
	c.t.Helper()
	k, err := lease.NewKeeper(c.lease.Client, tr.id, "", lease.WithSessionTTL(2*time.Second), lease.WithKeeperLogger(c.log))
	if err != nil {
		c.t.Fatalf("keeper for %s: %v", tr.id, err)
	}
	var r *replica.Replica
	var srv *transport.Server
	for attempt := 0; attempt < 50; attempt++ {
		cfg := replica.Config{ID: tr.id, DataDir: tr.dir, Logger: c.log, Lease: guard(k), HTTPClient: tr.gate, FetchWait: c.fetchWait}
		r, srv, err = replica.Start(cfg, tr.listen)
		if err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		c.t.Fatalf("start %s: %v", tr.id, err)
	}
	tr.keeper, tr.r, tr.srv, tr.listen = k, r, srv, srv.Addr
}

// observeServing's schedule, step by step: wait a bound, rebind, wait a
// bound after the rebind, promote; serving again, or a new epoch or
// leader, starts over.
func TestObserveServing(t *testing.T) {
	const bound = 2 * time.Second
	t0 := time.Unix(1000, 0)
	rs := &rangeState{epoch: 3, leaderID: "r1", state: "healthy"}
	steps := []struct {
		at      time.Duration
		serving bool
		epoch   uint64 // 0: unchanged
		want    serveAction
		state   string
	}{
		{0, true, 0, serveWait, "healthy"},
		{1 * time.Second, false, 0, serveWait, stateNotServing},
		{2900 * time.Millisecond, false, 0, serveWait, stateNotServing},
		{3 * time.Second, false, 0, serveRebind, stateNotServing},
		{4 * time.Second, false, 0, serveWait, stateNotServing},
		{5 * time.Second, false, 0, servePromote, stateNotServing},
		{6 * time.Second, true, 0, serveWait, "healthy"},
		// Not serving again: the count starts over, rebind first again.
		{7 * time.Second, false, 0, serveWait, stateNotServing},
		{9 * time.Second, false, 0, serveRebind, stateNotServing},
		// A new epoch (a promotion happened) starts over too.
		{10 * time.Second, false, 4, serveWait, stateNotServing},
		{12 * time.Second, false, 0, serveRebind, stateNotServing},
	}
	for i, s := range steps {
		if s.epoch != 0 {
			rs.epoch = s.epoch
		}
		if got := rs.observeServing(s.serving, t0.Add(s.at), bound); got != s.want || rs.state != s.state {
			t.Fatalf("step %d (at %v, serving %v): observeServing = %v, state %q; want %v, %q", i, s.at, s.serving, got, rs.state, s.want, s.state)
		}
	}
	// A range being promoted stays promoting: not-serving says less.
	rs = &rangeState{epoch: 1, leaderID: "r1", state: "promoting"}
	if rs.observeServing(false, t0, bound); rs.state != "promoting" {
		t.Errorf("state = %q after a not-serving probe of a range being promoted, want promoting", rs.state)
	}
}
