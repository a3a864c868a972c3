package promoter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

var tracer = otel.Tracer("github.com/tenurelog/tenure/services/promoter")

// promotion is one run of docs/design.md's steps 1-7 for one range.
type promotion struct {
	p       *Promoter
	rangeID string
	opts    promoteOpts
	// replicas is the range's replica set as stored (voters and learners,
	// with their incarnations): what Adopt names, so the leader knows whom
	// to count and whose fetches to accept.
	replicas []*tenurev1.Replica
	// fence is every replica to fence (MembersOf): the members, plus old
	// members a removal in flight dropped, which must be fenced to stop
	// serving the range. byID indexes it.
	fence []*tenurev1.Replica
	byID  map[string]*tenurev1.Replica
	// voters, learners, oldVoters and incarnations are MembersOf's view of
	// the membership the decision is made under.
	voters, learners, oldVoters []string
	incarnations                map[string]string
	// generation is the range's generation, sent with every fence so a
	// replica drops data of a deleted range of the same id.
	generation uint64
	// revision is the membership revision read with the members: the
	// compare-and-swap of the incarnations recorded after the promotion.
	revision int64
	// retention is the range's retention policy as read with the members
	// (nil from a lease service that predates it): Adopt hands it to the
	// new leader, so retention applies from its first pass.
	retention *tenurev1.RetentionPolicy
	tr        *tenurev1.Transition
	last      time.Time
}

// promoteOpts are what a promotion is asked for besides its range.
type promoteOpts struct {
	// preferred names the replica to lead among equally complete ones.
	preferred string
	// target names the replica a planned handover moves leadership to
	// (handover.go); it is also preferred. "" for none. handover is its
	// leader and target once caught up (awaitTarget); nil when there was
	// no live leader to hand over from.
	target   string
	handover *handover
	// reason lands in the transition record.
	reason string
	// unsafe promotes without a quorum (PromoteRequest.unsafe_accept_data_loss).
	// Only an operator sets it; no automatic path ever does.
	unsafe bool
	// step names the membership step the promotion carries out, if any.
	step string
	// waitRecord: return only once the transition record is written.
	waitRecord bool
}

// step records how long the step that just ended took.
func (m *promotion) step(name string) {
	now := time.Now()
	m.tr.Timings = append(m.tr.Timings, &tenurev1.StepTiming{Step: name, DurationUs: now.Sub(m.last).Microseconds()})
	m.p.metrics.step(name, now.Sub(m.last))
	m.last = now
	if h := m.p.testHookStep; h != nil {
		h(name)
	}
}

// promote runs one promotion of rangeID. observedEpoch is the epoch the
// trigger saw (the lease that expired, the leader that stopped answering);
// the grant is a compare-and-swap on it, so a trigger that fires twice, or
// two promoters acting on the same evidence, promote at most once: the
// second grant answers Aborted. observedEpoch < 0 means "whatever is current"
// (an operator's Promote).
func (p *Promoter) promote(ctx context.Context, rangeID string, observedEpoch int64, preferred, reason string) (*tenurev1.Transition, error) {
	return p.promoteRecorded(ctx, rangeID, observedEpoch, preferred, reason, true)
}

// promoteRecorded is promote; waitRecord says whether it returns only once
// the transition record is written, or as soon as it is queued (the
// background promotions of a failover, which need not hold their fan-out
// slot for an audit record).
func (p *Promoter) promoteRecorded(ctx context.Context, rangeID string, observedEpoch int64, preferred, reason string, waitRecord bool) (_ *tenurev1.Transition, err error) {
	return p.promoteWith(ctx, rangeID, observedEpoch, promoteOpts{preferred: preferred, reason: reason, waitRecord: waitRecord})
}

// promoteWith is promote with every option.
func (p *Promoter) promoteWith(ctx context.Context, rangeID string, observedEpoch int64, opts promoteOpts) (_ *tenurev1.Transition, err error) {
	preferred, reason, waitRecord := opts.preferred, opts.reason, opts.waitRecord
	named := preferred != ""
	ctx, span := tracer.Start(ctx, "promote", trace.WithAttributes(
		attribute.String("tenure.range", rangeID), attribute.String("tenure.reason", reason),
		attribute.Bool("tenure.unsafe", opts.unsafe), attribute.String("tenure.membership_step", opts.step)))
	defer func() {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}()
	start := time.Now()
	m := &promotion{p: p, rangeID: rangeID, opts: opts, last: start, tr: &tenurev1.Transition{
		RangeId:        rangeID,
		Reason:         reason,
		PromoterId:     p.cfg.ID,
		StartedUnixMs:  start.UnixMilli(),
		Unsafe:         opts.unsafe,
		MembershipStep: opts.step,
	}}
	if sc := span.SpanContext(); sc.HasTraceID() {
		m.tr.TraceId = sc.TraceID().String()
	}
	defer func() { p.metrics.promotion(opts, observedEpoch, err, start) }()

	// 1. Epoch: E = previous + 1 by compare-and-swap in the lease service.
	//
	// A failover knows the epoch it saw fail, and the grant is a
	// compare-and-swap on exactly that epoch: it grants nothing if the
	// range moved on (Aborted, as the read-then-compare it replaces
	// answered). So it grants first, and learns the replica set from the
	// grant's own transaction, a read no older than a GetRange before it
	// would have been: in a mass failover that GetRange was a lease
	// service round trip in every promotion's path. An operator's Promote
	// (or a preferred replica to check before acting) reads the range
	// first, as it needs its current epoch.
	var rng *tenurev1.RangeInfo
	var previous, epoch uint64
	if observedEpoch >= 0 && preferred == "" {
		previous = uint64(observedEpoch)
		if epoch, rng, err = m.grant(ctx, previous); err != nil {
			return nil, err
		}
		if rng == nil {
			// A lease service older than the grant's range answer.
			if rng, err = p.getRange(ctx, rangeID); err != nil {
				// E is granted and nothing fenced: the caller retries at
				// the next epoch, so it needs to know E moved.
				m.tr.PreviousEpoch, m.tr.Epoch = previous, epoch
				return m.tr, err
			}
		}
		if err := m.members(rng, &preferred, named); err != nil {
			m.tr.PreviousEpoch, m.tr.Epoch = previous, epoch
			return m.tr, err
		}
	} else {
		if rng, err = p.getRange(ctx, rangeID); err != nil {
			return nil, err
		}
		if observedEpoch >= 0 && rng.GetEpoch() != uint64(observedEpoch) {
			// Someone already moved the range past what the trigger saw.
			return nil, connect.NewError(connect.CodeAborted, fmt.Errorf("range %s is at epoch %d, not the observed %d: already promoted", rangeID, rng.GetEpoch(), observedEpoch))
		}
		if err := m.members(rng, &preferred, named); err != nil {
			return nil, err
		}
		previous = rng.GetEpoch()
		if epoch, _, err = m.grant(ctx, previous); err != nil {
			return nil, err
		}
	}
	m.tr.PreviousEpoch, m.tr.Epoch = previous, epoch
	span.SetAttributes(attribute.Int64("tenure.epoch", int64(epoch)))
	m.step("grant")

	// 2. Fence and read, one round trip, in parallel. The preferred
	// replica's answer is waited for (within the fence timeout) when the
	// operator named it or the range gets its first leader: a quorum in
	// 140 ms without it made compose's --preferred replica-1 lose its first
	// election to a replica that merely answered sooner. A failover does
	// not wait: its preferred replica may be the leader that just died.
	var waitFor string
	if named || previous == 0 {
		waitFor = preferred
	}
	if ho := opts.handover; ho != nil && ho.epoch == previous {
		// A planned handover fences the others first, so that the
		// leader's HWM cannot run ahead of the target (handover.go).
		// Only from the epoch its catch-up was measured at: at another,
		// the leader it watched is gone, and the plan decides alone.
		m.fenceOthers(ctx, epoch, ho)
	}
	answers := m.fenceAll(ctx, epoch, waitFor)
	m.step("fence")
	if h := p.testHookAfterFence; h != nil {
		h(rangeID, epoch)
	}

	// 3-5. The decision is a pure function of the answers. The safe plan
	// first, also when the operator accepted data loss: the unsafe one is
	// for a range where no safe one exists. With a quorum fenced, the
	// unsafe plan led from the same candidate yet was recorded and counted
	// as unsafe (tenure_promoter_unsafe_promotions_total is an alert), and
	// where a safe plan refuses a replica's cut below its HWM (DataLoss),
	// the unsafe one leaves the replica fenced.
	in := Input{Epoch: epoch, Preferred: preferred, RangeID: rangeID, Answers: answers,
		Replicas: m.voters, Learners: m.learners, OldVoters: m.oldVoters, Incarnations: m.incarnations,
		HandoverTo: opts.target}
	plan, err := m.decide(ctx, in)
	switch {
	case err != nil && opts.unsafe:
		// No safe plan (no quorum, or the most complete log lacks
		// committed records): what the operator accepted. The bound of
		// what may have been acknowledged: the fenced HWMs (Decide takes
		// those itself) and every bound an earlier promotion recorded,
		// which survives the replicas that reported it. An unsafe
		// promotion is rare and slow anyway: the read is worth the exact
		// report.
		in.Unsafe = true
		in.HighestHWMSeen = m.highestRecordedHWM(ctx)
		plan, err = m.decide(ctx, in)
	case opts.unsafe:
		// A safe plan: nothing acknowledged is lost, so this is a normal
		// transition. The deferred metrics read opts: counted as an
		// operator's promotion, not an unsafe one.
		opts.unsafe, m.opts.unsafe, m.tr.Unsafe = false, false, false
		if reason == unsafeReason {
			reason = "operator request"
		}
		reason += " (--unsafe-accept-data-loss not needed: a quorum was fenced)"
		m.tr.Reason = reason
		span.SetAttributes(attribute.Bool("tenure.unsafe", false))
	}
	m.step("plan")
	if err != nil {
		// The range is now fenced at E with no leader: the caller retries
		// at the next epoch, so it needs to know E moved.
		return m.tr, err
	}

	// 5. Reconcile while fenced: a replica agrees with the candidate before
	// it follows it. Replicas accept Truncate only at exactly E.
	if err := m.truncateAll(ctx, epoch, plan); err != nil {
		return m.tr, err
	}
	m.step("truncate")

	// 6. Adopt: the candidate first (it journals E and writes the epoch-start
	// record), then the followers.
	if err := m.adoptLeader(ctx, epoch, plan); err != nil {
		return m.tr, err
	}
	m.adoptFollowers(ctx, epoch, plan)
	m.step("adopt")

	// Bind the lease for E to the new leader, then record. A bind failure
	// does not undo the promotion (fencing, not the lease, keeps it safe);
	// the leader's keeper and the probes take over, and the reason is logged.
	finish := func() {
		m.bind(ctx, epoch, plan.Candidate)
		m.step("bind")
		// Members that answered for the first time are (id, incarnation)
		// from now on: a later answer from another disk under the same id
		// never counts again.
		m.recordIncarnations(context.WithoutCancel(ctx))

		m.tr.DurationUs = time.Since(start).Microseconds()
		// 7. Record.
		// The record is written even if the promoter is stopping: the
		// promotion happened, and the record is how operators learn of it.
		m.record(context.WithoutCancel(ctx), epoch, waitRecord)
		m.step("record")
		p.log.Info("promoted", "range", rangeID, "epoch", epoch, "leader", plan.Candidate,
			"committed_bound", plan.CommittedBound, "truncations", len(plan.Truncations),
			"duration", time.Since(start), "trace_id", m.tr.TraceId, "reason", reason)
		// A copy that stopped serving was left fenced, as it stands: the
		// range has one serving replica fewer until its replica restarts
		// (and a safety violation is for an operator to look at).
		for _, f := range m.tr.GetReplicas() {
			if f.GetHalted() != "" {
				p.log.Warn("promoted without a halted copy: not counted, not truncated, not adopted; restart its replica once the cause is understood, and the reconcile loop brings it back",
					"range", rangeID, "epoch", epoch, "replica", f.GetReplicaId(), "log_end", f.GetLogEnd(), "hwm", f.GetHighWaterMark(), "halted", f.GetHalted())
			}
		}
	}
	if opts.unsafe {
		// Loud on purpose: records [possibly_lost_from, highest_hwm_seen)
		// may have been acknowledged to clients and are not on the new
		// leader.
		p.log.WarnContext(ctx, "UNSAFE promotion: acknowledged records may be lost", "range", rangeID, "epoch", epoch,
			"leader", plan.Candidate, "possibly_lost_from", plan.PossiblyLostFrom, "highest_hwm_seen", plan.HighestHWMSeen,
			"excluded", plan.Excluded, "trace_id", m.tr.TraceId, "reason", reason)
	}
	if waitRecord {
		finish()
		return m.tr, nil
	}
	// A background promotion (a failover) is done once its leader and
	// followers are adopted: the range is served. The bind and the record
	// follow without holding the caller's fan-out slot, so in a mass
	// failover the next range's promotion starts a bind's round trip
	// sooner. The caller gets a copy: finish still adds to m.tr.
	out := proto.Clone(m.tr).(*tenurev1.Transition)
	go finish()
	return out, nil
}

func (p *Promoter) getRange(ctx context.Context, rangeID string) (*tenurev1.RangeInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.RPCTimeout)
	defer cancel()
	resp, err := p.leaseBatch.get.call(ctx, &tenurev1.GetRangeRequest{RangeId: rangeID})
	if err != nil {
		return nil, err
	}
	return resp.GetRange(), nil
}

// members takes the range's membership from rng, and its preferred replica
// when the caller named none. A named one must be a voter; the range's own
// preference is dropped when it is not one (a learner, or a member being
// removed): it is a hint, and only a voter can lead.
func (m *promotion) members(rng *tenurev1.RangeInfo, preferred *string, named bool) error {
	m.voters, m.learners, m.oldVoters, m.incarnations, m.fence = MembersOf(rng)
	m.replicas = rng.GetReplicas()
	m.generation, m.revision = rng.GetGeneration(), rng.GetMembershipRevision()
	m.retention = rng.GetRetention()
	m.byID = make(map[string]*tenurev1.Replica, len(m.fence))
	for _, r := range m.fence {
		m.byID[r.GetId()] = r
	}
	if *preferred == "" {
		*preferred = rng.GetPreferredReplicaId()
	}
	if *preferred != "" && !slices.Contains(m.voters, *preferred) {
		if named {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("preferred replica %q is not a voter of range %s (voters %v)", *preferred, m.rangeID, m.voters))
		}
		*preferred = ""
	}
	return nil
}

// grant asks for epoch previous+1. It also returns the range as of the
// grant when the lease service answers it (nil from older ones).
func (m *promotion) grant(ctx context.Context, previous uint64) (uint64, *tenurev1.RangeInfo, error) {
	ctx, span := tracer.Start(ctx, "grant-epoch", trace.WithAttributes(attribute.Int64("tenure.previous_epoch", int64(previous))))
	defer span.End()
	session, err := m.p.openSession(ctx)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return 0, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, m.p.cfg.RPCTimeout)
	defer cancel()
	resp, err := m.p.leaseBatch.grant.call(ctx, &tenurev1.GrantEpochRequest{
		RangeId:       m.rangeID,
		PreviousEpoch: previous,
		HolderId:      m.p.cfg.ID,
		SessionId:     session,
	})
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		if connect.CodeOf(err) == connect.CodeNotFound || connect.CodeOf(err) == connect.CodeFailedPrecondition {
			// The session may have expired under us: reopen next time.
			m.p.mu.Lock()
			if m.p.session == session {
				m.p.session = 0
			}
			m.p.mu.Unlock()
		}
		return 0, nil, err
	}
	epoch := resp.GetEpoch()
	// Invariant 7: epochs strictly increase. A lease service answering
	// anything else is broken, and acting on it could reuse an epoch.
	if epoch != previous+1 {
		err := connect.NewError(connect.CodeInternal, fmt.Errorf("lease service granted epoch %d after %d, want %d", epoch, previous, previous+1))
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return 0, nil, err
	}
	span.SetAttributes(attribute.Int64("tenure.epoch", int64(epoch)))
	rng := resp.GetRange()
	if rng != nil && (rng.GetRangeId() != m.rangeID || rng.GetEpoch() != epoch) {
		// The range answered is a claim like the epoch: one naming another
		// range or epoch is not the membership of this grant. Read it
		// instead.
		rng = nil
	}
	return epoch, rng, nil
}

// fenceAll fences every replica at epoch in parallel. It returns once every
// replica answered, or once a quorum of fenced replicas with known history
// is in plus FenceGrace, or at FenceTimeout. A replica that has not answered
// by then does not count (invariant 6), even if its fence lands later: it is
// then fenced at E and the reconcile loop adopts it as a follower. With
// waitFor set, a quorum ends the wait only once that replica answered too.
func (m *promotion) fenceAll(ctx context.Context, epoch uint64, waitFor string) []Answer {
	ctx, span := tracer.Start(ctx, "fence-all")
	defer span.End()
	ctx, cancel := context.WithTimeout(ctx, m.p.cfg.FenceTimeout)
	defer cancel()

	type result struct {
		i int
		a Answer
	}
	results := make(chan result, len(m.fence))
	for i, r := range m.fence {
		go func() { results <- result{i, m.fence1(ctx, r, epoch)} }()
	}
	answers := make([]Answer, len(m.fence))
	for i, r := range m.fence {
		answers[i] = Answer{ReplicaID: r.GetId(), Err: errors.New("fence: no answer before the deadline")}
	}
	// The wait may end early only once the answers in could carry the
	// promotion: a quorum of the voters AND, while a change is in flight, of
	// the voters before it, each a known history from the member's own
	// incarnation. A learner's or another disk's answer never counts, so
	// it never shortens the wait. An unsafe promotion waits for every
	// answer (or the timeout): it leads from the most complete survivor,
	// and one more answer may be more complete.
	isVoter := func(ids []string, id string) bool { return slices.Contains(ids, id) }
	q, qOld := wire.Quorum(len(m.voters)), wire.Quorum(len(m.oldVoters))
	counted, countedOld := 0, 0
	// waited: the replica to wait for answered (or is not fenced at all).
	waited := waitFor == "" || m.byID[waitFor] == nil
	var grace <-chan time.Time
	for n := 0; n < len(m.fence); n++ {
		select {
		case res := <-results:
			answers[res.i] = res.a
			a := res.a
			if a.ReplicaID == waitFor {
				waited = true
			}
			inc := m.incarnations[a.ReplicaID]
			// A halted copy never counts (Decide): it must not end the
			// wait either, or the grace could close the round before a
			// serving replica that the quorum needs has answered.
			if a.Err == nil && a.Halted == "" && wire.HistoryKnownFrom(journal.ToWire(a.History), a.LogStart, a.LogEnd) && (inc == "" || inc == a.Incarnation) {
				if isVoter(m.voters, a.ReplicaID) {
					counted++
				}
				if isVoter(m.oldVoters, a.ReplicaID) {
					countedOld++
				}
			}
			if counted >= q && (m.oldVoters == nil || countedOld >= qOld) && waited && grace == nil && !m.opts.unsafe {
				grace = time.After(m.p.cfg.FenceGrace)
			}
			continue
		case <-grace:
		case <-ctx.Done():
		}
		break
	}
	span.SetAttributes(attribute.Int("tenure.fenced_with_history", counted), attribute.Int("tenure.quorum", q))
	return answers
}

// fence1 fences one replica and validates its answer: a peer's history is a
// claim, and one that does not advance, or claims an epoch beyond its own
// log end, would hand the plan a truncation target computed from a lie.
//
// The fence names the member's recorded incarnation: a replica whose disk
// is another one refuses it (and says so in its status), so a wiped disk
// never hosts the range as a complete, empty log. The answer carries the
// replica's own incarnation too, and Decide counts it only if it is the
// member's: a replica older than incarnations answers none.
func (m *promotion) fence1(ctx context.Context, r *tenurev1.Replica, epoch uint64) Answer {
	ctx, span := tracer.Start(ctx, "fence", trace.WithAttributes(
		attribute.String("tenure.replica", r.GetId()), attribute.Int64("tenure.epoch", int64(epoch))))
	defer span.End()
	a := Answer{ReplicaID: r.GetId()}
	msg, err := m.p.batchers(r).fence.call(ctx, &tenurev1.FenceRequest{
		RangeId: m.rangeID, Epoch: epoch, FencerId: m.p.cfg.ID,
		Incarnation: m.incarnations[r.GetId()], RangeGeneration: m.generation,
	})
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		a.Err = err
		return a
	}
	// The replica must now be fenced at exactly E; anything else means it
	// did not record our fence, so it cannot count.
	if msg.GetFencedEpoch() != epoch {
		a.Err = fmt.Errorf("replica %s answered fenced epoch %d, want %d", r.GetId(), msg.GetFencedEpoch(), epoch)
	} else if err := wire.ValidateHistoryAgainstLog(msg.GetHistory(), msg.GetLogEnd()); err != nil {
		a.Err = fmt.Errorf("replica %s sent an invalid history: %w", r.GetId(), err)
	} else if msg.GetHighWaterMark() > msg.GetLogEnd() {
		a.Err = fmt.Errorf("replica %s claims HWM %d above its log end %d", r.GetId(), msg.GetHighWaterMark(), msg.GetLogEnd())
	} else if msg.GetLogStart() > msg.GetHighWaterMark() {
		// Retention removes only committed records: a log start above the
		// HWM would make a truncation target at the HWM cut below it.
		a.Err = fmt.Errorf("replica %s claims log start %d above its HWM %d", r.GetId(), msg.GetLogStart(), msg.GetHighWaterMark())
	}
	if a.Err != nil {
		span.RecordError(a.Err)
		span.SetStatus(codes.Error, a.Err.Error())
		return a
	}
	a.LogStart, a.LogEnd, a.HWM, a.Incarnation = msg.GetLogStart(), msg.GetLogEnd(), msg.GetHighWaterMark(), msg.GetIncarnation()
	a.ActingLeader = msg.GetActingLeader()
	a.Halted = clipHalted(msg.GetHalted())
	a.History = journal.FromWire(msg.GetHistory())
	var last uint64
	if n := len(a.History); n > 0 {
		last = a.History[n-1].Epoch
	}
	span.SetAttributes(attribute.Int64("tenure.log_end", int64(a.LogEnd)), attribute.Int64("tenure.hwm", int64(a.HWM)),
		attribute.Int64("tenure.last_epoch", int64(last)), attribute.Int("tenure.history_len", len(a.History)))
	return a
}

// maxHaltedBytes bounds the halt reason taken from a fence answer: it is a
// peer's text, and it lands in the transition record (etcd), the span and
// the promoter's status, once per replica. A replica's reasons are a few
// hundred bytes.
const maxHaltedBytes = 1 << 10

// clipHalted bounds a fence answer's halt reason to maxHaltedBytes, keeping
// it non-empty (a halted copy must still read as halted) and valid UTF-8.
func clipHalted(s string) string {
	if len(s) <= maxHaltedBytes {
		return s
	}
	return strings.ToValidUTF8(s[:maxHaltedBytes-3], "") + "..."
}

func (m *promotion) decide(ctx context.Context, in Input) (Plan, error) {
	_, span := tracer.Start(ctx, "choose-candidate")
	defer span.End()
	plan, err := Decide(in)
	m.tr.Replicas = plan.Fenced
	if len(m.tr.Replicas) == 0 {
		m.tr.Replicas = summarize(in.Answers)
	}
	for _, f := range m.tr.Replicas {
		span.SetAttributes(
			attribute.Int64("tenure."+f.GetReplicaId()+".log_end", int64(f.GetLogEnd())),
			attribute.Int64("tenure."+f.GetReplicaId()+".hwm", int64(f.GetHighWaterMark())),
			attribute.Int64("tenure."+f.GetReplicaId()+".last_epoch", int64(f.GetLastEpoch())),
			attribute.Bool("tenure."+f.GetReplicaId()+".fenced", f.GetFenced()))
		if h := f.GetHalted(); h != "" {
			span.SetAttributes(attribute.String("tenure."+f.GetReplicaId()+".halted", h))
		}
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		var pe *PlanError
		if errors.As(err, &pe) {
			err = connect.NewError(pe.Code, err)
		}
		return plan, err
	}
	m.tr.CommittedBound = plan.CommittedBound
	m.tr.HighestHwmSeen, m.tr.PossiblyLostFrom = plan.HighestHWMSeen, plan.PossiblyLostFrom
	m.tr.LeaderId = plan.Candidate
	m.tr.LeaderAddress = m.byID[plan.Candidate].GetAddress()
	m.tr.HandoverTo, m.tr.HandoverRefused = in.HandoverTo, plan.HandoverRefused
	span.SetAttributes(attribute.String("tenure.candidate", plan.Candidate), attribute.Int64("tenure.committed_bound", int64(plan.CommittedBound)))
	return plan, nil
}

// summarize reports fence answers when Decide gave no per-replica summary.
func summarize(answers []Answer) []*tenurev1.FencedReplica {
	out := make([]*tenurev1.FencedReplica, 0, len(answers))
	for _, a := range answers {
		f := &tenurev1.FencedReplica{ReplicaId: a.ReplicaID, Fenced: a.Err == nil, LogEnd: a.LogEnd, HighWaterMark: a.HWM, Halted: a.Halted}
		if a.Err != nil {
			f.Error = a.Err.Error()
		} else {
			f.HistoryKnown = wire.HistoryKnownFrom(journal.ToWire(a.History), a.LogStart, a.LogEnd)
			if n := len(a.History); n > 0 {
				f.LastEpoch = a.History[n-1].Epoch
			}
		}
		out = append(out, f)
	}
	return out
}

func (m *promotion) truncateAll(ctx context.Context, epoch uint64, plan Plan) error {
	var wg sync.WaitGroup
	errs := make([]error, len(plan.Truncations))
	for i, t := range plan.Truncations {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, span := tracer.Start(ctx, "truncate", trace.WithAttributes(attribute.String("tenure.replica", t.ReplicaID),
				attribute.Int64("tenure.from", int64(t.From)), attribute.Int64("tenure.to", int64(t.To))))
			defer span.End()
			ctx, cancel := context.WithTimeout(ctx, m.p.cfg.RPCTimeout)
			defer cancel()
			resp, err := m.p.replicaFor(m.byID[t.ReplicaID]).Truncate(ctx, connect.NewRequest(&tenurev1.TruncateRequest{
				RangeId: m.rangeID, Epoch: epoch, TargetOffset: t.To,
			}))
			if err != nil {
				span.RecordError(err)
				span.SetStatus(codes.Error, err.Error())
				errs[i] = fmt.Errorf("truncate %s to %d: %w", t.ReplicaID, t.To, err)
				return
			}
			span.SetAttributes(attribute.Int64("tenure.records_removed", int64(resp.Msg.GetRecordsRemoved())))
		}()
	}
	wg.Wait()
	for _, t := range plan.Truncations {
		m.tr.Truncations = append(m.tr.Truncations, &tenurev1.Truncation{ReplicaId: t.ReplicaID, FromOffset: t.From, ToOffset: t.To})
	}
	// A replica that could not be truncated has not agreed with the
	// candidate; it must not be adopted as a follower of it. If the others
	// still form a quorum the promotion could go on without it, but a retry
	// at the next epoch is simpler and just as safe.
	return errors.Join(errs...)
}

func (m *promotion) adoptLeader(ctx context.Context, epoch uint64, plan Plan) error {
	ctx, span := tracer.Start(ctx, "adopt", trace.WithAttributes(attribute.String("tenure.replica", plan.Candidate), attribute.String("tenure.role", "leader")))
	defer span.End()
	ctx, cancel := context.WithTimeout(ctx, m.p.cfg.RPCTimeout)
	defer cancel()
	leader := m.byID[plan.Candidate]
	_, err := m.p.batchers(leader).adopt.call(ctx, &tenurev1.AdoptRequest{
		RangeId: m.rangeID, Epoch: epoch, Role: tenurev1.Role_ROLE_LEADER,
		LeaderId: leader.GetId(), LeaderAddress: leader.GetAddress(),
		Replicas: m.replicas, CommittedBound: plan.CommittedBound, Retention: m.retention,
	})
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return fmt.Errorf("adopt %s as leader at epoch %d: %w", leader.GetId(), epoch, err)
	}
	return nil
}

// adoptFollowers adopts every other fenced replica as a follower. A failure
// is logged, not fatal: the leader serves with whichever followers made it,
// and the reconcile loop brings the rest in.
func (m *promotion) adoptFollowers(ctx context.Context, epoch uint64, plan Plan) {
	leader := m.byID[plan.Candidate]
	var wg sync.WaitGroup
	// Learners follow like any follower (after their truncations); the
	// leader never counts them. plan.Excluded (another disk under a
	// member's id, or an unsafe promotion's replica holding committed
	// records beyond the candidate) is never adopted: it stays fenced.
	for _, id := range slices.Concat(plan.Followers, plan.Unreconciled, plan.Learners) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := m.p.adoptFollower(ctx, m.rangeID, epoch, m.byID[id], leader, m.replicas); err != nil {
				m.p.log.WarnContext(ctx, "follower not adopted; the reconcile loop will retry", "range", m.rangeID, "epoch", epoch, "replica", id, "err", err)
			}
		}()
	}
	wg.Wait()
}

func (p *Promoter) adoptFollower(ctx context.Context, rangeID string, epoch uint64, r, leader *tenurev1.Replica, replicas []*tenurev1.Replica) error {
	ctx, span := tracer.Start(ctx, "adopt", trace.WithAttributes(attribute.String("tenure.replica", r.GetId()), attribute.String("tenure.role", "follower")))
	defer span.End()
	ctx, cancel := context.WithTimeout(ctx, p.cfg.RPCTimeout)
	defer cancel()
	_, err := p.batchers(r).adopt.call(ctx, &tenurev1.AdoptRequest{
		RangeId: rangeID, Epoch: epoch, Role: tenurev1.Role_ROLE_FOLLOWER,
		LeaderId: leader.GetId(), LeaderAddress: leader.GetAddress(), Replicas: replicas,
	})
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}

func (m *promotion) bind(ctx context.Context, epoch uint64, leaderID string) {
	ctx, span := tracer.Start(ctx, "bind-lease", trace.WithAttributes(attribute.String("tenure.replica", leaderID)))
	defer span.End()
	ctx, cancel := context.WithTimeout(ctx, m.p.cfg.RPCTimeout)
	defer cancel()
	_, err := m.p.leaseBatch.bind.call(ctx, &tenurev1.BindLeaseRequest{
		RangeId: m.rangeID, Epoch: epoch, HolderId: leaderID,
	})
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		m.p.log.WarnContext(ctx, "lease not bound to the new leader", "range", m.rangeID, "epoch", epoch, "leader", leaderID, "err", err)
	}
}

// record stores the transition record, in a batch with other promotions'
// (recorder). Its span is the promotion's last child: how long the etcd
// write took, and whether the record is missing; when the promotion does not
// wait for the write, the span ends after the promotion's own.
func (m *promotion) record(ctx context.Context, epoch uint64, wait bool) {
	ctx, span := tracer.Start(ctx, "record-transition")
	log := m.p.log
	rangeID := m.rangeID
	written := func(err error) {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
			log.ErrorContext(ctx, "transition record not stored", "range", rangeID, "epoch", epoch, "err", err)
		}
		span.End()
	}
	if !wait {
		// recordLater marshals the transition now: the record holds the
		// steps up to the bind, as when it is written in line.
		if err := m.p.recordLater(m.tr, written); err != nil {
			written(err)
		}
		return
	}
	written(m.p.recordTransition(ctx, m.tr))
}
