package promoter

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// This file is the promoter's side of membership (issue 24): one
// single-replica step at a time, each through a promotion of its own.
//
//   - A step starts only while no other is in flight and only once the
//     current leader's own epoch-start record is committed. Before that, the
//     leader's epoch may still be undone by a promotion that counts the old
//     set (the single-server-change bug of Raft, 2015): the step must not
//     build on a leadership that is not yet the range's.
//   - The lease service records the step with the voter set before it
//     (RangeInfo.change). Until it is completed, every promotion needs a
//     fenced quorum of the old AND of the new voters, so no acknowledged
//     record can fall between them, whether the step's own promotion
//     succeeds or fails.
//   - The step's promotion (a traced, recorded transition naming the step)
//     puts the new set into effect: the leader is adopted with the new
//     members and counts only their voters.
//   - The change is completed once the new leader's epoch-start record is
//     committed: from then on a quorum of the new set alone holds every
//     acknowledged record.
//
// Add = add-learner (the learner fetches, never counts), catch-up (its lag
// behind the leader within a bound), promote-learner. Remove = remove (the
// removed replica is fenced through the fence list and never adopted; a
// removed leader is replaced by a voter, as Decide only picks voters), then
// the removed replica drops its data. Replace = add, then remove.

// Catch-up defaults (ChangeReplicasRequest).
const (
	defaultCatchUpLag     = 64
	defaultCatchUpTimeout = 5 * time.Minute
	// maxCatchUpTimeout bounds what a request may ask for.
	maxCatchUpTimeout = time.Hour
)

// epochStartWait bounds how long a step waits for the leader its promotion
// made to commit its epoch-start record before completing the change. The
// change stays in flight if it does not (safe: joint quorums), and the
// automatic path completes it later.
const epochStartWait = 15 * time.Second

// casRetries bounds the attempts of a membership compare-and-swap that
// keeps losing to concurrent writers (a promotion recording incarnations).
const casRetries = 8

// busyWait bounds how long a step's promotion or a deletion waits for a
// promotion of the same range already running (an automatic one) to end.
const busyWait = 10 * time.Second

// membershipKey marks a range with a membership change or deletion run by
// this promoter, in Promoter.inflight.
func membershipKey(rangeID string) string { return "membership/" + rangeID }

// describeChange is a change in flight for people, e.g. "add-learner r4
// since epoch 7".
func describeChange(ch *tenurev1.MembershipChange) string {
	if ch == nil {
		return ""
	}
	return fmt.Sprintf("%s %s since epoch %d", stepName(ch.GetStep()), ch.GetReplicaId(), ch.GetEpoch())
}

// stepName is a step's short name: "add-learner", "promote-learner", ...
func stepName(s tenurev1.MembershipStep) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(s.String(), "MEMBERSHIP_STEP_")), "_", "-")
}

// ChangeReplicas runs one membership change (PromoterService.ChangeReplicas),
// calling send once per phase; the last message has done set. Only the
// elected promoter changes membership.
func (p *Promoter) ChangeReplicas(ctx context.Context, req *tenurev1.ChangeReplicasRequest, send func(*tenurev1.ChangeReplicasResponse) error) error {
	rangeID := req.GetRangeId()
	if err := wire.ValidateRangeID(rangeID); err != nil {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	add, remove := req.GetAdd(), req.GetRemoveReplicaId()
	if add == nil && remove == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("a membership change needs a replica to add, to remove, or both"))
	}
	if add != nil {
		if err := wire.ValidateReplicaID(add.GetId()); err != nil {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("replica to add: %w", err))
		}
		if add.GetAddress() == "" {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("replica to add %s has no address", add.GetId()))
		}
		if err := wire.ValidateAddress(add.GetAddress()); err != nil {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("replica to add %s: %w", add.GetId(), err))
		}
		if add.GetId() == remove {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("replica %s is both added and removed", remove))
		}
	}
	if remove != "" {
		if err := wire.ValidateReplicaID(remove); err != nil {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("replica to remove: %w", err))
		}
	}
	timeout := time.Duration(req.GetCatchUpTimeoutMs()) * time.Millisecond
	if timeout <= 0 {
		timeout = defaultCatchUpTimeout
	}
	if timeout > maxCatchUpTimeout {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("catch-up timeout %v is above the bound %v", timeout, maxCatchUpTimeout))
	}
	lag := req.GetCatchUpLag()
	if lag == 0 {
		lag = defaultCatchUpLag
	}
	if !p.Elected() {
		return p.notElectedError()
	}
	done, err := p.changeReplicas(ctx, rangeID, add, remove, lag, timeout, send)
	if err != nil {
		return err
	}
	// Sent only once the change is released (changeReplicas returned): a
	// caller that reads "done" and at once starts the next change of the
	// range (tenurectl range add-replica, then remove-replica) found this
	// one still running and was refused.
	return send(done)
}

// changeReplicas runs the change with the range marked as changing, and
// returns its last message ("done") for the caller to send once unmarked.
func (p *Promoter) changeReplicas(ctx context.Context, rangeID string, add *tenurev1.Replica, remove string, lag uint64, timeout time.Duration, send func(*tenurev1.ChangeReplicasResponse) error) (*tenurev1.ChangeReplicasResponse, error) {
	// One change per range at a time from this promoter; the lease service
	// refuses a second in flight from anyone.
	if !p.begin(membershipKey(rangeID)) {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("a membership change or deletion of range %s is already running", rangeID))
	}
	defer p.end(membershipKey(rangeID))
	c := &changeRun{p: p, rangeID: rangeID, send: send}
	if add != nil && remove != "" {
		// A replace checks its removal before it adds: the add is three
		// steps and two epochs, and a removal refused only after them
		// (a mistyped --remove) left the range with an extra voter the
		// operator never asked for.
		if err := c.checkRemovable(ctx, remove); err != nil {
			return nil, err
		}
	}
	if add != nil {
		r := &tenurev1.Replica{Id: add.GetId(), Address: add.GetAddress(), Learner: true}
		if err := c.add(ctx, r, lag, timeout, remove != ""); err != nil {
			return nil, err
		}
	}
	if remove != "" {
		if err := c.remove(ctx, remove); err != nil {
			return nil, err
		}
	}
	rng, err := p.getRange(ctx, rangeID)
	if err != nil {
		return nil, err
	}
	return &tenurev1.ChangeReplicasResponse{Phase: "done", Detail: "voters " + strings.Join(voterIDs(rng), ", "), Range: rng, Done: true}, nil
}

func voterIDs(rng *tenurev1.RangeInfo) []string {
	voters, _, _, _, _ := MembersOf(rng)
	return voters
}

// changeRun is one ChangeReplicas call.
type changeRun struct {
	p       *Promoter
	rangeID string
	send    func(*tenurev1.ChangeReplicasResponse) error
}

// add adds r: learner, catch-up, voter. In a replace (replacing), a
// replica that is a voter already is the add of an earlier run of the same
// replace, which stopped before its removal: it goes on with the removal.
func (c *changeRun) add(ctx context.Context, r *tenurev1.Replica, lag uint64, timeout time.Duration, replacing bool) error {
	p := c.p
	rng, err := p.getRange(ctx, c.rangeID)
	if err != nil {
		return err
	}
	ch := rng.GetChange()
	resume := ch.GetStep() == tenurev1.MembershipStep_MEMBERSHIP_STEP_ADD_LEARNER && ch.GetReplicaId() == r.GetId()
	switch m := member(rng, r.GetId()); {
	case m != nil && !m.GetLearner() && ch.GetStep() == tenurev1.MembershipStep_MEMBERSHIP_STEP_PROMOTE_LEARNER && ch.GetReplicaId() == r.GetId():
		// An earlier run recorded the step that makes it a voter, and that
		// step's promotion failed: resume it (stepThen gives it its
		// promotion). Answering "already a voter" left it in flight for as
		// long as the leader stayed healthy, with the new member counted
		// by no leader.
		return c.step(ctx, tenurev1.MembershipStep_MEMBERSHIP_STEP_PROMOTE_LEARNER, &tenurev1.Replica{Id: r.GetId()})
	case m != nil && !m.GetLearner() && replacing && ch == nil:
		return c.send(&tenurev1.ChangeReplicasResponse{Phase: "promote-learner", Range: rng,
			Detail: fmt.Sprintf("%s is a voter already (an earlier run added it); on to the removal", r.GetId())})
	case m != nil && !m.GetLearner():
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("replica %s is already a voter of range %s", r.GetId(), c.rangeID))
	case m == nil || resume:
		// The new member is (id, incarnation) from the start: its disk's
		// id, read from the replica itself, so a later answer from another
		// disk under the same id never counts.
		inc, err := p.incarnationOf(ctx, r)
		if err != nil {
			return err
		}
		r.Incarnation = inc
		if err := c.step(ctx, tenurev1.MembershipStep_MEMBERSHIP_STEP_ADD_LEARNER, r); err != nil {
			return err
		}
	default:
		// Already a learner (an earlier run's catch-up timed out): go on
		// from its catch-up.
	}
	if err := c.catchUp(ctx, r.GetId(), lag, timeout); err != nil {
		return err
	}
	return c.step(ctx, tenurev1.MembershipStep_MEMBERSHIP_STEP_PROMOTE_LEARNER, &tenurev1.Replica{Id: r.GetId()})
}

// checkRemovable refuses the removal of a replica that is not a member of
// the range and whose removal is not in flight either.
func (c *changeRun) checkRemovable(ctx context.Context, id string) error {
	rng, err := c.p.getRange(ctx, c.rangeID)
	if err != nil {
		return err
	}
	return removable(rng, id, c.rangeID)
}

// removable is checkRemovable on a range already read.
func removable(rng *tenurev1.RangeInfo, id, rangeID string) error {
	if member(rng, id) == nil && (rng.GetChange().GetReplicaId() != id || rng.GetChange().GetStep() != tenurev1.MembershipStep_MEMBERSHIP_STEP_REMOVE) {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("replica %s is not a member of range %s", id, rangeID))
	}
	return nil
}

func (c *changeRun) remove(ctx context.Context, id string) error {
	rng, err := c.p.getRange(ctx, c.rangeID)
	if err != nil {
		return err
	}
	if err := removable(rng, id, c.rangeID); err != nil {
		return err
	}
	gone := member(rng, id)
	if gone == nil {
		// Resuming a removal in flight: the member is among the old ones.
		for _, r := range rng.GetChange().GetOldReplicas() {
			if r.GetId() == id {
				gone = r
			}
		}
	}
	var tr *tenurev1.Transition
	if err := c.stepThen(ctx, tenurev1.MembershipStep_MEMBERSHIP_STEP_REMOVE, &tenurev1.Replica{Id: id}, func(t *tenurev1.Transition) { tr = t }); err != nil {
		return err
	}
	// The removed replica was fenced at the step's epoch (if it answered)
	// and never adopted: it serves nothing. Its data goes now, best
	// effort: one that cannot be reached keeps a fenced copy nobody
	// fences for the range again.
	//
	// It is fenced at the step's epoch first: the step's fence round may
	// have ended without its answer (a busy leader answering after the
	// quorum's grace), and a replica still leading at an older epoch
	// refuses to drop. A fence at the epoch it already holds is a no-op.
	//
	// A refused fence does not stop the drop: a replica whose copy is
	// quarantined (its stored data failed its checks) refuses every fence,
	// and dropping that copy is what rebuilding it needs (tenurectl range
	// rebuild). DropRange keeps its own guards whatever the fence said: it
	// refuses an epoch below the replica's fence and a replica still
	// leading, so a drop the fence did not prepare changes nothing unsafe.
	detail := fmt.Sprintf("%s dropped the range's data", id)
	cctx, cancel := context.WithTimeout(ctx, c.p.cfg.RPCTimeout)
	_, ferr := c.p.batchers(gone).fence.call(cctx, &tenurev1.FenceRequest{RangeId: c.rangeID, Epoch: tr.GetEpoch(), FencerId: c.p.cfg.ID,
		Incarnation: gone.GetIncarnation(), RangeGeneration: rng.GetGeneration()})
	_, err = c.p.replicaFor(gone).DropRange(cctx, connect.NewRequest(&tenurev1.DropRangeRequest{RangeId: c.rangeID, Epoch: tr.GetEpoch()}))
	if err != nil && ferr != nil {
		err = fmt.Errorf("fence: %w; drop: %w", ferr, err)
	}
	cancel()
	if err != nil {
		detail = fmt.Sprintf("%s did not drop the range's data (%v): it is fenced and no longer a member, so it serves nothing; delete its copy by hand or re-run", id, err)
		c.p.log.WarnContext(ctx, "removed replica did not drop the range", "range", c.rangeID, "replica", id, "err", err)
	}
	rng, err = c.p.getRange(ctx, c.rangeID)
	if err != nil {
		return err
	}
	return c.send(&tenurev1.ChangeReplicasResponse{Phase: "drop", Detail: detail, Range: rng})
}

// step runs one membership step through its promotion to completion. The
// lease service refuses a step that does not apply (FailedPrecondition).
func (c *changeRun) step(ctx context.Context, step tenurev1.MembershipStep, r *tenurev1.Replica) error {
	return c.stepThen(ctx, step, r, nil)
}

// stepThen is step; promoted, if not nil, is handed the step's transition.
func (c *changeRun) stepThen(ctx context.Context, step tenurev1.MembershipStep, r *tenurev1.Replica, promoted func(*tenurev1.Transition)) error {
	p := c.p
	name := stepName(step) + " " + r.GetId()
	var leaderID string
	for attempt := 1; ; attempt++ {
		rng, err := p.getRange(ctx, c.rangeID)
		if err != nil {
			return err
		}
		if ch := rng.GetChange(); ch != nil {
			if ch.GetStep() == step && ch.GetReplicaId() == r.GetId() {
				// This very step is in flight (an earlier run's promotion
				// failed): resume it with a promotion.
				leaderID = p.knownLeader(rng)
				break
			}
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
				"range %s has a membership change in flight (%s): it completes with the next successful promotion, or re-run that change",
				c.rangeID, describeChange(ch)))
		}
		leader, ok, why, err := p.epochStartCommitted(ctx, rng)
		if err != nil {
			return err
		}
		if !ok {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
				"range %s: %s; a membership step waits until the leader's own epoch-start record is committed", c.rangeID, why))
		}
		leaderID = leader.GetId()
		cctx, cancel := context.WithTimeout(ctx, p.cfg.RPCTimeout)
		_, err = p.lease.ChangeMembership(cctx, connect.NewRequest(&tenurev1.ChangeMembershipRequest{
			RangeId: c.rangeID, ExpectedRevision: rng.GetMembershipRevision(), Step: step, Replica: r,
		}))
		cancel()
		if connect.CodeOf(err) == connect.CodeAborted && attempt < casRetries {
			// The membership moved under us (a promotion recorded an
			// incarnation): read it again, and check again.
			continue
		}
		if err != nil {
			return err
		}
		break
	}
	preferred := leaderID
	if preferred == r.GetId() && step == tenurev1.MembershipStep_MEMBERSHIP_STEP_REMOVE {
		// A removed leader hands over: Decide picks among the voters,
		// which no longer include it.
		preferred = ""
	}
	tr, err := p.promoteNow(ctx, c.rangeID, promoteOpts{
		preferred: preferred, reason: "membership: " + strings.ReplaceAll(stepName(step), "-", " ") + " " + r.GetId(), step: name, waitRecord: true,
	})
	if err != nil {
		// The step stays in flight: every promotion needs quorums of the
		// old and the new voters until it is completed, so nothing
		// acknowledged can be lost between them.
		return wrapCode(err, "%s: the step's promotion failed, the change stays in flight (promotions need a quorum of the old and of the new voters) and completes with the next successful promotion; re-run to retry it now", name)
	}
	if err := p.waitEpochStartCommitted(ctx, c.rangeID, tr, epochStartWait); err != nil {
		return wrapCode(err, "%s: promoted %s at epoch %d, the change stays in flight until its epoch-start record is committed", name, tr.GetLeaderId(), tr.GetEpoch())
	}
	rng, err := p.completeChange(ctx, c.rangeID)
	if err != nil {
		return err
	}
	if promoted != nil {
		promoted(tr)
	}
	return c.send(&tenurev1.ChangeReplicasResponse{Phase: stepName(step),
		Detail: fmt.Sprintf("%s: epoch %d, leader %s", name, tr.GetEpoch(), tr.GetLeaderId()), Range: rng, Transition: tr})
}

// catchUpPoll is how often catch-up reads the leader's progress of a learner.
const catchUpPoll = 100 * time.Millisecond

// catchUpReport is how often catch-up reports the lag while it waits.
const catchUpReport = time.Second

// catchUp waits until the learner's lag behind the leader's log end is at
// most lag, reporting the lag as it goes, for at most timeout. The leader's
// own count of the learner's checked fetch offset is the measure: a learner
// that never fetched has none, and is not caught up.
func (c *changeRun) catchUp(ctx context.Context, id string, lag uint64, timeout time.Duration) error {
	p := c.p
	deadline := time.Now().Add(timeout)
	var reported time.Time
	last := "no progress reported by the leader yet"
	for {
		rng, err := p.getRange(ctx, c.rangeID)
		if err != nil {
			return err
		}
		if leader := member(rng, p.knownLeader(rng)); leader != nil {
			cctx, cancel := context.WithTimeout(ctx, p.cfg.RPCTimeout)
			resp, err := p.replicaFor(leader).GetStatus(cctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: c.rangeID}))
			cancel()
			if err == nil && len(resp.Msg.GetRanges()) == 1 {
				for _, f := range resp.Msg.GetRanges()[0].GetFollowers() {
					if f.GetReplicaId() != id {
						continue
					}
					if f.GetLag() <= lag {
						return c.send(&tenurev1.ChangeReplicasResponse{Phase: "catch-up", Lag: f.GetLag(), Range: rng,
							Detail: fmt.Sprintf("%s caught up: %d behind %s, at most %d wanted", id, f.GetLag(), leader.GetId(), lag)})
					}
					last = fmt.Sprintf("%s is %d behind %s", id, f.GetLag(), leader.GetId())
					if time.Since(reported) >= catchUpReport {
						reported = time.Now()
						if err := c.send(&tenurev1.ChangeReplicasResponse{Phase: "catch-up", Lag: f.GetLag(), Range: rng, Detail: last}); err != nil {
							return err
						}
					}
				}
			}
		}
		if time.Now().After(deadline) {
			return connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf(
				"learner %s did not catch up within %v (%s); it stays a learner (it never counts): re-run to wait again, or remove it", id, timeout, last))
		}
		if !sleep(ctx, catchUpPoll) {
			return ctx.Err()
		}
	}
}

// wrapCode prefixes err's message, keeping its Connect code.
func wrapCode(err error, format string, args ...any) error {
	return connect.NewError(connect.CodeOf(err), fmt.Errorf(format+": %w", append(args, err)...))
}

// member returns rng's member id, or nil.
func member(rng *tenurev1.RangeInfo, id string) *tenurev1.Replica {
	for _, r := range rng.GetReplicas() {
		if r.GetId() == id {
			return r
		}
	}
	return nil
}

// incarnationOf asks replica r for its incarnation (its data directory's
// id). A replica older than incarnations answers none: it joins with none
// recorded, and its first counted fence answer records one.
func (p *Promoter) incarnationOf(ctx context.Context, r *tenurev1.Replica) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, p.cfg.RPCTimeout)
	defer cancel()
	resp, err := p.replicaFor(r).GetStatus(cctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{}))
	if err != nil {
		return "", wrapCode(err, "replica %s at %s does not answer", r.GetId(), r.GetAddress())
	}
	if got := resp.Msg.GetReplicaId(); got != "" && got != r.GetId() {
		return "", connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("the replica at %s is %s, not %s", r.GetAddress(), got, r.GetId()))
	}
	return resp.Msg.GetIncarnation(), nil
}

// knownLeader is the leader of rng at its current epoch as far as we know:
// the holder of the current epoch's lease when it is a member, else the
// leader this promoter recorded for that epoch; "" when neither.
func (p *Promoter) knownLeader(rng *tenurev1.RangeInfo) string {
	if l := rng.GetLease(); l.GetEpoch() == rng.GetEpoch() && member(rng, l.GetHolderId()) != nil {
		return l.GetHolderId()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if rs := p.ranges[rng.GetRangeId()]; rs != nil && rs.epoch == rng.GetEpoch() {
		return rs.leaderID
	}
	return ""
}

// epochStartCommitted reports whether the leader of rng at its current
// epoch has committed its own epoch-start record: its HWM is above the
// start offset of that epoch in its history. Until then the leadership may
// still be undone by a promotion counting the members before it, so no
// membership step may build on it. why says what is missing when not ok.
func (p *Promoter) epochStartCommitted(ctx context.Context, rng *tenurev1.RangeInfo) (leader *tenurev1.Replica, ok bool, why string, err error) {
	id := p.knownLeader(rng)
	leader = member(rng, id)
	if leader == nil {
		return nil, false, fmt.Sprintf("no leader known at epoch %d", rng.GetEpoch()), nil
	}
	ok, why, err = p.leaderCommitted(ctx, rng.GetRangeId(), leader, rng.GetEpoch())
	return leader, ok, why, err
}

// leaderCommitted reports whether leader leads rangeID at exactly epoch and
// has committed its epoch-start record.
func (p *Promoter) leaderCommitted(ctx context.Context, rangeID string, leader *tenurev1.Replica, epoch uint64) (bool, string, error) {
	c := p.replicaFor(leader)
	cctx, cancel := context.WithTimeout(ctx, p.cfg.RPCTimeout)
	defer cancel()
	st, err := c.GetStatus(cctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: rangeID}))
	if err != nil {
		return false, fmt.Sprintf("leader %s does not answer: %v", leader.GetId(), err), nil
	}
	if len(st.Msg.GetRanges()) != 1 {
		return false, fmt.Sprintf("leader %s does not host the range", leader.GetId()), nil
	}
	s := st.Msg.GetRanges()[0]
	// Only a leader at exactly the range's epoch: one at an older epoch
	// is deposed, and its commits say nothing about the current leadership.
	if s.GetRole() != tenurev1.Role_ROLE_LEADER || s.GetEpoch() != epoch {
		return false, fmt.Sprintf("%s does not lead at epoch %d (role %s, epoch %d)", leader.GetId(), epoch, s.GetRole(), s.GetEpoch()), nil
	}
	h, err := c.GetEpochHistory(cctx, connect.NewRequest(&tenurev1.GetEpochHistoryRequest{RangeId: rangeID}))
	if err != nil {
		return false, fmt.Sprintf("leader %s does not report its epoch history: %v", leader.GetId(), err), nil
	}
	hist := h.Msg.GetHistory()
	if len(hist) == 0 || hist[len(hist)-1].GetEpoch() != epoch {
		return false, fmt.Sprintf("leader %s has not journaled epoch %d yet", leader.GetId(), epoch), nil
	}
	start := hist[len(hist)-1].GetStartOffset()
	// The epoch-start record sits at start; it is committed once the HWM
	// is past it (HWM is exclusive: every offset below it is committed).
	if hwm := h.Msg.GetHighWaterMark(); hwm <= start {
		return false, fmt.Sprintf("leader %s's epoch-start record at %d is not committed yet (HWM %d)", leader.GetId(), start, hwm), nil
	}
	return true, "", nil
}

// waitEpochStartCommitted waits, at most within, until the leader tr made
// has committed its epoch-start record.
func (p *Promoter) waitEpochStartCommitted(ctx context.Context, rangeID string, tr *tenurev1.Transition, within time.Duration) error {
	leader := &tenurev1.Replica{Id: tr.GetLeaderId(), Address: tr.GetLeaderAddress()}
	deadline := time.Now().Add(within)
	for {
		ok, why, err := p.leaderCommitted(ctx, rangeID, leader, tr.GetEpoch())
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%s after %v", why, within))
		}
		if !sleep(ctx, 20*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// completeChange ends the change in flight once a promotion above its epoch
// happened. A change someone else completed already is fine.
func (p *Promoter) completeChange(ctx context.Context, rangeID string) (*tenurev1.RangeInfo, error) {
	for attempt := 1; ; attempt++ {
		rng, err := p.getRange(ctx, rangeID)
		if err != nil {
			return nil, err
		}
		ch := rng.GetChange()
		if ch == nil {
			return rng, nil
		}
		// The step takes effect with a promotion to a later epoch than the
		// one it was made at: only then does a leader count the new set.
		if rng.GetEpoch() <= ch.GetEpoch() {
			return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("range %s: the change %s has had no promotion yet", rangeID, describeChange(ch)))
		}
		cctx, cancel := context.WithTimeout(ctx, p.cfg.RPCTimeout)
		resp, err := p.lease.CompleteMembershipChange(cctx, connect.NewRequest(&tenurev1.CompleteMembershipChangeRequest{
			RangeId: rangeID, ExpectedRevision: rng.GetMembershipRevision(),
		}))
		cancel()
		if connect.CodeOf(err) == connect.CodeAborted && attempt < casRetries {
			continue
		}
		if err != nil {
			return nil, err
		}
		p.log.InfoContext(ctx, "membership change complete", "range", rangeID, "change", describeChange(ch), "epoch", rng.GetEpoch())
		return resp.Msg.GetRange(), nil
	}
}

// completeInFlight completes rng's change in flight in the background when
// a promotion above its epoch succeeded (an automatic one, after the step's
// own failed) and that leader's epoch-start record is committed. Called for
// every range the refresh reads; nothing runs while a change or deletion of
// the range runs here.
func (p *Promoter) completeInFlight(ctx context.Context, rng *tenurev1.RangeInfo) {
	ch := rng.GetChange()
	if ch == nil || rng.GetEpoch() <= ch.GetEpoch() {
		return
	}
	key := membershipKey(rng.GetRangeId())
	if !p.begin(key) {
		return
	}
	go func() {
		defer p.end(key)
		if _, ok, _, err := p.epochStartCommitted(ctx, rng); err != nil || !ok {
			return
		}
		if _, err := p.completeChange(ctx, rng.GetRangeId()); err != nil && ctx.Err() == nil {
			p.log.Debug("membership change not completed yet", "range", rng.GetRangeId(), "change", describeChange(ch), "err", err)
		}
	}()
}

// recordIncarnations records, after a successful promotion, the
// incarnation of every member that had none recorded and whose answer
// counted: from now on the member is (id, incarnation). Best effort: a
// member left without one is recorded when it is next reconciled or by the
// next promotion.
func (m *promotion) recordIncarnations(ctx context.Context) {
	rev := m.revision
	for _, f := range m.tr.GetReplicas() {
		if f.GetCounted() && f.GetIncarnation() != "" && m.incarnations[f.GetReplicaId()] == "" {
			rev = m.p.recordIncarnation(ctx, m.rangeID, rev, f.GetReplicaId(), f.GetIncarnation())
		}
	}
}

// recordIncarnation records inc as member id's incarnation, expecting the
// membership at rev (0: read it first), and returns the revision it left.
// It never replaces one: when the membership moved, it records only if id
// is still a member with none recorded. Recording only narrows which
// answers count (with none recorded, any disk's answer counts as the
// member's), so a caller may record any disk that answered as the member
// and was adopted. Failures are logged; the next reconcile or promotion
// tries again.
func (p *Promoter) recordIncarnation(ctx context.Context, rangeID string, rev int64, id, inc string) int64 {
	for attempt := 1; attempt <= casRetries; attempt++ {
		if rev == 0 {
			rng, err := p.getRange(ctx, rangeID)
			if err != nil {
				return 0
			}
			if r := member(rng, id); r == nil || r.GetIncarnation() != "" {
				return rng.GetMembershipRevision()
			}
			rev = rng.GetMembershipRevision()
		}
		cctx, cancel := context.WithTimeout(ctx, p.cfg.RPCTimeout)
		resp, err := p.lease.ChangeMembership(cctx, connect.NewRequest(&tenurev1.ChangeMembershipRequest{
			RangeId: rangeID, ExpectedRevision: rev, Step: tenurev1.MembershipStep_MEMBERSHIP_STEP_SET_INCARNATION,
			Replica: &tenurev1.Replica{Id: id, Incarnation: inc},
		}))
		cancel()
		if err == nil {
			p.log.InfoContext(ctx, "recorded replica incarnation", "range", rangeID, "replica", id, "incarnation", inc)
			return resp.Msg.GetRange().GetMembershipRevision()
		}
		if connect.CodeOf(err) != connect.CodeAborted {
			p.log.WarnContext(ctx, "replica incarnation not recorded", "range", rangeID, "replica", id, "err", err)
			return 0
		}
		// The membership moved: read it again (rev 0).
		rev = 0
	}
	return 0
}

// promoteNow runs an operator's (or a membership step's) promotion of
// rangeID: only while elected, one promotion of the range at a time (it
// waits, bounded, for one already running), recorded in the range's state.
func (p *Promoter) promoteNow(ctx context.Context, rangeID string, opts promoteOpts) (*tenurev1.Transition, error) {
	if !p.Elected() {
		return nil, p.notElectedError()
	}
	if err := p.beginWaiting(ctx, rangeID, opts.step != ""); err != nil {
		return nil, err
	}
	defer p.end(rangeID)
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-p.sem }()
	tr, err := p.promoteWith(ctx, rangeID, -1, opts)
	if err != nil && tr == nil {
		// Refused before an epoch was granted (a preferred replica that is
		// no member, a range that does not exist, a lost grant): the range
		// is as it was, and the refusal is the caller's answer, not the
		// range's state. Recorded, a refused --preferred r9 showed a
		// healthy range unavailable until its next promotion.
		return nil, err
	}
	p.finished(rangeID, tr, err, false)
	return tr, err
}

// errRunning marks the refusal of a promotion because one of the same
// range is running (its text is what clients retry on: "already running").
var errRunning = errors.New("already running")

// beginWaiting marks rangeID in flight; with wait, it waits up to busyWait
// for a promotion already running to end (a membership step must not fail
// for an automatic promotion that happens to run), else it refuses at once.
func (p *Promoter) beginWaiting(ctx context.Context, rangeID string, wait bool) error {
	deadline := time.Now().Add(busyWait)
	for !p.begin(rangeID) {
		if !wait || time.Now().After(deadline) {
			return connect.NewError(connect.CodeUnavailable, fmt.Errorf("a promotion of range %s is %w; retry shortly", rangeID, errRunning))
		}
		if !sleep(ctx, 20*time.Millisecond) {
			return ctx.Err()
		}
	}
	return nil
}

// DeleteRange deletes rangeID (PromoterService.DeleteRange): grant an epoch,
// fence every member at it (so none acts under an older one again), have
// each fenced one drop the range's data at that epoch, then delete the
// range from the lease service and its transition records. Idempotent: a
// range already gone answers existed = false.
//
// A range created again under the same id is never confused with this one:
// the lease service keeps its epoch key as a tombstone, so the new range's
// epochs continue above every epoch granted here, and its generation is
// higher, so a replica that could not be reached now drops its old copy
// when first fenced for the new range.
func (p *Promoter) DeleteRange(ctx context.Context, rangeID string) (*tenurev1.PromoterServiceDeleteRangeResponse, error) {
	if err := wire.ValidateRangeID(rangeID); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	if !p.Elected() {
		return nil, p.notElectedError()
	}
	if !p.begin(membershipKey(rangeID)) {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("a membership change or deletion of range %s is already running", rangeID))
	}
	defer p.end(membershipKey(rangeID))
	if err := p.beginWaiting(ctx, rangeID, true); err != nil {
		return nil, err
	}
	defer p.end(rangeID)
	out := &tenurev1.PromoterServiceDeleteRangeResponse{}
	rng, err := p.getRange(ctx, rangeID)
	if connect.CodeOf(err) == connect.CodeNotFound {
		return out, p.forget(ctx, rangeID)
	}
	if err != nil {
		return nil, err
	}
	m := &promotion{p: p, rangeID: rangeID, last: time.Now(), tr: &tenurev1.Transition{}}
	none := ""
	if err := m.members(rng, &none, false); err != nil {
		return nil, err
	}
	epoch, _, err := m.grant(ctx, rng.GetEpoch())
	if err != nil {
		return nil, err
	}
	fctx, cancel := context.WithTimeout(ctx, p.cfg.FenceTimeout)
	answers := make([]Answer, len(m.fence))
	done := make(chan struct{}, len(m.fence))
	for i, r := range m.fence {
		go func() { answers[i] = m.fence1(fctx, r, epoch); done <- struct{}{} }()
	}
	for range m.fence {
		<-done
	}
	cancel()
	for i, a := range answers {
		if a.Err != nil {
			out.Unreachable = append(out.Unreachable, fmt.Sprintf("%s: not fenced: %v", a.ReplicaID, a.Err))
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, p.cfg.RPCTimeout)
		_, err := p.replicaFor(m.fence[i]).DropRange(cctx, connect.NewRequest(&tenurev1.DropRangeRequest{RangeId: rangeID, Epoch: epoch}))
		cancel()
		if err != nil {
			out.Unreachable = append(out.Unreachable, fmt.Sprintf("%s: did not drop: %v", a.ReplicaID, err))
			continue
		}
		out.Dropped = append(out.Dropped, a.ReplicaID)
	}
	cctx, cancel := context.WithTimeout(ctx, p.cfg.RPCTimeout)
	resp, err := p.lease.DeleteRange(cctx, connect.NewRequest(&tenurev1.DeleteRangeRequest{RangeId: rangeID}))
	cancel()
	if err != nil {
		return nil, err
	}
	out.Existed = resp.Msg.GetExisted()
	p.log.InfoContext(ctx, "range deleted", "range", rangeID, "epoch", epoch, "dropped", out.Dropped, "unreachable", out.Unreachable)
	return out, p.forget(ctx, rangeID)
}

// forget drops a deleted range's state and transition records: its epochs
// are over, and a range created again under the id must not read the old
// one's bounds as its own (highestRecordedHWM).
func (p *Promoter) forget(ctx context.Context, rangeID string) error {
	p.mu.Lock()
	delete(p.ranges, rangeID)
	p.mu.Unlock()
	return p.deleteTransitions(ctx, rangeID)
}
