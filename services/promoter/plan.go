package promoter

import (
	"fmt"
	"hash/fnv"
	"strings"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// This file is the promotion decision (docs/design.md "Promotion", steps 3 to 5):
// given every replica's answer to Fence(R, E), which replica leads at E, what
// the committed bound is, and which replicas are cut back to where. It is a
// pure function of its input: the fence round trip before it and the
// Truncate/Adopt calls after it are the service's business, so the rules can
// be checked in a table, in scenario files and in a simulated cluster
// (plan_property_test.go) without a network, a clock or a disk.

// Answer is one replica's answer to Fence(R, E), as the fence step collected it.
type Answer struct {
	// ReplicaID names the replica; it must be a member of Input.Replicas.
	ReplicaID string
	// Err, when non-nil, says why the replica was not fenced at E
	// (unreachable, timed out, already fenced higher). Such a replica never
	// counts: only a fenced log has stopped moving, so only its numbers are
	// facts. Err takes precedence over every other field.
	Err error
	// Unimplemented marks a peer that does not report its history (an older
	// version answering Unimplemented, or closing the stream cleanly). It is
	// treated as fenced with an UNKNOWN history, whatever History holds: it is
	// never reconciled by epoch, never authorises a truncation and does not
	// count toward the quorum of known histories. LogEnd and HWM are used if
	// it reported them (zero otherwise), and its HWM counts toward the
	// committed bound. Set it only for a replica whose fence took effect; a
	// replica that could not be fenced at all (Fence itself unimplemented)
	// answers with Err, since its log may still be moving.
	Unimplemented bool
	// LogStart is the lowest offset the replica's log holds
	// (FenceResponse.log_start): records below it were committed and deleted
	// by retention, and its History was trimmed to keep the entry in force
	// at LogStart. 0 from a replica never trimmed or older than log starts.
	// Invariant: LogStart <= HWM (Decide refuses an answer breaking it).
	LogStart uint64
	// LogEnd is the next offset the replica would write.
	// Invariant: HWM <= LogEnd (Decide refuses an answer breaking it).
	LogEnd uint64
	// HWM is the replica's high-water mark: every offset below it is committed.
	HWM uint64
	// History is the replica's epoch journal, already checked with
	// wire.ValidateHistory by the caller. Empty means unknown, unless LogEnd
	// is 0 (wire.HistoryKnown).
	History []journal.EpochStart
	// Incarnation is the incarnation of the data directory that answered
	// (FenceResponse.incarnation; empty from a replica older than
	// incarnations).
	Incarnation string
	// ActingLeader: the replica was acting as leader when this fence
	// stopped it (FenceResponse.acting_leader): adopted, not restarted or
	// halted since. Only then is its HWM the last word on what its epoch
	// acknowledged; a restarted leader's persisted HWM may lag it, and
	// previous_role still says LEADER. Only a planned handover reads it
	// (handoverCandidate).
	ActingLeader bool
	// Halted says why the replica's copy stopped serving
	// (FenceResponse.halted: a safety violation or a store failure), empty
	// while it serves. A halted copy is fenced and its log is a fact, but
	// it refuses Truncate and Adopt until its replica restarts.
	Halted string
}

// Input is everything a promotion decides on.
type Input struct {
	// Replicas is the range's voter set (after the membership change in
	// flight, if any). Its order, then OldVoters' and Learners' for the
	// members not in it, is the order of every list in the Plan.
	Replicas []string
	// Learners are members that fetch but never count: not toward the
	// quorum, the committed bound or the candidate. A fenced learner is
	// reconciled like a follower and adopted as one.
	Learners []string
	// OldVoters is the voter set before the membership change in flight;
	// nil when none is. While it is set the promotion needs a fenced quorum
	// of Replicas AND of OldVoters (joint consensus): a record acknowledged
	// under the old set sits on a quorum of it, and only a fence of a quorum
	// of each set is sure to reach it, whichever set committed it. Members of
	// OldVoters not in Replicas (a removal) are fenced, counted, and never
	// adopted: fencing is what stops them serving.
	OldVoters []string
	// Incarnations is each member's recorded incarnation ("" or absent: none
	// recorded yet, and any answer counts). An answer from another
	// incarnation comes from a replaced or wiped disk: it never counts and
	// its replica is never adopted (Plan.Excluded).
	Incarnations map[string]string
	// Unsafe drops the quorum requirement: one fenced voter with a known
	// history is enough, and a candidate ending below the committed bound
	// leads anyway, from its own log end. Only an operator's explicit
	// --unsafe-accept-data-loss sets it.
	Unsafe bool
	// HighestHWMSeen is the highest HWM known for the range before this
	// promotion (earlier transitions' committed bounds), for the report of
	// what an unsafe promotion may lose.
	HighestHWMSeen uint64
	// Epoch is the epoch E being promoted to. Positive.
	Epoch uint64
	// Preferred optionally names a replica to lead among equally complete
	// candidates ("" for none). It never outranks a more complete log.
	Preferred string
	// HandoverTo names the replica a planned handover moves leadership to
	// ("" for none). It leads even when another fenced log is longer, but
	// only when that is sure to lose no acknowledged record
	// (handoverCandidate): the longer log's extra tail is then records
	// nobody was told are committed, and it is cut. Otherwise the most
	// complete log leads as always and Plan.HandoverRefused says why.
	// Ignored by an unsafe promotion.
	HandoverTo string
	// RangeID, when set, spreads leaderships among equally complete
	// candidates that are not preferred (tieRank); unset, the lowest id
	// leads among them.
	RangeID string
	// Answers holds at most one answer per replica. A replica with no answer
	// is treated like one that answered with an error.
	Answers []Answer
}

// Plan is the promotion's decision. The service carries it out in this order:
// Truncations (while fenced), then Adopt as leader on Candidate with
// CommittedBound, then Adopt as follower on Followers and Unreconciled.
type Plan struct {
	// Candidate is the new leader: the most complete fenced log with a known
	// history.
	// Invariant: the candidate's log end >= CommittedBound.
	Candidate string
	// CommittedBound is the largest HWM among fenced replicas: every offset
	// below it is committed, and the candidate holds all of them.
	CommittedBound uint64
	// Truncations cut diverged replicas back to their divergence point with
	// the candidate.
	// Invariant: each To >= that replica's HWM and To < From == its log end.
	Truncations []Truncation
	// Followers are the other fenced replicas with a known history. After
	// their truncation (if any) each one's log is a prefix of the
	// candidate's: a replica agrees with the candidate before it follows it.
	Followers []string
	// Unreconciled are fenced replicas with an unknown history. They adopt as
	// followers without any truncation; the fetch-time check (KIP-320)
	// reconciles them against the new leader's history, which is known.
	Unreconciled []string
	// Learners are the fenced learners to adopt as followers, after their
	// truncations (in Truncations, like a follower's).
	Learners []string
	// Excluded are fenced replicas that are never adopted: an answer from
	// an incarnation that is not the member's, a learner that cannot be
	// reconciled without cutting below its HWM, a halted copy (it refuses
	// Truncate and Adopt until its replica restarts), or (unsafe) a replica
	// whose committed records the candidate lacks. Each says why in Fenced.
	Excluded []string
	// HighestHWMSeen is the highest HWM known for the range: the input's and
	// the fenced answers'.
	HighestHWMSeen uint64
	// PossiblyLostFrom: offsets [PossiblyLostFrom, HighestHWMSeen) may have
	// been acknowledged and are not on the new leader. It equals
	// HighestHWMSeen unless an unsafe promotion's candidate ends below it.
	PossiblyLostFrom uint64
	// HandoverRefused says why Input.HandoverTo does not lead; empty when it
	// does or none was asked for.
	HandoverRefused string
	// Fenced is one entry per member of Input.Replicas, fenced or not, in
	// that order, for the transition record and the candidate-choice span.
	// Error says why a replica was not fenced or, for a fenced one, why its
	// history is unknown. Decide fills it in also when it returns an
	// Unavailable or DataLoss error (and then nothing else in the Plan).
	Fenced []*tenurev1.FencedReplica
}

// Truncation is one truncation the plan commands.
type Truncation struct {
	ReplicaID string
	// From is the replica's log end as fenced.
	From uint64
	// To is the new log end: records at and above it are removed.
	To uint64
}

// PlanError is why there is no plan. Code is one of
// connect.CodeInvalidArgument (the input is malformed: a caller bug or a peer
// whose answer breaks the protocol's own rules), connect.CodeUnavailable (no
// quorum of fenced replicas with a known history: retry with backoff) or
// connect.CodeDataLoss (a committed-record mismatch, which only a bug or a
// corrupted disk can cause: an operator must look).
type PlanError struct {
	Code connect.Code
	// Message names the replicas and offsets involved.
	Message string
}

func (e *PlanError) Error() string { return "promoter: plan: " + e.Message }

func planErrorf(code connect.Code, format string, args ...any) *PlanError {
	return &PlanError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// memberKind is what a member is to this promotion.
type memberKind int

const (
	// voter: in Input.Replicas (it may be in OldVoters too).
	voter memberKind = iota
	// oldVoter: in OldVoters only (a removal in flight): counted, not adopted.
	oldVoter
	// learner: in Learners only: reconciled and adopted, never counted.
	learner
)

// replicaState is one replica's answer as Decide reasons about it.
type replicaState struct {
	id   string
	kind memberKind
	// inOld: a member of OldVoters (with a change in flight).
	inOld bool
	// vouches: fenced, from the member's own incarnation, and a voter of
	// the old or the new set: its HWM counts toward the committed bound.
	vouches bool
	// counted: vouches and not halted: it counts toward the quorum and can
	// be the candidate.
	// Invariant: counted implies vouches.
	counted bool
	// halted: why the copy stopped serving (Answer.Halted), "" while it
	// serves.
	halted string
	// mismatch: the answer came from another incarnation than the member's.
	mismatch    bool
	incarnation string
	// fenced: the replica answered the fence at E (Unimplemented counts).
	fenced bool
	// actingLeader: it was acting as leader when fenced (Answer.ActingLeader).
	actingLeader bool
	// known: its history can be used to reconcile it by epoch.
	known bool
	// Invariant: logStart <= hwm <= logEnd.
	logStart, logEnd, hwm uint64
	// lastEpoch is the last epoch of its history (0 when unknown or empty).
	lastEpoch uint64
	// history is the replica's epoch history; nil unless known.
	history []journal.EpochStart
	// why it was not fenced, or why its history is unknown.
	reason string
}

func (s replicaState) proto() *tenurev1.FencedReplica {
	return &tenurev1.FencedReplica{
		ReplicaId:     s.id,
		Fenced:        s.fenced,
		HistoryKnown:  s.known,
		LogEnd:        s.logEnd,
		HighWaterMark: s.hwm,
		LastEpoch:     s.lastEpoch,
		Error:         s.reason,
		Incarnation:   s.incarnation,
		Learner:       s.kind == learner,
		Counted:       s.counted,
		Halted:        s.halted,
	}
}

// Decide makes the promotion decision for in. The returned error is always a
// *PlanError.
func Decide(in Input) (Plan, error) {
	states, err := readAnswers(in)
	if err != nil {
		return Plan{}, err
	}
	summary := make([]*tenurev1.FencedReplica, len(states))
	// known: the new voters that count, with a known history: the
	// candidates. knownNew and knownOld count them per voter set.
	var known []replicaState
	knownNew, knownOld := 0, 0
	for i, s := range states {
		summary[i] = s.proto()
		if !s.counted || !s.known {
			continue
		}
		if s.inOld {
			knownOld++
		}
		if s.kind == voter {
			knownNew++
			known = append(known, s)
		}
	}
	// fail keeps the per-replica summary: the transition record and the span
	// show why a promotion stopped.
	fail := func(err *PlanError) (Plan, error) { return Plan{Fenced: summary}, err }

	// Step 3, quorum (invariant 6). Only fenced voters of the member's own
	// incarnation with a known history count: an unfenced log may still be
	// moving, an unknown history cannot be compared by epoch, a learner was
	// never part of a commit, and an answer from another incarnation is a
	// disk that lost what the member held. Any two quorums of one voter set
	// intersect, so a quorum of known, fenced logs includes at least one
	// replica from every quorum that committed a record. With a change in
	// flight a record may have been committed under either set, so a quorum
	// of each must be fenced.
	//
	// A halted copy (stopped serving after a safety violation or a store
	// failure) does not count either, although its log is known: it refuses
	// Adopt and Truncate until its replica restarts, so it can neither lead
	// nor be reconciled. Chosen as the candidate (the most complete log,
	// or the preferred one on a tie), its refused Adopt failed every
	// promotion at every epoch with a quorum of serving replicas beside it;
	// counted toward a quorum that needed it, it made a leader that could
	// never commit. Leaving it out costs no safety: the quorum is counted
	// without it, so the intersection argument holds for the replicas that
	// do count, and they hold every committed record by themselves. It
	// still vouches for its HWM (committedBound) and is checked for a
	// committed-record conflict with the candidate (step 5).
	q := wire.Quorum(len(in.Replicas))
	switch {
	case in.Unsafe:
		// The operator accepted the loss: any fenced voter with a known
		// history can lead. What it lacks is measured below, never hidden.
		if len(known) == 0 {
			return fail(planErrorf(connect.CodeUnavailable,
				"no fenced voter with a known history, even for an unsafe promotion: %s", describe(states)))
		}
	case knownNew < q:
		return fail(planErrorf(connect.CodeUnavailable,
			"no quorum: %d of %d fenced with known history, need %d: %s",
			knownNew, len(in.Replicas), q, describe(states)))
	case in.OldVoters != nil && knownOld < wire.Quorum(len(in.OldVoters)):
		return fail(planErrorf(connect.CodeUnavailable,
			"no quorum of the voters before the change in flight: %d of %d fenced with known history, need %d: %s",
			knownOld, len(in.OldVoters), wire.Quorum(len(in.OldVoters)), describe(states)))
	}

	bound := committedBound(states)
	// The candidate is a voter of the new set: it leads under that set. A
	// removed voter's records count through the bound: with single-replica
	// changes every quorum of the old set meets every quorum of the new, so
	// a committed record is on a fenced new voter, and the bound check below
	// catches the case where it is not.
	cand := chooseCandidate(known, in.Preferred, in.RangeID)
	highest := max(in.HighestHWMSeen, bound)
	var handoverRefused string
	if t := in.HandoverTo; t != "" && t != cand.id && !in.Unsafe {
		if target, why := handoverCandidate(states, cand, t, bound); why != "" {
			handoverRefused = why
		} else {
			cand = target
		}
	}

	// Step 4. The candidate is the most complete log, so it must hold every
	// committed record; if it ends below the bound some replica's HWM
	// vouches for a record no candidate has, and adopting would lose it.
	if cand.logEnd < bound {
		if !in.Unsafe {
			return fail(planErrorf(connect.CodeDataLoss,
				"candidate %s (last epoch %d) ends at %d, below the committed bound %d (HWM of %s): the most complete log lacks committed records",
				cand.id, cand.lastEpoch, cand.logEnd, bound, hwmOwners(states, bound)))
		}
		// Unsafe: the new leader cannot vouch for offsets it lacks, so the
		// bound it adopts is its own log end; what lies between is reported
		// as possibly lost.
		bound = cand.logEnd
	}

	// Step 5, reconcile while fenced.
	plan := Plan{Candidate: cand.id, CommittedBound: bound, Fenced: summary,
		HighestHWMSeen: highest, PossiblyLostFrom: min(cand.logEnd, highest), HandoverRefused: handoverRefused}
	exclude := func(i int, why string) {
		plan.Excluded = append(plan.Excluded, states[i].id)
		summary[i].Error = why
	}
	var losses []string
	for i, s := range states {
		if !s.fenced || s.id == cand.id {
			continue
		}
		if s.mismatch {
			// Not the member: never adopted (the replica refuses such a
			// fence itself; this covers one that does not check).
			exclude(i, s.reason)
			continue
		}
		if s.kind == oldVoter {
			// Being removed: fenced so it stops serving, counted above,
			// never adopted under the new set.
			continue
		}
		if s.halted != "" {
			// It refuses Truncate and Adopt until its replica restarts: a
			// plan that commands either fails after the fence, and the
			// retry at the next epoch makes the same plan. So it is neither
			// truncated nor adopted; it stays fenced at E, and once its
			// replica restarts the reconcile loop adopts it as a follower
			// and the fetch check cuts whatever diverged, never below its
			// HWM. What it holds below its HWM is committed by its word:
			// if the candidate holds other records there, the two
			// disagree about a committed record and, as for any replica,
			// that is DataLoss, not ours to settle (invariant 3). The halt
			// may be exactly that disagreement, and this copy the right one.
			if s.known && !in.Unsafe && s.kind != learner {
				if target := reconcileTarget(cand, s); target < s.hwm {
					losses = append(losses, fmt.Sprintf(
						"%s (stopped serving; last epoch %d, log end %d, HWM %d) diverges from candidate %s (last epoch %d, log end %d) at %d, below its HWM",
						s.id, s.lastEpoch, s.logEnd, s.hwm, cand.id, cand.lastEpoch, cand.logEnd, target))
					continue
				}
			}
			exclude(i, fmt.Sprintf("not truncated, not adopted: %s", s.reason))
			continue
		}
		if !s.known {
			// Unknown history never authorises a truncation: its offsets are
			// bare numbers. The fetch check reconciles it against the
			// leader's (known) history once it follows. A learner is
			// adopted the same way.
			plan.Unreconciled = append(plan.Unreconciled, s.id)
			continue
		}
		target := reconcileTarget(cand, s)
		// target <= s.logEnd always; equal means its whole log is a prefix
		// of the candidate's and there is nothing to cut.
		if target < s.logEnd {
			// Below its own HWM the replica holds committed records, and the
			// candidate holds different ones at the same offsets: two
			// replicas disagree about a committed record. Not ours to pick
			// a winner; stop (invariant 3).
			if target < s.hwm && (in.Unsafe || s.kind == learner) {
				// Unsafe: it holds committed records the new leader lacks
				// (reported as possibly lost); a learner's HWM never counted.
				// Either way it is not cut below its HWM (invariant 3): it
				// stays fenced, to be removed and added again.
				exclude(i, fmt.Sprintf("not adopted: its HWM %d is above the cut to %d that would reconcile it with %s", s.hwm, target, cand.id))
				continue
			}
			if target < s.hwm {
				losses = append(losses, fmt.Sprintf(
					"%s (last epoch %d, log end %d, HWM %d) diverges from candidate %s (last epoch %d, log end %d) at %d, below its HWM",
					s.id, s.lastEpoch, s.logEnd, s.hwm, cand.id, cand.lastEpoch, cand.logEnd, target))
				continue
			}
			// At or above its HWM but possibly below the committed bound:
			// a deposed leader's tail that a later epoch overwrote at the
			// same offsets. Normal. Never below its log start either: that
			// is at or below its HWM (readAnswer).
			plan.Truncations = append(plan.Truncations, Truncation{ReplicaID: s.id, From: s.logEnd, To: target})
		}
		// Cut or not, its log is now a prefix of the candidate's. One that
		// lags (log end below the bound) is not an error: it catches up by
		// fetching, and counts toward commits only once the fetch check
		// passes.
		if s.kind == learner {
			plan.Learners = append(plan.Learners, s.id)
			continue
		}
		plan.Followers = append(plan.Followers, s.id)
	}
	if len(losses) > 0 {
		return fail(planErrorf(connect.CodeDataLoss,
			"truncation below a committed record: %s", strings.Join(losses, "; ")))
	}
	return plan, nil
}

// handoverCandidate returns target's state when a planned handover may make
// it lead although best, the most complete fenced log, is longer; otherwise
// why not (and best leads).
//
// Leading from a shorter log cuts best's tail beyond it, so that is allowed
// only when the tail is sure to hold no acknowledged record, and the fenced
// leader knows exactly what was acknowledged, if it was still acting as
// leader (not restarted since its adoption, whose persisted HWM may lag
// what it acknowledged). One leader acts at an epoch;
// it acknowledges a record only once its HWM has passed it, and its fence
// stopped it raising its HWM, so the HWM it answered bounds every
// acknowledgement made at its epoch. Every record acknowledged at an earlier
// epoch is in its log below its own epoch start: the promotion that made it
// leader chose it as the most complete log, holding all of them. No later
// epoch acknowledged anything: such a record would sit on a quorum of
// voters, hence on a fenced one (quorums intersect), whose last epoch would
// then beat best's. So with l the fenced replica that was acting as leader
// at best's last epoch, every acknowledged offset is below max(l's HWM, l's
// epoch start), and a target whose log is a prefix of l's reaching that far
// holds every acknowledged record.
//
// Without l's answer (the leader is dead or did not answer in time) the
// bound is not known, only the quorum's HWMs, which can lag the leader's
// acknowledgements; then only the most complete log is safe, as always.
func handoverCandidate(states []replicaState, best replicaState, target string, bound uint64) (replicaState, string) {
	var t, l *replicaState
	for i := range states {
		s := &states[i]
		if s.id == target {
			t = s
		}
		// Only a counted, known answer: a learner never led, and another
		// incarnation's word is not the member's.
		if s.counted && s.known && s.actingLeader && s.lastEpoch == best.lastEpoch && s.lastEpoch > 0 {
			l = s
		}
	}
	switch {
	case t == nil || t.kind != voter:
		return replicaState{}, fmt.Sprintf("%s is not a voter of the range", target)
	case !t.fenced:
		return replicaState{}, fmt.Sprintf("%s was not fenced (%s)", target, t.reason)
	case !t.counted || !t.known:
		return replicaState{}, fmt.Sprintf("%s does not count (%s)", target, t.reason)
	case l == nil:
		return replicaState{}, fmt.Sprintf("no replica answered the fence as the acting leader at epoch %d, the only one that knows what was acknowledged (one restarted since its adoption may have acknowledged beyond its persisted HWM); %s (log end %d) leads as the most complete log",
			best.lastEpoch, best.id, best.logEnd)
	}
	start := l.history[len(l.history)-1].Start
	// need is the end of what may have been acknowledged; bound (the
	// largest counted HWM) is at most l's HWM in a correct cluster, and is
	// taken too so that the plan's own bound check never fires for it.
	need := max(l.hwm, start, bound)
	// A prefix of l's log: nothing of t's is cut to follow l, so nothing of
	// l's below t's end differs from t's.
	if d := reconcileTarget(*l, *t); d < t.logEnd {
		return replicaState{}, fmt.Sprintf("%s diverges from the leader %s at %d, below its log end %d", target, l.id, d, t.logEnd)
	}
	if t.logEnd < need {
		return replicaState{}, fmt.Sprintf("%s ends at %d, below %d, where the records leader %s may have acknowledged end (HWM %d, epoch %d from %d): it lacks %d of them",
			target, t.logEnd, need, l.id, l.hwm, l.lastEpoch, start, need-t.logEnd)
	}
	// Every other replica is reconciled with t without a cut below its own
	// HWM (invariant 3). It follows from the above in a correct cluster;
	// checked, so that a refusal here keeps the promotion going with best
	// rather than failing it with DataLoss after the fence.
	for _, s := range states {
		if s.id == t.id || !s.fenced || !s.known || s.mismatch || s.kind == oldVoter {
			continue
		}
		if d := reconcileTarget(*t, s); d < s.hwm {
			return replicaState{}, fmt.Sprintf("following %s would cut %s to %d, below its HWM %d", target, s.id, d, s.hwm)
		}
	}
	return *t, ""
}

// committedBound is the largest HWM among fenced replicas.
//
// Halted copies count here (vouches, not counted): an HWM is what a leader
// told the replica was committed, and a copy halted for a safety violation
// may be the one that is right. Its HWM can only raise the bound, so a
// candidate lacking records it vouches for aborts with DataLoss rather
// than leads without them.
//
// Replicas with an unknown history count here too. An HWM is a fact about
// what was acknowledged, independent of the journal: the replica raised it
// only on a leader's word, and the journal only attributes offsets to epochs.
// Leaving such an HWM out could only lower the bound, which would weaken the
// candidate check below (a candidate missing records that replica saw
// committed would pass) and let the new leader start below an HWM readers have
// already been served from (a step back). Unfenced replicas do not count: an
// answer that is not a fence is not a fact about a stopped log.
//
// Only vouching answers: a learner's HWM came from a leader that never
// counted it, and an answer from another incarnation is not the member's.
func committedBound(states []replicaState) uint64 {
	var bound uint64
	for _, s := range states {
		if s.vouches {
			bound = max(bound, s.hwm)
		}
	}
	return bound
}

// chooseCandidate returns the most complete of known (non-empty, all fenced
// with a known history).
func chooseCandidate(known []replicaState, preferred, rangeID string) replicaState {
	best := known[0]
	for _, s := range known[1:] {
		if moreComplete(s, best, preferred, rangeID) {
			best = s
		}
	}
	return best
}

// moreComplete reports whether a should lead rather than b.
func moreComplete(a, b replicaState, preferred, rangeID string) bool {
	// The last epoch first (Raft §5.4.1): a log that saw a later leadership
	// has whatever that leader committed, while a longer log with an older
	// last epoch can be a deposed leader's tail of records that never reached
	// a quorum and were overwritten.
	if a.lastEpoch != b.lastEpoch {
		return a.lastEpoch > b.lastEpoch
	}
	// Same last epoch: one leader wrote both suffixes, in one order, so the
	// shorter log is a prefix of the longer.
	if a.logEnd != b.logEnd {
		return a.logEnd > b.logEnd
	}
	// Equally complete (identical logs): the operator's preference, then
	// the highest tieRank (the lowest id without a range id), so the same
	// answers always give the same leader.
	if (a.id == preferred) != (b.id == preferred) {
		return a.id == preferred
	}
	if rangeID != "" {
		if ra, rb := tieRank(rangeID, a.id), tieRank(rangeID, b.id); ra != rb {
			return ra > rb
		}
	}
	return a.id < b.id
}

// tieRank orders equally complete candidates for one range: a hash of the
// range and the replica (rendezvous hashing). By lowest id alone, every
// range a failed replica led would move to the same survivor, which would
// then lead twice its share (all of them, in a mass failover of a
// three-replica cluster); ranked per range, they spread evenly over the
// survivors, and each range still always picks the same one.
func tieRank(rangeID, replicaID string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(rangeID))
	h.Write([]byte{0})
	h.Write([]byte(replicaID))
	return h.Sum64()
}

// reconcileTarget is the log end r must be cut back to so that its log is a
// prefix of the candidate's: min(r's log end, divergence point, candidate's
// log end). Both histories are known.
//
// With log starts (retention), only [max of the two starts, min of the two
// ends) is held by both: below the larger start the records are committed
// and deleted on one side, and DivergencePoint compares trimmed histories
// only where both hold records.
// A replica whose log ends at or below the candidate's log start is not cut:
// everything it holds is below what the new leader holds, and its fetch is
// answered below_log_start, which resets it to the leader's start.
func reconcileTarget(cand, r replicaState) uint64 {
	// A truncation only ever removes: never beyond r's own end.
	target := r.logEnd
	if r.logEnd <= cand.logStart {
		// Nothing of r's is at or above the candidate's log start: no
		// record to compare or cut. (r's HWM <= its log end <= the
		// candidate's start, so the follower path's reset is allowed.)
		return target
	}
	// Beyond the candidate's end r holds records the candidate lacks, and the
	// new leader writes its epoch-start record at exactly that offset.
	target = min(target, cand.logEnd)
	if lo := max(cand.logStart, r.logStart); lo > 0 && (len(cand.history) == 0 || len(r.history) == 0) {
		// A log reset to a log start holds no record and has an empty
		// journal (known: readAnswer): nothing of it disagrees with the
		// other log, and the log ends above bound the target.
		return target
	}
	// DivergencePoint compares trimmed histories where both logs hold
	// records (pkg/journal). A point below r's log start would be below
	// its HWM (readAnswer: log start <= HWM), which Decide refuses or
	// excludes: no truncation is ever planned below a log start.
	d, ok := journal.DivergencePoint(cand.history, r.history)
	if !ok {
		// One history is empty, and both are known, so that log is empty
		// (wire.HistoryKnown): nothing is shared beyond offset 0. The log-end
		// bounds above already give 0; say it rather than rely on it.
		d = 0
	}
	// At and above the divergence point the two logs hold records of
	// different leaderships even where the offsets coincide; below it both
	// wrote under identical leadership and hold identical records.
	return min(target, d)
}

// readAnswers checks in and turns each member's answer into a replicaState,
// in the order of in.Replicas.
func readAnswers(in Input) ([]replicaState, error) {
	if in.Epoch == 0 {
		return nil, planErrorf(connect.CodeInvalidArgument, "epoch 0 is \"no grant yet\", not an epoch to promote to")
	}
	if len(in.Replicas) == 0 || len(in.Replicas) > wire.MaxReplicas {
		return nil, planErrorf(connect.CodeInvalidArgument, "replica set has %d members, want 1 to %d", len(in.Replicas), wire.MaxReplicas)
	}
	if in.OldVoters != nil && (len(in.OldVoters) == 0 || len(in.OldVoters) > wire.MaxReplicas) {
		return nil, planErrorf(connect.CodeInvalidArgument, "old voter set has %d members, want 1 to %d", len(in.OldVoters), wire.MaxReplicas)
	}
	var states []replicaState
	member := make(map[string]int)
	add := func(set string, ids []string, kind memberKind) error {
		seen := make(map[string]bool, len(ids))
		for i, id := range ids {
			if err := wire.ValidateReplicaID(id); err != nil {
				return planErrorf(connect.CodeInvalidArgument, "%s %d: %v", set, i, err)
			}
			if seen[id] {
				return planErrorf(connect.CodeInvalidArgument, "replica %s is listed twice in the %s", id, set)
			}
			seen[id] = true
			if j, ok := member[id]; ok {
				if kind == learner {
					return planErrorf(connect.CodeInvalidArgument, "replica %s is both a voter and a learner", id)
				}
				// A voter of both sets.
				states[j].inOld = true
				continue
			}
			member[id] = len(states)
			states = append(states, replicaState{id: id, kind: kind, inOld: kind == oldVoter, reason: "no answer"})
		}
		return nil
	}
	if err := add("voter set", in.Replicas, voter); err != nil {
		return nil, err
	}
	if err := add("old voter set", in.OldVoters, oldVoter); err != nil {
		return nil, err
	}
	if err := add("learner set", in.Learners, learner); err != nil {
		return nil, err
	}
	if len(states) > 2*wire.MaxReplicas {
		return nil, planErrorf(connect.CodeInvalidArgument, "%d members, at most %d", len(states), 2*wire.MaxReplicas)
	}
	// Only a voter of the new set can lead, so only one can be preferred.
	if j, ok := member[in.Preferred]; in.Preferred != "" && (!ok || states[j].kind != voter) {
		return nil, planErrorf(connect.CodeInvalidArgument, "preferred replica %q is not in the replica set %v", in.Preferred, in.Replicas)
	}

	answered := make([]bool, len(states))
	for _, a := range in.Answers {
		i, ok := member[a.ReplicaID]
		if !ok {
			return nil, planErrorf(connect.CodeInvalidArgument, "answer from %q, which is not in the replica set %v", a.ReplicaID, memberIDs(states))
		}
		if answered[i] {
			return nil, planErrorf(connect.CodeInvalidArgument, "two answers from replica %s", a.ReplicaID)
		}
		answered[i] = true
		s, err := readAnswer(a, in.Epoch)
		if err != nil {
			return nil, err
		}
		s.kind, s.inOld = states[i].kind, states[i].inOld
		s.incarnation = a.Incarnation
		if want := in.Incarnations[a.ReplicaID]; s.fenced && want != "" && a.Incarnation != want {
			// Invariant 6 for members, not ids: the same id from another
			// data directory (a replaced or wiped disk) holds none of what
			// the member acknowledged, and an empty log would count as a
			// complete one.
			s.mismatch = true
			s.known = false
			s.reason = fmt.Sprintf("incarnation %q is not the member's %q: its disk was replaced or wiped; not counted, not adopted (rebuild it: tenurectl range rebuild RANGE --replica %s)", a.Incarnation, want, a.ReplicaID)
		}
		s.vouches = s.fenced && !s.mismatch && s.kind != learner
		if s.fenced && a.Halted != "" {
			// Fenced, and its log a fact (its HWM vouches), but it takes
			// no Truncate or Adopt until its replica restarts: it cannot
			// lead or follow, so it does not count toward the quorum.
			s.halted = a.Halted
			if !s.mismatch {
				why := fmt.Sprintf("stopped serving (%s): it refuses Truncate and Adopt until its replica restarts; not counted", a.Halted)
				if s.reason != "" {
					why += "; " + s.reason
				}
				s.reason = why
			}
		}
		s.counted = s.vouches && s.halted == ""
		states[i] = s
	}
	return states, nil
}

// readAnswer checks one answer against the rules its replica must keep.
func readAnswer(a Answer, epoch uint64) (replicaState, error) {
	s := replicaState{id: a.ReplicaID}
	if a.Err != nil {
		s.reason = "not fenced: " + a.Err.Error()
		return s, nil
	}
	// A replica never vouches for committed records it does not hold.
	if a.HWM > a.LogEnd {
		return s, planErrorf(connect.CodeInvalidArgument, "replica %s reports HWM %d above its log end %d", a.ReplicaID, a.HWM, a.LogEnd)
	}
	// Retention removes only committed records. A log start above the HWM
	// would let a truncation that respects the HWM still cut below the log
	// start.
	if a.LogStart > a.HWM {
		return s, planErrorf(connect.CodeInvalidArgument, "replica %s reports log start %d above its HWM %d", a.ReplicaID, a.LogStart, a.HWM)
	}
	s.fenced, s.logStart, s.logEnd, s.hwm, s.actingLeader = true, a.LogStart, a.LogEnd, a.HWM, a.ActingLeader
	if a.Unimplemented {
		s.reason = "history unknown: the replica does not report it (older version)"
		return s, nil
	}
	h := journal.ToWire(a.History)
	// A log reset to a leader's log start holds nothing and has an empty
	// journal: known (wire.HistoryKnownFrom).
	if !wire.HistoryKnownFrom(h, a.LogStart, a.LogEnd) {
		s.reason = fmt.Sprintf("history unknown: empty history with log end %d (missing or broken journal)", a.LogEnd)
		return s, nil
	}
	// The caller validated the history; that it fits the log it describes is
	// checked again here, where the decision depends on it. A history
	// claiming an epoch that starts past the log end would make the
	// divergence arithmetic attribute records that do not exist.
	if err := wire.ValidateHistoryAgainstLog(h, a.LogEnd); err != nil {
		return s, planErrorf(connect.CodeInvalidArgument, "replica %s: %v", a.ReplicaID, err)
	}
	if n := len(a.History); n > 0 {
		s.lastEpoch = a.History[n-1].Epoch
		// A replica that accepted the fence at E was fenced at most at E and
		// never acts under an epoch above its fence (invariant 4), so it
		// cannot have journaled one. Such a claim would win the candidate
		// choice outright; refuse it. (E itself is possible: a replica that
		// already adopted at E answering a repeated fence.)
		if s.lastEpoch > epoch {
			return s, planErrorf(connect.CodeInvalidArgument, "replica %s fenced at epoch %d reports a history up to epoch %d", a.ReplicaID, epoch, s.lastEpoch)
		}
	}
	s.known = true
	s.history = a.History
	return s, nil
}

// describe lists each replica's standing, for the no-quorum message.
func describe(states []replicaState) string {
	parts := make([]string, len(states))
	for i, s := range states {
		switch {
		case s.fenced && s.kind == learner:
			parts[i] = fmt.Sprintf("%s fenced, a learner (never counts)", s.id)
		case s.fenced && s.halted != "":
			parts[i] = fmt.Sprintf("%s fenced, %s", s.id, s.reason)
		case s.fenced && s.known:
			parts[i] = fmt.Sprintf("%s fenced, history known (log end %d, HWM %d, last epoch %d)", s.id, s.logEnd, s.hwm, s.lastEpoch)
		case s.fenced:
			parts[i] = fmt.Sprintf("%s fenced, %s", s.id, s.reason)
		default:
			parts[i] = fmt.Sprintf("%s %s", s.id, s.reason)
		}
	}
	return strings.Join(parts, "; ")
}

// hwmOwners names the fenced replicas whose HWM is the bound.
func hwmOwners(states []replicaState, bound uint64) string {
	var ids []string
	for _, s := range states {
		if s.vouches && s.hwm == bound {
			ids = append(ids, s.id)
		}
	}
	return strings.Join(ids, ", ")
}

// MembersOf reads a range's membership as a promotion needs it: the voters
// and learners of its replica set, the voters before the change in flight
// (nil when none is), each member's recorded incarnation, and every replica
// to fence: the members, then the old members a removal in flight dropped
// (fencing is what stops them serving).
func MembersOf(rng *tenurev1.RangeInfo) (voters, learners, oldVoters []string, incarnations map[string]string, fence []*tenurev1.Replica) {
	incarnations = make(map[string]string)
	inSet := make(map[string]bool)
	for _, r := range rng.GetReplicas() {
		inSet[r.GetId()] = true
		fence = append(fence, r)
		if inc := r.GetIncarnation(); inc != "" {
			incarnations[r.GetId()] = inc
		}
		if r.GetLearner() {
			learners = append(learners, r.GetId())
		} else {
			voters = append(voters, r.GetId())
		}
	}
	if ch := rng.GetChange(); ch != nil {
		oldVoters = []string{}
		for _, r := range ch.GetOldReplicas() {
			if !r.GetLearner() {
				oldVoters = append(oldVoters, r.GetId())
			}
			if !inSet[r.GetId()] {
				inSet[r.GetId()] = true
				fence = append(fence, r)
				if inc := r.GetIncarnation(); inc != "" {
					incarnations[r.GetId()] = inc
				}
			}
		}
	}
	return voters, learners, oldVoters, incarnations, fence
}

// memberIDs lists the members' ids, for messages.
func memberIDs(states []replicaState) []string {
	ids := make([]string, len(states))
	for i, s := range states {
		ids[i] = s.id
	}
	return ids
}
