package promoter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// A planned handover moves leadership to a named replica (the target) while
// the leader is alive, the way etcd's MoveLeader and Kafka's controlled
// leader change do. The promotion is the ordinary one (DESIGN.md
// "Promotion") with three additions:
//
//  1. Before anything is granted or fenced, and before the range is marked
//     in flight (so the reconcile loop and failovers still act), wait (within
//     Config.HandoverCatchUp) until the leader reports the target fetching
//     and holding every committed record. A target that is down is
//     refused at once; one that is not a follower yet (it does not host
//     the range until the reconcile loop reaches it) or is behind is
//     refused if the bound passes first. Nothing has changed then.
//  2. After the grant, fence every other replica first, then wait (within
//     FenceTimeout) until the target holds the leader's HWM. From the
//     moment they are fenced the leader can commit only with the target's
//     acknowledgement (three replicas) or not at all (more), so its HWM can
//     no longer run ahead of the target: the target stays caught up while
//     appends go on, and the fence of the leader finds it holding every
//     acknowledged record.
//  3. The plan may choose the target although the fenced leader's log is
//     longer (Input.HandoverTo, handoverCandidate): the leader's fenced HWM
//     bounds what was acknowledged, and the tail beyond the target is cut.
//     When that is not sure to be safe the most complete log leads, as in
//     every promotion, and the transition says why (handover_refused).
//
// The fence stops the leader, and a fenced leader answers no fetch (its
// log is frozen, and a follower fetching from it could count toward
// nothing), so the target cannot catch up after it: it must be caught up
// before. A promotion whose target did not lead is retried, at most
// handoverAttempts times (each one an epoch, and the gap of a promotion).

// handoverAttempts bounds the promotions one planned handover runs: each
// that lands elsewhere leaves the range led (by the most complete log), and
// the next one finds the target caught up again. Two misses in a row mean
// something the operator should hear about.
const handoverAttempts = 3

// handoverFetchWaitingMax is how long the target may have been without a
// fetch at the leader and still count as fetching: a follower fetches again
// as soon as it has written an answer, so this stays near 0 for a live one
// (FollowerProgress.fetch_waiting_ms), and a dead one's grows.
const handoverFetchWaitingMax = 500 * time.Millisecond

// handoverPoll is how often the catch-up waits read the leader's status:
// one small GetStatus each, against waits of milliseconds to seconds.
const handoverPoll = 5 * time.Millisecond

// handover is a planned handover's leader and target, once step 1 found
// the target caught up.
type handover struct {
	leader, target *tenurev1.Replica
	epoch          uint64 // the leader's epoch
}

// connectMessage is err's message without its code prefix.
func connectMessage(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}

// refusal is a planned handover's FailedPrecondition, with its detail.
func refusal(rangeID, target, leader string, epoch uint64, promoted bool, format string, args ...any) error {
	why := fmt.Sprintf(format, args...)
	changed := "nothing was changed"
	if promoted {
		changed = "no acknowledged record was lost"
	}
	err := connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("handover of range %s to %s refused: %s; %s", rangeID, target, why, changed))
	if d, derr := connect.NewErrorDetail(&tenurev1.HandoverRefused{
		RangeId: rangeID, TargetId: target, Reason: why, LeaderId: leader, Epoch: epoch, Promoted: promoted,
	}); derr == nil {
		err.AddDetail(d)
	}
	return err
}

// handover runs a planned handover of rangeID to opts.target: promotions
// (at most handoverAttempts) until the target leads, or a refusal naming
// why and who leads. A refusal before the first promotion changed nothing.
func (p *Promoter) handover(ctx context.Context, rangeID string, opts promoteOpts) (*tenurev1.Transition, error) {
	if !p.Elected() {
		return nil, p.notElectedError()
	}
	var tr *tenurev1.Transition
	// busyUntil bounds the waits for another promotion of the range (a
	// failover that moved it during the catch-up wait) to end.
	busyUntil := time.Now().Add(p.cfg.HandoverCatchUp)
	for attempt := 1; attempt <= handoverAttempts; attempt++ {
		var err error
		prev := tr
		// The catch-up wait runs before the promotion takes the range's
		// in-flight mark: held through it, the mark kept the reconcile
		// loop from bringing in the very target being waited for (and
		// would drop a failover's trigger if the leader died meanwhile).
		opts.handover, err = p.awaitTarget(ctx, rangeID, opts.target)
		if err == nil {
			tr, err = p.promoteNow(ctx, rangeID, opts)
		}
		if errors.Is(err, errRunning) && time.Now().Before(busyUntil) {
			// Not an attempt: nothing was done. Measure again once the
			// other promotion ended, from the leader it made.
			tr = prev
			attempt--
			if !sleep(ctx, 20*time.Millisecond) {
				return nil, ctx.Err()
			}
			continue
		}
		if err != nil && prev != nil && connect.CodeOf(err) == connect.CodeFailedPrecondition {
			// Refused before this attempt changed anything, but an
			// earlier one did promote (and kept its leader).
			return tr, refusal(rangeID, opts.target, prev.GetLeaderId(), prev.GetEpoch(), true,
				"%s; the promotion before it, at epoch %d, kept %s leading", connectMessage(err), prev.GetEpoch(), prev.GetLeaderId())
		}
		if err != nil || tr.GetLeaderId() == opts.target {
			return tr, err
		}
		p.log.WarnContext(ctx, "planned handover landed elsewhere; the most complete log leads", "range", rangeID,
			"target", opts.target, "leader", tr.GetLeaderId(), "epoch", tr.GetEpoch(), "attempt", attempt, "why", tr.GetHandoverRefused())
	}
	return tr, refusal(rangeID, opts.target, tr.GetLeaderId(), tr.GetEpoch(), true,
		"after %d promotions %s still leads at epoch %d; the last one said: %s",
		handoverAttempts, tr.GetLeaderId(), tr.GetEpoch(), tr.GetHandoverRefused())
}

// awaitTarget is step 1: it waits, within Config.HandoverCatchUp, for the
// target to hold every committed record, and returns the handover to carry
// out. It returns nil (an ordinary promotion, preferring the target) when
// there is no live leader to hand over from: the plan then takes the most
// complete log, and if that is not the target, the next attempt hands over
// from the leader just made. It returns nil too for a target that is no
// voter, which the promotion refuses (InvalidArgument) before it grants
// anything. A refusal here changed nothing.
func (p *Promoter) awaitTarget(ctx context.Context, rangeID, target string) (_ *handover, err error) {
	ctx, span := tracer.Start(ctx, "handover-catch-up", trace.WithAttributes(
		attribute.String("tenure.range", rangeID), attribute.String("tenure.replica", target)))
	defer func() {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}()
	rng, err := p.getRange(ctx, rangeID)
	if err != nil {
		return nil, err
	}
	leaderID := p.knownLeader(rng)
	h := &handover{leader: member(rng, leaderID), target: member(rng, target), epoch: rng.GetEpoch()}
	if leaderID == "" || leaderID == target || h.leader == nil || h.target == nil || h.target.GetLearner() || rng.GetEpoch() == 0 {
		// No leader known, the target leads already (a forced
		// promotion), or a target that cannot lead: nothing to hand
		// over from, or nothing to hand over to.
		return nil, nil
	}
	refuse := func(format string, args ...any) error {
		return refusal(rangeID, target, leaderID, h.epoch, false, format, args...)
	}
	// The target itself must answer: a dead target is refused at once,
	// not after the catch-up wait. A live one that does not host the range
	// yet (it was unreachable when the range was made, or when it was
	// added) is waited for like a lagging one: the reconcile loop fences
	// and adopts it within a probe interval of reaching it, and it then
	// catches up. Refusing it at once made the operator retry by hand.
	cctx, cancel := context.WithTimeout(ctx, p.cfg.RPCTimeout)
	st, err := p.replicaFor(h.target).GetStatus(cctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: rangeID}))
	cancel()
	notHosted := ""
	switch {
	case connect.CodeOf(err) == connect.CodeNotFound:
		notHosted = fmt.Sprintf("; %s did not host the range when the handover began (%s)", target, connectMessage(err))
	case err != nil:
		return nil, refuse("%s does not answer: %v", target, err)
	case len(st.Msg.GetRanges()) != 1:
		return nil, refuse("%s does not host the range", target)
	case st.Msg.GetRanges()[0].GetHalted() != "":
		return nil, refuse("%s stopped serving the range: %s", target, st.Msg.GetRanges()[0].GetHalted())
	}
	if _, _, err := p.leaderProgress(ctx, rangeID, h); err != nil {
		// The leader does not answer or does not lead: no live leader to
		// hand over from. An ordinary promotion decides.
		p.log.InfoContext(ctx, "planned handover: no live leader to hand over from; promoting the most complete log", "range", rangeID, "target", target, "err", err)
		return nil, nil
	}
	deadline := time.Now().Add(p.cfg.HandoverCatchUp)
	for {
		// The leader's epoch-start record committed: until then its HWM
		// is below records of earlier epochs that may have been
		// acknowledged, and handoverCandidate would ask the target for
		// its whole log.
		committed, why, err := p.leaderCommitted(ctx, rangeID, h.leader, h.epoch)
		if err == nil && committed {
			why, err = p.caughtUp(ctx, rangeID, h, 0)
			if err == nil && why == "" {
				return h, nil
			}
		}
		if err != nil {
			why = err.Error()
		}
		if p.epochMoved(rangeID, h.epoch) {
			// Another promotion (a failover of a leader that died or
			// restarted meanwhile) moved the range on: the leader watched
			// is gone. An ordinary promotion decides, preferring the
			// target, and the next attempt hands over from its leader.
			p.log.InfoContext(ctx, "planned handover: the range moved past the epoch waited at; promoting the most complete log", "range", rangeID, "target", target, "epoch", h.epoch)
			return nil, nil
		}
		if time.Now().After(deadline) {
			return nil, refuse("not caught up within %v: %s%s", p.cfg.HandoverCatchUp, why, notHosted)
		}
		if !sleep(ctx, handoverPoll) {
			return nil, ctx.Err()
		}
	}
}

// epochMoved reports whether this promoter saw rangeID move past epoch
// (its own state, kept by the lease watch and the refresh): no RPC, so the
// catch-up poll can ask every round.
func (p *Promoter) epochMoved(rangeID string, epoch uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	rs := p.ranges[rangeID]
	return rs != nil && rs.epoch > epoch
}

// fenceOthers is step 2: it fences every replica but the leader and the
// target at epoch, then waits (within FenceTimeout) for the target to hold
// the leader's HWM. The fences' answers are not used: the fence round after
// it asks every replica again, and a replica fenced here answers that
// repeat with the same frozen log. Whatever happens here, the promotion
// goes on: the plan decides who may lead.
func (m *promotion) fenceOthers(ctx context.Context, epoch uint64, h *handover) {
	fctx, cancel := context.WithTimeout(ctx, m.p.cfg.FenceTimeout)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	// frozen is the largest log end fenced here: the leader may still
	// count a fetch of theirs that was on its way (at most their log end),
	// and the target must reach what that count can commit.
	var frozen uint64
	for _, r := range m.fence {
		if r.GetId() == h.leader.GetId() || r.GetId() == h.target.GetId() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if a := m.fence1(fctx, r, epoch); a.Err == nil {
				mu.Lock()
				frozen = max(frozen, a.LogEnd)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for {
		why, err := m.p.caughtUp(fctx, m.rangeID, h, frozen)
		if err == nil && why == "" {
			return
		}
		if err != nil {
			why = err.Error()
		}
		if !sleep(fctx, handoverPoll) {
			m.p.log.WarnContext(ctx, "planned handover: target not caught up before the leader's fence; the plan decides", "range", m.rangeID, "target", h.target.GetId(), "why", why)
			return
		}
	}
}

// leaderProgress reads the leader's status of rangeID: it must lead at
// exactly h.epoch. It returns that status and the target's progress there
// (nil when the leader does not count it as a follower).
func (p *Promoter) leaderProgress(ctx context.Context, rangeID string, h *handover) (*tenurev1.RangeStatus, *tenurev1.FollowerProgress, error) {
	cctx, cancel := context.WithTimeout(ctx, p.cfg.RPCTimeout)
	defer cancel()
	st, err := p.replicaFor(h.leader).GetStatus(cctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: rangeID}))
	if err != nil {
		return nil, nil, fmt.Errorf("leader %s does not answer: %w", h.leader.GetId(), err)
	}
	if len(st.Msg.GetRanges()) != 1 {
		return nil, nil, fmt.Errorf("leader %s does not host the range", h.leader.GetId())
	}
	s := st.Msg.GetRanges()[0]
	// Exactly the epoch the handover started from: a leader at another
	// epoch is not the one whose HWM the target is measured against.
	if s.GetRole() != tenurev1.Role_ROLE_LEADER || s.GetEpoch() != h.epoch {
		return nil, nil, fmt.Errorf("%s does not lead at epoch %d (role %s, epoch %d)", h.leader.GetId(), h.epoch, s.GetRole(), s.GetEpoch())
	}
	for _, f := range s.GetFollowers() {
		if f.GetReplicaId() == h.target.GetId() {
			return s, f, nil
		}
	}
	return s, nil, nil
}

// caughtUp says why the target is not caught up with the leader ("" when
// it is): it must be fetching, and its checked fetch offset (what the
// leader counts, so records it holds durably) must reach the leader's HWM
// and also floor (fenceOthers' frozen log ends, bounded by the leader's log
// end, since a diverged tail beyond it is never counted).
func (p *Promoter) caughtUp(ctx context.Context, rangeID string, h *handover, floor uint64) (string, error) {
	s, f, err := p.leaderProgress(ctx, rangeID, h)
	if err != nil {
		return "", err
	}
	if f == nil {
		return fmt.Sprintf("leader %s does not count %s as a follower", h.leader.GetId(), h.target.GetId()), nil
	}
	if f.GetLearner() {
		return fmt.Sprintf("%s is a learner", h.target.GetId()), nil
	}
	if w := time.Duration(f.GetFetchWaitingMs()) * time.Millisecond; w > handoverFetchWaitingMax {
		return fmt.Sprintf("%s has not fetched from leader %s for %v", h.target.GetId(), h.leader.GetId(), w), nil
	}
	need := max(s.GetHighWaterMark(), min(floor, s.GetLogEnd()))
	if f.GetFetchOffset() < need {
		return fmt.Sprintf("%s holds up to %d, %d records short of the committed point %d at leader %s",
			h.target.GetId(), f.GetFetchOffset(), need-f.GetFetchOffset(), need, h.leader.GetId()), nil
	}
	return "", nil
}
