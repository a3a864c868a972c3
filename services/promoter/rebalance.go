package promoter

import (
	"context"
	"slices"
	"strings"
	"time"
)

// Leader rebalancing: a failover moves a range's leadership to whichever
// survivor is most complete, and nothing moves it back when the preferred
// replica returns, so after a few failovers one replica leads most ranges
// (and takes most of the append traffic) while another leads none. Like
// Kafka's auto.leader.rebalance.enable, the elected promoter looks, every
// RebalanceInterval, for ranges whose preferred replica (the range's
// preferred_replica_id, set at CreateRange) is a healthy, caught-up voter
// that does not lead, and moves at most RebalanceMax of them back with a
// planned handover (handover.go): no acknowledged record is lost, and each
// move costs its range a planned handover's gap.

// rebalanceBackoff is how many intervals the rebalancer leaves a range
// alone after a move of it failed: a handover that was refused or landed
// elsewhere may have spent epochs, and trying every round would spend them
// every round for as long as the cause lasts.
const rebalanceBackoff = 10

// rebalanceLoop runs rebalance rounds while this promoter is elected (it
// is one of campaign's loops), unless Config.NoRebalance.
func (p *Promoter) rebalanceLoop(ctx context.Context) {
	if p.cfg.NoRebalance {
		return
	}
	for sleep(ctx, p.cfg.RebalanceInterval) {
		p.rebalance(ctx)
	}
}

// rebalanceCandidate is a range led elsewhere than its preferred replica.
type rebalanceCandidate struct {
	rangeID   string
	h         *handover
	preferred string
}

// rebalanceCandidates lists, sorted by range id, the ranges a rebalance
// round may move at now: healthy, led at a known epoch by a replica that
// is not their preferred one, the preferred one a voter whose address does
// not refuse connections, no promotion or membership change of the range
// running, and no leader change within the last RebalanceInterval (a range
// just failed over is left to settle, and one just moved is not moved
// again: a preferred replica that fails repeatedly does not drag its
// ranges back and forth faster than once an interval).
func (p *Promoter) rebalanceCandidates(now time.Time) []rebalanceCandidate {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []rebalanceCandidate
	for id, rs := range p.ranges {
		pref := rs.member(rs.preferred)
		leader := rs.member(rs.leaderID)
		switch {
		case pref == nil || leader == nil || pref.GetLearner() || rs.preferred == rs.leaderID:
			continue
		case rs.state != "healthy" || rs.change != nil || rs.epoch == 0:
			continue
		case p.inflight[id] || p.inflight[membershipKey(id)]:
			continue
		case now.Sub(rs.changed) < p.cfg.RebalanceInterval:
			continue
		case now.Sub(rs.rebalanceFailed) < rebalanceBackoff*p.cfg.RebalanceInterval:
			continue
		}
		if ps := p.probes[pref.GetAddress()]; ps != nil && (ps.refused || ps.misses > 0) {
			continue
		}
		out = append(out, rebalanceCandidate{rangeID: id, preferred: rs.preferred,
			h: &handover{leader: leader, target: pref, epoch: rs.epoch}})
	}
	slices.SortFunc(out, func(a, b rebalanceCandidate) int { return strings.Compare(a.rangeID, b.rangeID) })
	return out
}

// rebalance runs one round: up to RebalanceMax planned handovers, one at a
// time, of candidates whose preferred replica the leader reports caught up
// right now. One that is not is skipped without waiting (the next round
// looks again), so a round never spends a handover's catch-up bound on a
// replica that is still far behind.
func (p *Promoter) rebalance(ctx context.Context) {
	// tried counts handovers started, failed ones too: RebalanceMax bounds
	// a round's work (and the epochs it may spend), not only its successes.
	tried := 0
	for _, c := range p.rebalanceCandidates(time.Now()) {
		if tried >= p.cfg.RebalanceMax || ctx.Err() != nil || !p.Elected() {
			return
		}
		if why, err := p.caughtUp(ctx, c.rangeID, c.h, 0); err != nil || why != "" {
			if err != nil {
				why = err.Error()
			}
			p.log.DebugContext(ctx, "rebalance: preferred replica not caught up; not moving", "range", c.rangeID, "preferred", c.preferred, "why", why)
			continue
		}
		tried++
		start := time.Now()
		tr, err := p.handover(ctx, c.rangeID, promoteOpts{
			preferred: c.preferred, target: c.preferred, waitRecord: true,
			reason: "rebalance: preferred replica " + c.preferred + " is healthy and caught up",
		})
		if err != nil {
			p.mu.Lock()
			if rs := p.ranges[c.rangeID]; rs != nil {
				rs.rebalanceFailed = time.Now()
			}
			p.mu.Unlock()
			p.log.WarnContext(ctx, "rebalance: leadership not moved; leaving the range alone for a while", "range", c.rangeID,
				"from", c.h.leader.GetId(), "to", c.preferred, "retry_in", rebalanceBackoff*p.cfg.RebalanceInterval, "err", err)
			continue
		}
		p.log.InfoContext(ctx, "rebalanced: leadership moved back to the preferred replica", "range", c.rangeID,
			"from", c.h.leader.GetId(), "to", tr.GetLeaderId(), "epoch", tr.GetEpoch(), "took", time.Since(start), "trace_id", tr.GetTraceId())
	}
}
