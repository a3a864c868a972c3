package promoter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// rangeState is the promoter's view of one range. Guarded by Promoter.mu.
type rangeState struct {
	epoch    uint64
	replicas []*tenurev1.Replica
	leaderID string // "" when the range has no leader at epoch
	state    string
	lastErr  string
	attempts uint32
	// holds counts consecutive promotions held for want of a quorum
	// (quorumAnswering): not attempts, but their retries back off too.
	holds   uint32
	retryAt time.Time
	// changed is when epoch or leader last changed; a probe answer taken
	// before it describes an older world and is ignored.
	changed time.Time
	// notServing is what the probes saw of a leader at the range's epoch
	// that does not serve (observeServing). Zero while it serves.
	notServing notServing
	// change is the membership change in flight, as last read; generation
	// the range's generation (sent with reconciling fences).
	change     *tenurev1.MembershipChange
	generation uint64
	// preferred is the range's preferred replica, as last read: where the
	// rebalancer moves its leadership back to (rebalance.go).
	preferred string
	// rebalanceFailed is when the rebalancer's last move of the range
	// failed; it waits rebalanceBackoff intervals before the next try.
	rebalanceFailed time.Time
}

func (rs *rangeState) status(id string) *tenurev1.RangePromotionState {
	st := &tenurev1.RangePromotionState{RangeId: id, Epoch: rs.epoch, LeaderId: rs.leaderID, State: rs.state, LastError: rs.lastErr, Attempts: rs.attempts}
	if !rs.retryAt.IsZero() {
		st.NextRetryUnixMs = rs.retryAt.UnixMilli()
	}
	st.MembershipChange = describeChange(rs.change)
	return st
}

func (rs *rangeState) address(id string) string {
	return rs.member(id).GetAddress()
}

// member is the member id as stored (with its incarnation), or nil.
func (rs *rangeState) member(id string) *tenurev1.Replica {
	for _, r := range rs.replicas {
		if r.GetId() == id {
			return r
		}
	}
	return nil
}

// Run campaigns in the promoter election and, while elected, watches lease
// events, probes replicas, reconciles stragglers and promotes. It returns
// when ctx ends.
func (p *Promoter) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		if err := p.campaign(ctx); err != nil && ctx.Err() == nil {
			// Not elected, and why: Promote's refusal says it (notElectedError).
			p.mu.Lock()
			p.electionErr = err.Error()
			p.mu.Unlock()
			p.logRecurring(&p.electionWarn, "not elected: the election on etcd failed; retrying",
				"etcd", p.cfg.Etcd.Endpoints(), "err", err)
			sleep(ctx, jitter(500*time.Millisecond))
		}
	}
	return nil
}

// electionTTLSeconds is the election session's TTL: how long a crashed
// elected promoter blocks its successor. etcd counts it in whole seconds.
const electionTTLSeconds = 2

// electionGrantTimeout bounds the grant of the election session's lease.
// The etcd client waits for a connection as long as its context lasts: with
// the promoter's own, one whose etcd could not be reached waited forever in
// the grant, not elected and logging nothing (seen: `tenure promoter --etcd
// 127.0.0.1:1` silent after "promoter serving").
const electionGrantTimeout = 3 * time.Second

func (p *Promoter) campaign(ctx context.Context) error {
	gctx, cancel := context.WithTimeout(ctx, electionGrantTimeout)
	lease, err := p.cfg.Etcd.Grant(gctx, electionTTLSeconds)
	cancel()
	if err != nil {
		// A grant that timed out says only "deadline exceeded": the
		// connection's state says whether etcd could be reached at all.
		state := "unknown"
		if conn := p.cfg.Etcd.ActiveConnection(); conn != nil {
			state = conn.GetState().String()
		}
		return fmt.Errorf("election session: lease grant (bound %v, etcd connection %s): %w", electionGrantTimeout, state, err)
	}
	// The session's keep-alives run on ctx, not on the grant's bound.
	sess, err := concurrency.NewSession(p.cfg.Etcd, concurrency.WithLease(lease.ID), concurrency.WithTTL(electionTTLSeconds), concurrency.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("election session: %w", err)
	}
	defer sess.Close()
	p.mu.Lock()
	failed := p.electionErr != ""
	p.electionErr = ""
	p.mu.Unlock()
	if failed {
		p.log.Info("etcd answers again; campaigning", "etcd", p.cfg.Etcd.Endpoints())
	}
	el := concurrency.NewElection(sess, p.cfg.Prefix+"promoter-election")

	obsCtx, stopObserve := context.WithCancel(ctx)
	defer stopObserve()
	go func() {
		for resp := range el.Observe(obsCtx) {
			if len(resp.Kvs) > 0 {
				id, url := parseCandidate(resp.Kvs[0].Value)
				p.mu.Lock()
				p.leaderID, p.leaderURL = id, url
				p.mu.Unlock()
			}
		}
	}()

	// Campaign on the session's context: a standby whose etcd goes away
	// loses its session after the TTL, and must start a new round (and
	// say that it cannot) instead of waiting in the campaign for ever.
	if err := el.Campaign(sess.Ctx(), candidateValue(p.cfg.ID, p.cfg.URL)); err != nil {
		if ctx.Err() == nil && sess.Ctx().Err() != nil {
			return fmt.Errorf("campaign: election session lost (etcd unreachable?): %w", err)
		}
		return fmt.Errorf("campaign: %w", err)
	}
	p.log.Info("elected")
	loopCtx, stop := context.WithCancel(ctx)
	p.mu.Lock()
	p.elected, p.leaderID, p.leaderURL = true, p.cfg.ID, p.cfg.URL
	p.mu.Unlock()
	loops := []func(context.Context){p.keepSession, p.refreshLoop, p.watchLoop, p.probeLoop, p.rebalanceLoop}
	done := make(chan struct{}, len(loops))
	for _, loop := range loops {
		go func() { loop(loopCtx); done <- struct{}{} }()
	}
	select {
	case <-sess.Done():
		p.log.Warn("election session lost; stepping down")
	case <-ctx.Done():
	}
	p.mu.Lock()
	p.elected = false
	p.mu.Unlock()
	stop()
	for range loops {
		<-done
	}
	rctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = el.Resign(rctx)
	return nil
}

// Promote runs a promotion of rangeID now. Only the elected promoter
// promotes. preferred only breaks ties among equally complete logs: an
// operator's PromoteRequest naming a replica is a planned handover instead,
// which lands there or is refused (handover.go).
func (p *Promoter) Promote(ctx context.Context, rangeID, preferred, reason string) (*tenurev1.Transition, error) {
	return p.promoteNow(ctx, rangeID, promoteOpts{preferred: preferred, reason: reason, waitRecord: true})
}

// begin marks rangeID in flight; false if it already is.
func (p *Promoter) begin(key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inflight[key] {
		return false
	}
	p.inflight[key] = true
	return true
}

func (p *Promoter) end(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.inflight, key)
}

// schedule promotes rangeID in the background if no promotion of it is
// running. observedEpoch is the epoch the trigger saw; the grant is a CAS on
// it, so duplicate triggers promote at most once.
func (p *Promoter) schedule(ctx context.Context, rangeID string, observedEpoch uint64, reason string) {
	if !p.begin(rangeID) {
		return
	}
	go func() {
		defer p.end(rangeID)
		select {
		case p.sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		defer func() { <-p.sem }()
		p.mu.Lock()
		if rs := p.ranges[rangeID]; rs != nil {
			rs.state = "promoting"
		}
		p.mu.Unlock()
		var tr *tenurev1.Transition
		p.awaitFirstProbes(ctx, rangeID)
		err := p.quorumAnswering(rangeID)
		if err == nil {
			tr, err = p.promoteRecorded(ctx, rangeID, int64(observedEpoch), "", reason, false)
		}
		if retry, at := p.finished(rangeID, tr, err, true); retry > 0 && ctx.Err() == nil {
			time.AfterFunc(retry, func() {
				if ctx.Err() != nil {
					return
				}
				p.mu.Lock()
				rs := p.ranges[rangeID]
				// Only the retry of the range's latest outcome runs. Every
				// trigger that fails starts a retry (a probe finds the dead
				// leader every interval), and one that outlived a later
				// success would promote again from the healthy epoch,
				// deposing the leader just made: TestNoQuorumThenRecovery
				// caught one.
				current := rs != nil && rs.retryAt.Equal(at)
				var e uint64
				if current {
					e = rs.epoch
				}
				p.mu.Unlock()
				if current {
					p.schedule(ctx, rangeID, e, retryReason(reason))
				}
			})
		}
	}()
}

// retryReason is the reason a retry of a promotion for reason gives: the
// reason, marked as a retry once. It lands in the transition record, and a
// mark per retry grew without bound while a majority stayed down (25 marks
// after a 2.6 s outage in compose chaos).
func retryReason(reason string) string {
	const mark = " (retry)"
	if strings.HasSuffix(reason, mark) {
		return reason
	}
	return reason + mark
}

// quorumAnswering refuses an automatic promotion of rangeID while so many of
// its replicas cannot answer a fence that no quorum could be fenced: the
// promotion would be granted an epoch, fence the survivors at it, and fail.
// While a majority was down, the probes' triggers and the retries did that
// for every range it led, many times a second: each an epoch grant in etcd
// and a failed "promote" trace crowding the useful ones out of Jaeger; the
// chaos suite's majority crashes ended at epochs 15-32 after two faults.
// (Raft's PreVote avoids the same churn of terms.)
//
// Two things count as down. A refused connection (probeState.refused): no
// process serves the member's address. And a misdirected address
// (probeState.answeredAs): the process there answers as another replica, so
// it refuses every call meant for the member, the fence included. A range
// created with two members' addresses swapped spent 36 epochs in 16 s
// before this counted: each attempt granted one, every fence but one was
// refused as misdirected, and the attempt failed for want of a quorum.
//
// Nothing else counts as down: a replica that answers slowly or not at all
// may still answer a fence, and the survivors of a mass failover answer
// probes late while they are busiest, which must not hold their promotions
// back. A replica not probed yet counts as answering (awaitFirstProbes
// waits a bounded time for its first probe). Operator promotions
// (Promote) are not held back: the operator asked, and gets the fence
// round's own answer.
func (p *Promoter) quorumAnswering(rangeID string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	rs := p.ranges[rangeID]
	if rs == nil || len(rs.replicas) == 0 {
		return nil // nothing known yet: the promotion reads the members itself
	}
	// Only voters count toward a promotion's quorum: a learner answering
	// or not changes nothing. With a change in flight the promotion needs a
	// quorum of the voters before it too.
	voters := func(rs []*tenurev1.Replica) []*tenurev1.Replica {
		var out []*tenurev1.Replica
		for _, r := range rs {
			if !r.GetLearner() {
				out = append(out, r)
			}
		}
		return out
	}
	sets := [][]*tenurev1.Replica{voters(rs.replicas)}
	if rs.change != nil {
		sets = append(sets, voters(rs.change.GetOldReplicas()))
	}
	for _, set := range sets {
		var refused, misdirected []string
		for _, r := range set {
			ps := p.probes[r.GetAddress()]
			switch {
			case ps == nil:
			case ps.refused:
				refused = append(refused, r.GetId())
			case ps.answeredAs != "" && ps.answeredAs != r.GetId():
				misdirected = append(misdirected, fmt.Sprintf("%s's address %s answers as replica %s", r.GetId(), r.GetAddress(), ps.answeredAs))
			}
		}
		need := wire.Quorum(len(set))
		if down := len(refused) + len(misdirected); len(set)-down < need {
			var why []string
			if len(refused) > 0 {
				why = append(why, fmt.Sprintf("refuse connections (%s)", strings.Join(refused, ", ")))
			}
			if len(misdirected) > 0 {
				// The fix is the range's addresses, not waiting: say so.
				why = append(why, fmt.Sprintf("are misdirected (%s; correct the members' addresses: tenurectl range set-address)", strings.Join(misdirected, "; ")))
			}
			return connect.NewError(connect.CodeUnavailable, fmt.Errorf(
				"range %s: %d of %d replicas %s and a promotion needs %d to answer; %w",
				rangeID, down, len(set), strings.Join(why, " or "), need, errHeld))
		}
	}
	return nil
}

// errHeld marks a promotion quorumAnswering held back: nothing was tried,
// so it is no failed attempt (the range's state says "no-quorum").
var errHeld = errors.New("no epoch is granted until enough are back")

// finished records a promotion's outcome and returns how long to wait
// before retrying (0: no retry) and the retry time it recorded, which
// identifies the retry as the one for this outcome. An operator's promotion
// (auto false) is not retried: its failure is recorded, and a retry of an
// automatic one that is pending stays the one that runs.
func (p *Promoter) finished(rangeID string, tr *tenurev1.Transition, err error, auto bool) (time.Duration, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	rs := p.ranges[rangeID]
	if rs == nil {
		rs = &rangeState{}
		p.ranges[rangeID] = rs
	}
	now := time.Now()
	if err == nil {
		rs.epoch, rs.leaderID, rs.changed = tr.GetEpoch(), tr.GetLeaderId(), now
		rs.state, rs.lastErr, rs.attempts, rs.holds, rs.retryAt = "healthy", "", 0, 0, time.Time{}
		return 0, time.Time{}
	}
	if connect.CodeOf(err) == connect.CodeNotFound && auto {
		// The range was deleted: nothing to promote, and no retry (it
		// would retry forever). A range created again under the id is
		// read afresh by the refresh.
		delete(p.ranges, rangeID)
		return 0, time.Time{}
	}
	if connect.CodeOf(err) == connect.CodeAborted {
		// Someone else moved the range on; the next refresh or lease event
		// tells us where it is. No retry of an earlier outcome is wanted.
		rs.lastErr, rs.retryAt = err.Error(), time.Time{}
		return 0, time.Time{}
	}
	// The same failure again (a majority down fails every trigger alike,
	// one per probe interval) is logged at debug level: once is news.
	// (lastErr is cleared by a success.)
	repeat := rs.lastErr == err.Error()
	held := errors.Is(err, errHeld)
	rs.lastErr = err.Error()
	rs.state = "unavailable"
	if held {
		rs.state = "no-quorum"
	}
	if tr != nil && tr.GetEpoch() > rs.epoch {
		rs.epoch, rs.leaderID, rs.changed = tr.GetEpoch(), "", now
	}
	if !auto {
		return 0, time.Time{}
	}
	// Only promotions that were tried count as attempts: a held one is
	// re-checked at every probe's trigger, ten a second, and would drown
	// the count of real failures. Both back off.
	n := &rs.attempts
	if held {
		n = &rs.holds
	}
	*n++
	// Exponential backoff from 50ms, capped, with jitter so that many
	// ranges failing together do not retry in lockstep.
	d := 50 * time.Millisecond << min(*n-1, 10)
	d = jitter(min(d, p.cfg.RetryMax))
	rs.retryAt = now.Add(d)
	level := slog.LevelWarn
	if repeat {
		level = slog.LevelDebug
	}
	p.log.Log(context.Background(), level, "promotion failed; will retry", "range", rangeID, "attempt", rs.attempts, "retry_in", d, "err", err)
	return d, rs.retryAt
}

// refreshLoop re-reads every range from the lease service: membership,
// epoch and leader. Ranges that never had a leader are promoted.
func (p *Promoter) refreshLoop(ctx context.Context) {
	for {
		if err := p.refresh(ctx); err != nil && ctx.Err() == nil {
			p.logRecurring(&p.refreshWarn, "range refresh failed", "lease", p.leaseURLs(), "err", err)
		}
		if !sleep(ctx, p.cfg.RefreshInterval) {
			return
		}
	}
}

// maxRangesPerPage is the ListRanges page size the promoter asks for.
const maxRangesPerPage = 1000

func (p *Promoter) refresh(ctx context.Context) error {
	after := ""
	for pages := 0; pages < 10_000; pages++ {
		cctx, cancel := context.WithTimeout(ctx, p.cfg.RPCTimeout)
		resp, err := p.lease.ListRanges(cctx, connect.NewRequest(&tenurev1.ListRangesRequest{AfterRangeId: after, Limit: maxRangesPerPage}))
		cancel()
		if err != nil {
			return err
		}
		for _, r := range resp.Msg.GetRanges() {
			p.observe(ctx, r)
			after = r.GetRangeId()
		}
		if !resp.Msg.GetMore() {
			return nil
		}
	}
	return errors.New("range list did not end after 10000 pages")
}

// observe merges the lease service's view of a range into ours.
func (p *Promoter) observe(ctx context.Context, r *tenurev1.RangeInfo) {
	p.mu.Lock()
	rs := p.ranges[r.GetRangeId()]
	if rs == nil {
		rs = &rangeState{state: "healthy"}
		p.ranges[r.GetRangeId()] = rs
	}
	rs.replicas, rs.change, rs.generation, rs.preferred = r.GetReplicas(), r.GetChange(), r.GetGeneration(), r.GetPreferredReplicaId()
	// Epochs only move forward: an older view (a slow refresh racing a
	// promotion we just finished) must not roll our state back.
	if r.GetEpoch() > rs.epoch {
		rs.epoch, rs.leaderID, rs.changed = r.GetEpoch(), "", time.Now()
	}
	if r.GetEpoch() == rs.epoch && rs.leaderID == "" {
		if h := r.GetLease().GetHolderId(); h != "" && rs.address(h) != "" && r.GetLease().GetEpoch() == rs.epoch {
			rs.leaderID, rs.changed = h, time.Now()
		}
	}
	epoch, leader, inflight := rs.epoch, rs.leaderID, p.inflight[r.GetRangeId()]
	p.mu.Unlock()
	p.completeInFlight(ctx, r)
	if l := r.GetLease(); leader != "" && l.GetEpoch() == epoch && l.GetHolderId() == p.cfg.ID && !inflight {
		// The lease of the current epoch is still ours: the bind to the
		// leader failed (its keeper had no session yet). Retry it, so the
		// leader's own renewals become the range's liveness signal again.
		p.rebind(ctx, r.GetRangeId(), epoch, leader)
	}
	if epoch == 0 {
		p.schedule(ctx, r.GetRangeId(), 0, "initial leader")
		return
	}
	if leader == "" {
		// The lease does not name a member: learn the leader from the last
		// transition record of this epoch, if there is one.
		trs, err := p.transitions(ctx, r.GetRangeId(), 1)
		if err == nil && len(trs) == 1 && trs[0].GetEpoch() == epoch {
			p.mu.Lock()
			if rs.epoch == epoch && rs.leaderID == "" {
				rs.leaderID, rs.changed = trs[0].GetLeaderId(), time.Now()
			}
			p.mu.Unlock()
			return
		}
		if err == nil && r.GetLease().GetEpoch() == 0 && !inflight {
			// No leader, no lease at all and no adoption recorded at this
			// epoch: a range deleted and created again under its id, whose
			// epochs continue above the deleted one's (the lease service
			// keeps its epoch as a tombstone), so it never reads epoch 0.
			// It needs its first leader like a new range.
			p.schedule(ctx, r.GetRangeId(), epoch, "initial leader (no lease at epoch "+strconv.FormatUint(epoch, 10)+")")
			return
		}
		if l := r.GetLease(); err == nil && l.GetEpoch() == epoch && l.GetHolderId() == p.cfg.ID && l.GetLive() && !inflight {
			// The current epoch was granted to us, no promotion of ours is
			// running, and none recorded an adoption: an attempt of ours
			// lost track of its own grant (the grant applied, but its
			// answer came too late) and its retry, comparing against the
			// epoch before, was told the range had moved on. Nobody else
			// will act: our session stays live, so the lease never expires.
			// Promote it from the current epoch; fencing keeps this safe
			// even if a leader was adopted unrecorded, and the grant's
			// compare-and-swap keeps it from running twice.
			p.schedule(ctx, r.GetRangeId(), epoch, "orphaned grant: no leader at our own epoch")
		}
	}
}

// watchLoop follows lease events and promotes a range whose leader's lease
// expired. One etcd revision can carry events for many ranges (a session
// expiring takes all its leases at once), and a stream may break in the
// middle of one; so it resumes from the revision before the last one seen
// and skips the (range, revision) pairs it already handled: no event is
// missed and none is handled twice.
func (p *Promoter) watchLoop(ctx context.Context) {
	var pos watchPos
	for ctx.Err() == nil {
		err := p.watch(ctx, &pos)
		if ctx.Err() != nil {
			return
		}
		// Every ~200 ms while the lease service is unreachable: bounded.
		p.logRecurring(&p.watchWarn, "lease watch ended; resuming", "lease", p.leaseURLs(), "revision", pos.rev, "err", err)
		if connect.CodeOf(err) == connect.CodeOutOfRange {
			pos = watchPos{} // compacted: start from now; the refresh loop covers the gap
		}
		sleep(ctx, jitter(200*time.Millisecond))
	}
}

// watchPos is where a lease watch stands: the last revision seen and the
// ranges already handled at that revision.
type watchPos struct {
	rev  int64
	seen map[string]bool
}

// fresh reports whether ev is new, and records it.
func (w *watchPos) fresh(ev *tenurev1.WatchLeasesResponse) bool {
	switch {
	case ev.GetRevision() < w.rev:
		return false
	case ev.GetRevision() > w.rev:
		w.rev, w.seen = ev.GetRevision(), map[string]bool{}
	}
	key := ev.GetRangeId() + "/" + ev.GetType().String()
	if w.seen[key] {
		return false
	}
	w.seen[key] = true
	return true
}

func (p *Promoter) watch(ctx context.Context, pos *watchPos) error {
	after := pos.rev
	if after > 0 {
		after-- // replay the last revision: the stream may have broken inside it
	}
	stream, err := p.lease.WatchLeases(ctx, connect.NewRequest(&tenurev1.WatchLeasesRequest{AfterRevision: after}))
	if err != nil {
		return err
	}
	defer stream.Close()
	for stream.Receive() {
		if ev := stream.Msg(); pos.fresh(ev) {
			p.onLeaseEvent(ctx, ev)
		}
	}
	// A lease service that crashed or was cut off ends the stream mid-body:
	// log a lost connection, not "internal: protocol error".
	return transport.LostStream(stream.Err())
}

func (p *Promoter) onLeaseEvent(ctx context.Context, ev *tenurev1.WatchLeasesResponse) {
	switch ev.GetType() {
	case tenurev1.LeaseEventType_LEASE_EVENT_TYPE_EXPIRED, tenurev1.LeaseEventType_LEASE_EVENT_TYPE_RELEASED:
		// A released lease is a leader shutting down cleanly: as gone as an
		// expired one, only sooner.
		p.mu.Lock()
		rs := p.ranges[ev.GetRangeId()]
		// Only the expiry of the current epoch's lease means the leader is
		// gone; an older epoch's lease expiring is history. The leader may be
		// unknown: a promoter that died between its grant and the adoption
		// left the range fenced and leaderless, with the lease on its own
		// session, and that session's expiry is the signal to promote.
		current := rs != nil && rs.epoch == ev.GetEpoch() && ev.GetEpoch() > 0
		p.mu.Unlock()
		if current {
			p.schedule(ctx, ev.GetRangeId(), ev.GetEpoch(), "lease "+strings.ToLower(strings.TrimPrefix(ev.GetType().String(), "LEASE_EVENT_TYPE_")))
		}
	case tenurev1.LeaseEventType_LEASE_EVENT_TYPE_MEMBERSHIP:
		if r, err := p.getRange(ctx, ev.GetRangeId()); err == nil {
			p.observe(ctx, r)
		}
	case tenurev1.LeaseEventType_LEASE_EVENT_TYPE_GRANTED, tenurev1.LeaseEventType_LEASE_EVENT_TYPE_BOUND:
		p.mu.Lock()
		if rs := p.ranges[ev.GetRangeId()]; rs != nil && ev.GetEpoch() > rs.epoch {
			// Another promoter (or an operator) moved the range: forget the
			// leader until this epoch's adoption is seen.
			rs.epoch, rs.leaderID, rs.changed = ev.GetEpoch(), "", time.Now()
		}
		if rs := p.ranges[ev.GetRangeId()]; rs != nil && ev.GetEpoch() == rs.epoch && rs.leaderID == "" && rs.address(ev.GetHolderId()) != "" {
			rs.leaderID, rs.changed = ev.GetHolderId(), time.Now()
		}
		p.mu.Unlock()
	}
}

func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d/2 + rand.N(d/2+1)
}

// sleep waits d or until ctx ends; false if ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// rebind moves the lease of epoch to the range's leader (best effort).
func (p *Promoter) rebind(ctx context.Context, rangeID string, epoch uint64, leader string) {
	cctx, cancel := context.WithTimeout(ctx, p.cfg.RPCTimeout)
	defer cancel()
	_, err := p.leaseBatch.bind.call(cctx, &tenurev1.BindLeaseRequest{RangeId: rangeID, Epoch: epoch, HolderId: leader})
	if err != nil {
		p.log.Debug("lease rebind failed; will retry on the next refresh", "range", rangeID, "epoch", epoch, "leader", leader, "err", err)
	}
}

// recurring is a failure that repeats as long as its cause lasts (etcd or
// the lease service unreachable), as logRecurring reports it. Guarded by
// Promoter.warnMu.
type recurring struct {
	// last is when it was last logged at warning level; zero before.
	last time.Time
	// failed counts the failures since then.
	failed int
}

// recurringWarnEvery is how often a recurring failure is logged at warning
// level at most. Unbounded, the lease watch's retries logged five warnings
// a second while the lease service was down; unlogged, the election's
// logged nothing at all.
const recurringWarnEvery = 10 * time.Second

// logRecurring logs one failure of r: at warning level the first at once,
// then at most one every recurringWarnEvery with how many failures it
// stands for ("failures"), the others at debug level.
func (p *Promoter) logRecurring(r *recurring, msg string, args ...any) {
	now := time.Now()
	p.warnMu.Lock()
	r.failed++
	n := r.failed
	warn := r.last.IsZero() || now.Sub(r.last) >= recurringWarnEvery
	if warn {
		r.last, r.failed = now, 0
	}
	p.warnMu.Unlock()
	level := slog.LevelDebug
	if warn {
		level = slog.LevelWarn
		args = append(args, "failures", n)
	}
	p.log.Log(context.Background(), level, msg, args...)
}

// leaseURLs is every lease service instance the promoter calls, for logs.
func (p *Promoter) leaseURLs() []string {
	return append([]string{p.cfg.LeaseURL}, p.cfg.LeaseURLs...)
}
