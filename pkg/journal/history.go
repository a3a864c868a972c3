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
// a and b hold identical records: walking both, the first index where the
// entries differ, and there the smaller of the two starts. Below it both wrote
// under identical leadership; at or above it one of them may hold another
// epoch's records.
//
// An index only one side has counts as differing at the other side's start:
// the shorter side's last epoch may run on past where the longer side's next
// epoch began. Identical histories never diverge: math.MaxUint64, true (the
// caller bounds the target by the log ends).
//
// ok is false when either history is empty. Empty means unknown, and two
// unknowns agreeing at 0 is not evidence: returning a point would let a
// caller truncate on mutual ignorance.
func DivergencePoint(a, b []EpochStart) (offset uint64, ok bool) {
	if len(a) == 0 || len(b) == 0 {
		return 0, false
	}
	for i := 0; ; i++ {
		switch {
		case i >= len(a) && i >= len(b):
			return math.MaxUint64, true
		case i >= len(a):
			return b[i].Start, true
		case i >= len(b):
			return a[i].Start, true
		case a[i] != b[i]:
			// Same epoch at different starts differs too: each side's
			// previous epoch ran to its own start, so only the smaller start
			// is a boundary both agree lies under the previous leadership.
			return min(a[i].Start, b[i].Start), true
		}
	}
}

// EndOffsetFor answers Kafka's OffsetsForLeaderEpoch against history h of a
// log ending at logEnd: the largest epoch in h at or below epoch, and the
// offset where that epoch's stretch ends (the next entry's start, or logEnd
// for the last entry). A follower whose last record is of epoch E at or above
// end holds records the history h never had under E, and truncates to end.
//
// ok is false when h is empty (unknown) or every epoch in h is above epoch:
// h then says nothing about that stretch of the log.
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
