package promoter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenurelog/tenure/internal/fanout"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// massRanges is how many ranges the mass failover spreads over three
// replicas: 1,000 as the issue asks, 200 under the race detector, where one
// process hosting 3,000 range replicas on two cores measures the detector.
func massRanges() int {
	if raceEnabled {
		return 200
	}
	return 1000
}

// Mass failover: a replica leading 1,000 ranges is killed; every range gets
// a new leader, promotions run in parallel with a bounded fan-out, and none
// is lost or done twice.
func TestMassFailover(t *testing.T) {
	c := newClusterWait(t, 3, time.Second)
	ids := make([]string, massRanges())
	for i := range ids {
		ids[i] = fmt.Sprintf("m%04d", i)
		c.createRange(ids[i], "r1")
	}
	// Creating a thousand ranges' journals and state at once is a burst of
	// fsyncs on a two-core box shared with other test packages: give the
	// fence and each RPC room, so the test measures the failover, not
	// timeouts tuned for a quiet machine.
	p := c.newPromoter("p1", true, func(cfg *Config) {
		cfg.FenceTimeout, cfg.RPCTimeout = 10*time.Second, 10*time.Second
	})
	// r1 is preferred, but a promotion proceeds once a quorum has answered
	// (plus a short grace), and r1, hosting every range for the first time
	// like the others, is often the last to answer a burst of a thousand:
	// the first leaders are spread over the replicas. The scenario
	// is a replica leading every range: the one leading the most is made to
	// lead all of them (planned promotions), then killed.
	c.leadAll(p, ids, c.mostLeading(ids))
	victim, victims, before := c.settle(p, ids)
	if len(victims) != len(ids) {
		t.Fatalf("settle chose %s, leading only %d of %d ranges", victim, len(victims), len(ids))
	}

	c.stop(c.byID[victim])
	killed := time.Now()
	c.waitReled(victims, victim)
	t.Logf("mass failover: the %d ranges of the killed leader re-led %v after the kill", len(victims), time.Since(killed))

	// None lost or done twice: every range of the killed leader moved
	// exactly once, to an epoch above the one it had at the kill; every
	// other range did not move.
	if po := c.promotedOnce(p, ids, victims, before); len(po.bad) > 0 {
		t.Errorf("transition records after 60s: %v", po.bad)
	}
}

// promotions is promotedOnce's answer: victims promoted more than once
// after the kill (doubles), victims with no record of a promotion after it
// (missing), other ranges that moved (moved), and a line on each.
type promotions struct {
	doubles, missing, moved int
	// relost counts promotions that displaced a surviving leader, and
	// relostWhy says where (failoverPromotions only).
	relost    int
	bad       []string
	relostWhy []string
}

// promotedOnce checks the transition records after a kill: a victim has
// exactly one promotion after the kill (an attempt that failed for want of
// a quorum under load leaves no record, so its epoch may be more than one
// above), any other range none. A record is written just after its
// adoption, in the background, so a victim still short of one is read
// again, for up to 60 s; a double or a moved range is final at once.
func (c *cluster) promotedOnce(p *Promoter, ids []string, victims ledAt, before map[string]int) promotions {
	c.t.Helper()
	ctx := context.Background()
	var po promotions
	deadline := time.Now().Add(60 * time.Second)
	for {
		po = promotions{}
		for _, id := range ids {
			trs, err := p.transitions(ctx, id, 1)
			if err != nil {
				c.t.Fatal(err)
			}
			n, err := p.countTransitions(ctx, id)
			if err != nil {
				c.t.Fatal(err)
			}
			e, victim := victims[id]
			switch {
			case !victim && n == before[id] && len(trs) == 1:
				continue
			case !victim:
				po.moved++
			case n > before[id]+1:
				po.doubles++
			case n == before[id]+1 && len(trs) == 1 && trs[0].GetEpoch() > e:
				continue
			default:
				po.missing++
			}
			po.bad = append(po.bad, fmt.Sprintf("%s (victim %v): %d records (%d before the kill), latest %v", id, victim, n, before[id], trs))
		}
		if po.missing == 0 || time.Now().After(deadline) {
			return po
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ledAt maps ranges to the epoch they were led at.
type ledAt map[string]uint64

func (l ledAt) has(id string) bool { _, ok := l[id]; return ok }

// settle waits until every range has a leader and a transition record of
// that leader's epoch, and returns the replica leading the most ranges (the
// one to kill), the ranges it leads (with their epochs) and how many
// transition records each range has. A range's first leader may not be at
// epoch 1: a thousand new ranges promoted at once can make a holder's
// keep-alive late and its leases expire, and what is measured is the
// failover after the setup, not the setup. For the same reason the leaders
// are read again whenever a record does not match yet: a range the
// promoter moved meanwhile has a new leader, and waiting for the record of
// the old one would wait forever.
func (c *cluster) settle(p *Promoter, ids []string) (string, ledAt, map[string]int) {
	c.t.Helper()
	return c.settleOn(p, ids, "")
}

// settleOn is settle with the replica to kill chosen by the caller (""
// chooses the one leading the most).
func (c *cluster) settleOn(p *Promoter, ids []string, victim string) (string, ledAt, map[string]int) {
	c.t.Helper()
	var killed string
	var victims ledAt
	var before map[string]int
	ctx := context.Background()
	// why says what the last poll was waiting for, for the failure message.
	var why string
	settled := func() bool {
		all, by := c.leaders()
		if len(all) != len(ids) {
			var missing []string
			for _, id := range ids {
				if !all.has(id) {
					missing = append(missing, id)
				}
			}
			why = fmt.Sprintf("%d ranges without a leader: %v", len(missing), missing[:min(len(missing), 10)])
			return false
		}
		before = map[string]int{}
		for _, id := range ids {
			// Records are written after the adoption, in the background:
			// wait for the one of the current leader's epoch.
			trs, err := p.transitions(ctx, id, 1)
			if err != nil || len(trs) != 1 || trs[0].GetEpoch() != all[id] {
				why = fmt.Sprintf("range %s led by %s at epoch %d; latest transition record %v (err %v); promoter's view %v",
					id, by[id], all[id], trs, err, p.rangeStatus(id))
				return false
			}
			n, err := p.countTransitions(ctx, id)
			if err != nil {
				return false
			}
			before[id] = n
		}
		count := map[string]int{}
		killed = victim
		for _, id := range by {
			count[id]++
			if victim == "" && (killed == "" || count[id] > count[killed]) {
				killed = id
			}
		}
		victims = ledAt{}
		for r, id := range by {
			if id == killed {
				victims[r] = all[r]
			}
		}
		return true
	}
	deadline := time.Now().Add(180 * time.Second)
	for !settled() {
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out after 3m waiting for every range to have a leader and that leader's transition record: %s", why)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return killed, victims, before
}

// leaders maps each range some replica leads to its leader's epoch and id.
// A deposed leader that was never fenced (it did not answer in time) still
// reports leading at its old epoch until the reconcile loop reaches it: the
// leader is the one at the highest epoch.
func (c *cluster) leaders() (ledAt, map[string]string) {
	all, by := ledAt{}, map[string]string{}
	for _, tr := range c.replicas {
		for r, e := range c.leading(tr.id) {
			if e > all[r] {
				all[r], by[r] = e, tr.id
			}
		}
	}
	return all, by
}

// mostLeading waits until every range has a leader and returns the replica
// leading the most of them.
func (c *cluster) mostLeading(ids []string) string {
	c.t.Helper()
	var most string
	waitFor(c.t, "every range to have a leader", 180*time.Second, func() bool {
		all, by := c.leaders()
		if len(all) != len(ids) {
			return false
		}
		count := map[string]int{}
		for _, id := range by {
			count[id]++
			if most == "" || count[id] > count[most] {
				most = id
			}
		}
		return true
	})
	return most
}

// leadAll makes replica id the leader of every range in ids, by planned
// Promote with id preferred for each range it does not lead yet, and waits
// until it leads all of them (settle then waits for their records). The
// issue's mass failover kills a replica leading 1,000 ranges; the setup's
// first promotions spread leadership over whichever replicas answered the
// fence first, so without this the benchmark measured 500-860 victims.
func (c *cluster) leadAll(p *Promoter, ids []string, id string) {
	c.t.Helper()
	c.leadEach(p, ids, func(string) string { return id })
}

// leadEach makes want(r) the leader of each range r in ids, as leadAll
// does for one replica: the loaded mass failover spreads leadership evenly
// (its victim leads a third) instead of trusting the setup's first
// promotions to.
//
// A planned promotion prefers the wanted replica only among the replicas
// that answered the fence in time (a quorum plus a short grace): under a
// burst it may answer late and another replica win, so ranges still not
// led by their wanted replica are promoted again, a bounded number at a
// time, until each is.
func (c *cluster) leadEach(p *Promoter, ids []string, want func(rangeID string) string) {
	c.t.Helper()
	waitFor(c.t, "the promoter to be elected", 10*time.Second, p.Elected)
	ctx := context.Background()
	deadline := time.Now().Add(180 * time.Second)
	for round := 1; ; round++ {
		all, by := c.leaders()
		var todo []string
		for _, r := range ids {
			if by[r] != want(r) {
				todo = append(todo, r)
				continue
			}
			// Led as wanted, but with no record of that epoch: a
			// promotion interrupted after its adoption (the promoter
			// stepped down under the setup's load, cancelling it) leaves
			// its leader serving and nothing recorded, and settle waits
			// for that record. Promote it again, to the same replica,
			// which records.
			if trs, err := p.transitions(ctx, r, 1); err != nil || len(trs) != 1 || trs[0].GetEpoch() != all[r] {
				todo = append(todo, r)
			}
		}
		if len(todo) == 0 {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("after %d rounds %d of %d ranges are still not led by the replica wanted with a record of their epoch, e.g. %s (wanted %s): %s",
				round, len(todo), len(ids), todo[0], want(todo[0]), p.rangeStatus(todo[0]))
		}
		// 128 at a time: one full batch per server and kind, so a round
		// moves quickly without making the wanted replica the straggler
		// of a huge burst.
		fanout.Run(len(todo), 128, func(i int) {
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			// Errors (a promotion of the range already running, a lost
			// race with the setup's own promotions) are retried by the
			// next round, which re-reads who leads.
			_, _ = p.Promote(ctx, todo[i], want(todo[i]), "test setup: leadership placed for the mass failover")
		})
	}
}

// rangeStatus is the promoter's view of rangeID, for failure messages.
func (p *Promoter) rangeStatus(rangeID string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	rs := p.ranges[rangeID]
	if rs == nil {
		return "unknown"
	}
	return fmt.Sprintf("%v (in flight %v)", rs.status(rangeID), p.inflight[rangeID])
}

// countTransitions is how many transition records rangeID has.
func (p *Promoter) countTransitions(ctx context.Context, rangeID string) (int, error) {
	resp, err := p.cfg.Etcd.Get(ctx, fmt.Sprintf("%stransitions/%s/", p.cfg.Prefix, rangeID), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return int(resp.Count), nil
}

// leading maps each range replica id leads to the epoch it leads at.
func (c *cluster) leading(id string) map[string]uint64 {
	tr := c.byID[id]
	led := map[string]uint64{}
	if tr.srv == nil {
		return led
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.replicaClient(tr.srv.URL()).GetStatus(ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{}))
	if err != nil {
		return led
	}
	for _, st := range resp.Msg.GetRanges() {
		if st.GetRole() == tenurev1.Role_ROLE_LEADER {
			led[st.GetRangeId()] = st.GetEpoch()
		}
	}
	return led
}

// waitReled waits until every range in victims is led, at an epoch above
// the one it had at the kill, by a replica other than the killed one.
//
// It polls every 200ms, not waitFor's 20ms: each poll is a full GetStatus of
// every surviving replica (a thousand ranges each), and polling at 50 Hz
// was itself a large share of the CPU the failover it measured had to share.
// How long the failover took is read from the transition records
// (massBreakdown), not from when this poll happened to notice.
func (c *cluster) waitReled(victims ledAt, killed string) {
	c.t.Helper()
	c.waitReledWithin(victims, killed, 120*time.Second)
}

// waitReledWithin is waitReled, failing the test after within.
func (c *cluster) waitReledWithin(victims ledAt, killed string, within time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for {
		n := 0
		for _, tr := range c.replicas {
			if tr.id == killed {
				continue
			}
			for r, e := range c.leading(tr.id) {
				if e0, ok := victims[r]; ok && e > e0 {
					n++
				}
			}
		}
		if n == len(victims) {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("after %v only %d of the killed replica's %d ranges have a new leader", within, n, len(victims))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
