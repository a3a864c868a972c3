package journal

import (
	"fmt"
	"math"
	"sort"
)

// checkHistory reports how h breaks the history rules, if it does: at most MaxEntries
// entries, epochs positive and strictly increasing, starts never decreasing.
// Every way into a Journal (Open, Create, Record) keeps these true.
func checkHistory(h []EpochStart) error {
	if len(h) > MaxEntries {
		return fmt.Errorf("%d entries, at most %d", len(h), MaxEntries)
	}
	for i, e := range h {
		// Epoch 0 is "no grant yet": no record is ever written under it.
		if e.Epoch == 0 {
			return fmt.Errorf("entry %d has epoch 0", i)
		}
		if i == 0 {
			continue
		}
		p := h[i-1]
		// Epochs are granted by a compare-and-swap and never reused, so each
		// leadership appears once and later ones are larger.
		if e.Epoch <= p.Epoch {
			return fmt.Errorf("entry %d epoch %d does not exceed entry %d epoch %d", i, e.Epoch, i-1, p.Epoch)
		}
		// A later epoch writes after an earlier one in the log. Equal starts
		// are fine: an epoch that wrote nothing before the next began.
		if e.Start < p.Start {
			return fmt.Errorf("entry %d start %d is below entry %d start %d", i, e.Start, i-1, p.Start)
		}
	}
	return nil
}

// DivergencePoint returns the offset below which two replicas with histories
// a and b hold identical records, wherever both hold records: walking both,
// the first index where the entries differ, and there the smaller of the two
// starts. Below it both wrote under identical leadership; at or above it one
// of them may hold another epoch's records.
//
// An index only one side has counts as differing at the other side's start:
// the shorter side's last epoch may run on past where the longer side's next
// epoch began. Identical histories never diverge: math.MaxUint64, true (the
// caller bounds the target by the log ends).
//
// Trimmed histories (a log whose front retention removed, see TrimBefore,
// or one rebuilt from the records left) begin with an entry whose start may
// be above 0, and the replica holds no record below that start. Two such
// histories are compared where both hold records:
//
//   - the side whose first epoch is older skips its entries of epochs below
//     the other side's first epoch: the other side holds nothing there, and
//     where it holds records (from its first start on) the skipped epochs'
//     records, if any remain, differ from its own, which the comparison of
//     the next entries (the smaller start) still finds;
//   - entries of one epoch at different starts agree when the higher start
//     is its side's first entry (that side holds nothing below it, and
//     records of one epoch are the same records on every replica), and
//     differ at the smaller start otherwise, as always.
//
// An epoch that wrote nothing (its next entry starts at the same offset)
// is left out of the walk on either side: it holds no record, so it is no
// difference.
//
// An untrimmed history's first entry starts at 0, so for two of those this
// is the walk it always was. The answer is exact for every offset at or
// above both log starts; below a replica's log start there is nothing to
// compare.
//
// ok is false when either history is empty. Empty means unknown, and two
// unknowns agreeing at 0 is not evidence: returning a point would let a
// caller truncate on mutual ignorance.
func DivergencePoint(a, b []EpochStart) (offset uint64, ok bool) {
	if len(a) == 0 || len(b) == 0 {
		return 0, false
	}
	// A leader that journals its epoch and loses power before its
	// epoch-start record keeps the entry (Open keeps one starting at the
	// log end); leading the next epoch from there, its history reads
	// [... {24 871} {25 871}] and its followers' [... {25 871}]. Walked
	// entry by entry, those identical logs "diverged" at 871, below their
	// HWMs, and no promotion could ever cut either (CI's internal/chaos
	// wipe run of seed 1).
	a, b = wroteRecords(a), wroteRecords(b)
	// Align: the side with the older first epoch starts at the other's
	// first epoch. Epochs strictly increase, so the skipped entries are a
	// prefix.
	aFirst, bFirst := true, true // the entry at index 0 is its side's first
	if a[0].Epoch < b[0].Epoch {
		a = a[sort.Search(len(a), func(i int) bool { return a[i].Epoch >= b[0].Epoch }):]
		aFirst = false
	} else if b[0].Epoch < a[0].Epoch {
		b = b[sort.Search(len(b), func(i int) bool { return b[i].Epoch >= a[0].Epoch }):]
		bFirst = false
	}
	for i := 0; ; i++ {
		switch {
		case i >= len(a) && i >= len(b):
			return math.MaxUint64, true
		case i >= len(a):
			return b[i].Start, true
		case i >= len(b):
			return a[i].Start, true
		case a[i] == b[i]:
		case i == 0 && a[0].Epoch == b[0].Epoch &&
			((a[0].Start > b[0].Start && aFirst) || (b[0].Start > a[0].Start && bFirst)):
			// The side with the higher start holds nothing below it, and
			// from it on both hold the one epoch's records.
		default:
			// Same epoch at different starts differs too: each side's
			// previous epoch ran to its own start, so only the smaller start
			// is a boundary both agree lies under the previous leadership.
			return min(a[i].Start, b[i].Start), true
		}
	}
}

// wroteRecords returns h without its epochs that wrote nothing: an entry
// whose next one starts at the same offset (checkHistory allows it). The
// last entry is kept whatever its log end: h does not know it, and the
// callers bound their answers by the log ends. h is not modified.
func wroteRecords(h []EpochStart) []EpochStart {
	var out []EpochStart
	for i, e := range h {
		if i+1 < len(h) && h[i+1].Start == e.Start {
			continue
		}
		out = append(out, e)
	}
	return out
}

// EndOffsetFor answers Kafka's OffsetsForLeaderEpoch against history h of a
// log ending at logEnd: the largest epoch in h at or below epoch, and the
// offset where that epoch's stretch ends (the next entry's start, or logEnd
// for the last entry). A follower whose last record is of epoch E at or above
// end holds records the history h never had under E, and truncates to end.
//
// ok is false when h is empty (unknown) or every epoch in h is above epoch:
// h then says nothing about that stretch of the log. A trimmed history
// (TrimBefore) keeps the entry in force at the last record retention
// removed, so for a log starting at S the answer is exact for every epoch
// of a record at S-1 or later: a follower fetching at or above S sends the
// epoch of its record at fetch offset - 1, which is one of those.
func EndOffsetFor(h []EpochStart, epoch, logEnd uint64) (foundEpoch, end uint64, ok bool) {
	// h's epochs strictly increase, so the entries above epoch are a suffix.
	i := sort.Search(len(h), func(i int) bool { return h[i].Epoch > epoch }) - 1
	if i < 0 {
		return 0, 0, false
	}
	if i+1 < len(h) {
		return h[i].Epoch, h[i+1].Start, true
	}
	return h[i].Epoch, logEnd, true
}
