package replica

import (
	"slices"

	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// This file holds the replica's decisions as pure functions of their inputs:
// the commit rule, the leader's fetch check, the follower's truncation target
// and its validation of a leader's answer. The service code around them does
// the IO; these are what the table tests pin down.

// commitPoint is the commit rule. It returns the offset below which a quorum
// of the replica set holds every record durably: ownDurable is the leader's
// own durable log end, followers the checked fetch offsets of the other
// members (a member that has not passed the fetch check is absent or 0), and
// replicas the size of the set, leader included.
//
// ok is false while the quorum offset does not cover epochStart, the offset
// of this epoch's epoch-start record (Raft section 5.4.2): records of earlier
// epochs are committed only through the current leader's own record. Counting
// them on their own would acknowledge a previous epoch's tail that a later
// promotion may still choose to overwrite, if this leader is deposed before
// its own epoch reaches a quorum.
func commitPoint(ownDurable uint64, followers []uint64, replicas int, epochStart uint64) (uint64, bool) {
	if replicas < 1 || len(followers) > replicas-1 {
		// A caller that counts more followers than the set has other
		// members would let strangers vote; refuse rather than guess.
		return 0, false
	}
	ends := make([]uint64, replicas) // members that have not fetched count 0
	ends[0] = ownDurable
	copy(ends[1:], followers)
	slices.Sort(ends)
	slices.Reverse(ends)
	// ends[q-1] is the largest offset that q members have reached.
	at := ends[wire.Quorum(replicas)-1]
	// The epoch-start record sits at epochStart, so a quorum holds it once
	// the quorum offset is strictly above it.
	if at <= epochStart {
		return 0, false
	}
	return at, true
}

// checkFetch is the leader's KIP-320 check of a follower's fetch position:
// the follower's log ends at fetchOffset and its record at fetchOffset-1 was
// written under lastFetchedEpoch. h is the leader's history and logEnd its
// log end. It returns nil when the follower's log is a prefix of the
// leader's, so fetchOffset may count toward the commit; otherwise where the
// follower must truncate to.
//
// The follower agrees exactly when the leader's history has lastFetchedEpoch
// itself (not just an earlier epoch covering it) and that epoch runs on the
// leader at least to fetchOffset. A follower whose last record is of an epoch
// the leader never had, or that holds more of an epoch than the leader wrote,
// holds records the leader does not: counting its offset would count bytes it
// lacks.
func checkFetch(h []journal.EpochStart, logEnd, lastFetchedEpoch, fetchOffset uint64) *tenurev1.DivergingEpoch {
	if fetchOffset == 0 && lastFetchedEpoch == 0 {
		// An empty log is a prefix of every log: nothing to disagree about.
		return nil
	}
	found, end, ok := journal.EndOffsetFor(h, lastFetchedEpoch, logEnd)
	if !ok {
		// No leader epoch at or below the follower's: nothing the follower
		// holds can be vouched for, so it must start over (never below its
		// own HWM, which the follower enforces).
		return &tenurev1.DivergingEpoch{}
	}
	if found != lastFetchedEpoch || end < fetchOffset {
		return &tenurev1.DivergingEpoch{Epoch: found, EndOffset: end}
	}
	return nil
}

// checkFetchFrom is checkFetch for a leader whose log starts at logStart
// (records below it were committed and deleted by retention) and whose
// history h was trimmed from the front to keep only the entry in force at
// logStart. below says the leader cannot answer the follower from what it
// holds: the follower must start over at logStart (FetchResponse's
// below_log_start), and d is nil then. Otherwise d is checkFetch's answer.
//
// lastFetchedEpoch 0 with a positive fetchOffset is a follower whose log is
// empty and starts at fetchOffset (it was reset to a leader's log start, so
// everything below fetchOffset is committed): no record of its own is at
// stake, so the only question is whether fetchOffset is an offset this leader
// can continue from.
func checkFetchFrom(h []journal.EpochStart, logStart, logEnd, lastFetchedEpoch, fetchOffset uint64) (d *tenurev1.DivergingEpoch, below bool) {
	if lastFetchedEpoch == 0 && fetchOffset > 0 {
		switch {
		case fetchOffset < logStart:
			// The records it needs next were deleted here; it resets again,
			// to this leader's start.
			return nil, true
		case fetchOffset > logEnd:
			// It claims a committed prefix longer than this leader's whole
			// log: every committed record is in every leader's log, so one
			// of the two is wrong. The follower's HWM is fetchOffset, so the
			// empty divergence stops it with the reason instead of cutting.
			return &tenurev1.DivergingEpoch{}, false
		}
		// logStart <= fetchOffset <= logEnd: what it holds (nothing) is a
		// prefix of this log from fetchOffset, by commitment. Counting the
		// offset commits nothing of this epoch alone: the epoch-start record
		// is at or above it.
		return nil, false
	}
	if logStart == 0 {
		// Never trimmed (or a leader's log before log starts existed): the
		// whole history is here and checkFetch decides exactly as always.
		return checkFetch(h, logEnd, lastFetchedEpoch, fetchOffset), false
	}
	if fetchOffset < logStart {
		// The records from fetchOffset are gone here, and the pair's record
		// at fetchOffset-1 is below what this leader can vouch for: the
		// follower lacks only committed records, deleted on purpose.
		return nil, true
	}
	if len(h) > 0 && lastFetchedEpoch < h[0].Epoch {
		// The follower's last epoch precedes the first entry the trimmed
		// history keeps: where that epoch ended here was trimmed with the
		// records, so no divergence point can be computed (an empty
		// divergence would tell it to cut to 0). Its records from h[0].Start
		// up to fetchOffset are all under older epochs than this log holds
		// there; h[0].Start <= logStart, so below_log_start (reset, or stop
		// if its HWM is above logStart) is the exact answer.
		return nil, true
	}
	// lastFetchedEpoch is at or above the first kept entry: checkFetch's
	// answer uses only entries that are kept, and ends at or above logStart
	// (the entry after the one in force at logStart starts above it).
	return checkFetch(h, logEnd, lastFetchedEpoch, fetchOffset), false
}

// followerTruncateTarget is where a follower with history own and log end
// logEnd truncates on a Diverging answer d (KIP-279): the smaller of where
// the covering epoch d.Epoch ends on the leader and where the follower's own
// stretch of that epoch (or of its largest epoch at or below it) ends. The
// leader's end alone is not enough: a follower whose later epoch the leader
// never had would keep that epoch's records whenever the leader's covering
// epoch ran on past them. Records at and above the target are the
// follower's, not the leader's; the next fetch rechecks what remains.
//
// A follower whose own history is unknown cannot tell its stretches apart
// and truncates to its HWM, the most it can keep without evidence.
//
// ok is false when the target is below the follower's HWM: the leader claims
// a committed record of ours is not in its log. That is a safety violation
// (invariant 3), never a truncation.
func followerTruncateTarget(d *tenurev1.DivergingEpoch, own []journal.EpochStart, logEnd, hwm uint64) (target uint64, ok bool) {
	target = min(d.GetEndOffset(), logEnd)
	switch _, end, known := journal.EndOffsetFor(own, d.GetEpoch(), logEnd); {
	case known:
		// Our largest epoch at or below the leader's covering epoch ends
		// at end here; what follows it is ours alone.
		target = min(target, end)
	case len(own) == 0:
		target = min(target, hwm)
	default:
		// Every epoch of ours is above the leader's covering epoch: none of
		// our records is vouched for by the leader's history.
		target = 0
	}
	// Invariant 3: no truncation removes a committed record.
	return target, target >= hwm
}

// validateFetchAnswer checks a leader's answer to a fetch at (epoch,
// fetchOffset, lastFetchedEpoch) before the follower acts on it. A leader's
// answer is a claim like any peer's: records must continue the follower's log
// exactly at fetchOffset, in offset order, under sane epochs, within the wire
// bounds.
func validateFetchAnswer(epoch, fetchOffset, lastFetchedEpoch uint64, a *tenurev1.FetchResponse) error {
	// Invariant 4: nothing from another epoch. A lower epoch is a deposed
	// leader; a higher one a leader this replica was never fenced for.
	if a.GetEpoch() != epoch {
		return invalidf("fetch answer at epoch %d, want %d", a.GetEpoch(), epoch)
	}
	if a.GetHighWaterMark() > a.GetLogEnd() {
		return invalidf("fetch answer HWM %d is beyond its log end %d", a.GetHighWaterMark(), a.GetLogEnd())
	}
	if a.GetBelowLogStart() {
		if len(a.GetRecords()) > 0 || a.GetDiverging() != nil {
			return invalidf("fetch answer below the log start carries records or a divergence")
		}
		// 0 is "not trimmed": nothing can be below it. (Its HWM is 0, for
		// followers that do not know the field: see the leader's
		// belowLogStart.)
		if a.GetLogStart() == 0 || a.GetLogStart() > a.GetLogEnd() {
			return invalidf("fetch answer says below the log start, but the log start is %d (log end %d)", a.GetLogStart(), a.GetLogEnd())
		}
		return nil
	}
	// Retention removes only committed records: a leader's log start is
	// never above its HWM. A follower raises its own log start to it, so an
	// impossible one is refused before it deletes anything.
	if a.GetLogStart() > a.GetHighWaterMark() {
		return invalidf("fetch answer log start %d is beyond its HWM %d", a.GetLogStart(), a.GetHighWaterMark())
	}
	if d := a.GetDiverging(); d != nil {
		if len(a.GetRecords()) > 0 {
			return invalidf("fetch answer has both records and a divergence")
		}
		// The leader's covering epoch is at or below ours (it is the largest
		// of its epochs at or below lastFetchedEpoch), and ends within its log.
		if d.GetEpoch() > lastFetchedEpoch {
			return invalidf("diverging epoch %d is above our last fetched epoch %d", d.GetEpoch(), lastFetchedEpoch)
		}
		if d.GetEndOffset() > a.GetLogEnd() {
			return invalidf("diverging end %d is beyond the leader's log end %d", d.GetEndOffset(), a.GetLogEnd())
		}
		return nil
	}
	recs := a.GetRecords()
	if len(recs) > wire.MaxBatchRecords {
		return invalidf("fetch answer has %d records, at most %d", len(recs), wire.MaxBatchRecords)
	}
	if fetchOffset > a.GetLogEnd() {
		return invalidf("fetch answer accepted offset %d beyond the leader's log end %d", fetchOffset, a.GetLogEnd())
	}
	// The leader accepted our offset, so it holds the records from there:
	// an offset below its log start would have been answered
	// below_log_start.
	if fetchOffset < a.GetLogStart() {
		return invalidf("fetch answer accepted offset %d below the leader's log start %d", fetchOffset, a.GetLogStart())
	}
	if uint64(len(recs)) > a.GetLogEnd()-fetchOffset {
		return invalidf("fetch answer has %d records from %d, past the leader's log end %d", len(recs), fetchOffset, a.GetLogEnd())
	}
	prev := lastFetchedEpoch
	total := 0
	for i, r := range recs {
		if r == nil {
			return invalidf("fetch answer record %d is missing", i)
		}
		if want := fetchOffset + uint64(i); r.GetOffset() != want {
			return invalidf("fetch answer record %d has offset %d, want %d", i, r.GetOffset(), want)
		}
		// Epochs never decrease along a log, start after our last record's
		// epoch (the check passed, so the leader's log continues ours), and
		// never exceed the leader's epoch; 0 is never written.
		if r.GetEpoch() == 0 || r.GetEpoch() < prev || r.GetEpoch() > epoch {
			return invalidf("fetch answer record at %d has epoch %d (previous %d, leader %d)", r.GetOffset(), r.GetEpoch(), prev, epoch)
		}
		prev = r.GetEpoch()
		if len(r.GetValue()) > wire.MaxRecordBytes {
			return invalidf("fetch answer record at %d is %d bytes, at most %d", r.GetOffset(), len(r.GetValue()), wire.MaxRecordBytes)
		}
		if r.GetEpochStart() && len(r.GetValue()) > 0 {
			return invalidf("fetch answer epoch-start record at %d carries %d bytes", r.GetOffset(), len(r.GetValue()))
		}
		total += len(r.GetValue())
	}
	if total > wire.MaxBatchBytes {
		return invalidf("fetch answer carries %d bytes, at most %d", total, wire.MaxBatchBytes)
	}
	return nil
}
