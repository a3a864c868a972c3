package logstore

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// Retention's measures: how many bytes a range stores, and when its
// records were written.
//
// StoredBytes is a counter per range (rc.published): set at Open from the
// pass over every l/ key (buildAccounting), raised by each publish by the
// batch it makes readable, lowered by releaseStored. So it counts a batch
// from its append on, though Badger holds it only once indexed (up to
// indexDelay later): a status reader sees an append's bytes with its log
// end, and never sees them arrive later by themselves. rc.indexed counts
// the indexed part only, the batches RetainBytes can see: raised by each
// index commit, lowered by releaseStored. Reading either costs nothing;
// RetainBytes reads the range's keys from its first one up to the boundary
// it returns, the batches the caller is about to delete anyway.
//
// Time marks. m/<id>/<offset u64 BE> -> unix milliseconds (u64 value): every
// record of the range below offset was written on this replica at or before
// that time. The index commit writes one for a range it stores batches of
// (offset: the end of the range's last batch in it; time: the commit's,
// which is after every one of those writes), at most one per markInterval
// per range, and in the same transaction deletes the marks at or below the
// log start (they can no longer move a retention point) and, when a range
// has markMax, thins them: the mark whose removal leaves the smallest gap
// relative to its age goes, so gaps grow in proportion to age (simulated:
// one mark a second for a week, 128 kept, every age answered within 7-13%
// of itself; an earlier rule, halving the older half, kept only the first
// mark and the last two minutes). Dropping a mark
// only makes RetainSince more conservative: it answers from an older mark,
// a lower offset, and so keeps more.
//
// A mark above the log end would claim records not yet written, or
// rewritten since (a truncation, records lost unsynced and fetched again):
// Truncate deletes the marks above its cut before its intent is cleared,
// and Open deletes those above each recovered log end, synced before the
// range takes writes. DropRange deletes a range's marks with its keys.
//
// A store written before marks existed has none: RetainSince answers the
// log start (nothing is known to be old) until marks written since cover
// the records, that is until records written after the upgrade reach the
// retention age. A clock that steps back writes no mark until it passes
// the last one's time again (a mark's time never decreases), which is
// conservative too.

// prefixMark is the time marks' key prefix (see doc.go).
const prefixMark = "m/"

// markInterval is the least time between two marks of a range.
var markInterval = time.Second

// markMax bounds a range's marks, in Badger and in memory (16 bytes each).
const markMax = 128

// reclaimRange is a range's retention bookkeeping.
type reclaimRange struct {
	// published is the bytes of the range's batches from its log start to
	// its log end: those in Badger (pointer lengths and inline batches)
	// and those published and waiting for the index (their batch lengths,
	// which the index commit stores as pointers of the same lengths).
	published atomic.Int64
	// indexed is the part of published in Badger: what RetainBytes reads
	// keys for.
	indexed atomic.Int64
	// markMu guards marks, ordered by offset (and by time: a mark's time
	// never decreases). Lock order: r.mu may be held when it is taken.
	markMu sync.Mutex
	marks  []timeMark
}

// timeMark is one m/ key: every record below off was written at or
// before ms (unix milliseconds).
type timeMark struct {
	off uint64
	ms  int64
}

func markKey(id string, off uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte(prefixMark+id+"/"), off)
}

func markPrefix(id string) []byte { return []byte(prefixMark + id + "/") }

// StoredBytes returns the bytes of the range's stored batches, from its
// log start (a batch straddling it counts whole; batches being deleted
// below it count until they are) to its log end, batches still waiting for
// the index (index.go) included. A counter: free to call.
func (r *Range) StoredBytes() uint64 {
	return uint64(max(r.rc.published.Load(), 0))
}

// IndexedBytes returns the part of StoredBytes that Badger holds: the
// batches RetainBytes can see. A counter: free to call.
func (r *Range) IndexedBytes() uint64 {
	return uint64(max(r.rc.indexed.Load(), 0))
}

// RetainBytes returns the lowest batch boundary O at or above LogStart such
// that the stored bytes of the batches from O to the log end are at most
// limit (LogStart when they already are). The caller clamps it to the HWM
// (AdvanceLogStart does). It reads the range's keys from the first up to
// O (pointers; inline batches are read whole): the batches a retention
// then deletes.
//
// "Lowest" up to batches indexed or released while it runs: the counter
// and the keys are read at one instant of the index, but a release may
// land between them, which can only make the answer higher than needed by
// the bytes being released (they are below the log start anyway).
func (r *Range) RetainBytes(limit uint64) uint64 {
	start := r.LogStart()
	// The indexed part: the batches waiting for the index are above every
	// indexed one, so they cannot move the answer until indexed (the
	// leader checks again then: IndexGrown).
	if r.IndexedBytes() <= limit {
		return start
	}
	s := r.s
	done, err := s.begin()
	if err != nil {
		return start
	}
	defer done()
	// The counter and the snapshot at one point of the index commits
	// (which raise the counter under indexMu after committing).
	s.indexMu.Lock()
	remaining := r.rc.indexed.Load()
	txn := s.db.NewTransaction(false)
	s.indexMu.Unlock()
	defer txn.Discard()
	prefix := logPrefix(r.id)
	it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
	defer it.Close()
	at := start
	for it.Rewind(); it.Valid(); it.Next() {
		item := it.Item()
		base, err := parseLogKey(prefix, item.Key())
		if err != nil {
			break
		}
		// A boundary at or above the log start, with what follows within
		// the limit: the answer.
		if base >= start && remaining <= int64(limit) {
			return base
		}
		var size, count uint64
		if err := item.Value(func(b []byte) error {
			size, count = storedSize(b), storedCount(b)
			return nil
		}); err != nil {
			break
		}
		remaining -= int64(size)
		at = max(at, base+count)
	}
	// Every indexed batch is beyond the limit (or unreadable from here
	// on): the end of the last one read, never past the log end.
	return min(at, r.LogEnd())
}

// RetainSince returns an offset O such that every record below O was
// written (on this replica) before t: from the newest time mark older than
// t, never lower than LogStart. Conservative: LogStart when no mark is
// older than t, as in a store written before marks existed.
func (r *Range) RetainSince(t time.Time) uint64 {
	start := r.LogStart()
	ms := t.UnixMilli()
	r.rc.markMu.Lock()
	defer r.rc.markMu.Unlock()
	// Newest first: the first mark older than t has the highest offset of
	// those that are. Strictly older, in milliseconds: a mark at ms T covers
	// writes up to the end of T's millisecond, before any t in a later one.
	for i := len(r.rc.marks) - 1; i >= 0; i-- {
		if m := r.rc.marks[i]; m.ms < ms {
			return max(m.off, start)
		}
	}
	return start
}

// thinnest returns the index, in [1, len(marks)-2], of the mark whose
// removal leaves the smallest gap relative to its age at now (ms).
func thinnest(marks []timeMark, now int64) int {
	best, bestScore := 1, 0.0
	for i := 1; i+1 < len(marks); i++ {
		gap := float64(marks[i+1].ms - marks[i-1].ms)
		age := float64(max(now-marks[i+1].ms, 1))
		if score := gap / age; i == 1 || score < bestScore {
			best, bestScore = i, score
		}
	}
	return best
}

// markPlan is what one index commit changes of a range's marks.
type markPlan struct {
	r    *Range
	add  *timeMark
	dels []uint64
	keep []timeMark // the marks after the commit
}

// planMarks decides, for an index commit storing writes, the marks to add
// and delete per range. Index commits run one at a time (indexMu), and a
// range's marks change otherwise only while nothing of it is indexed
// (Truncate after its checkpoint, load), so the plan holds until applied.
func (s *Store) planMarks(writes []*write) []markPlan {
	ends := map[*Range]uint64{}
	for _, w := range writes {
		ends[w.r] = max(ends[w.r], w.end)
	}
	now := s.now().UnixMilli()
	var plans []markPlan
	for r, end := range ends {
		start := r.LogStart()
		r.rc.markMu.Lock()
		marks := r.rc.marks
		var last timeMark
		if n := len(marks); n > 0 {
			last = marks[n-1]
			if now-last.ms < markInterval.Milliseconds() || end <= last.off {
				r.rc.markMu.Unlock()
				continue
			}
		}
		p := markPlan{r: r}
		keep := make([]timeMark, 0, len(marks)+1)
		for _, m := range marks {
			if m.off <= start {
				// At or below the log start: RetainSince answers at least
				// the log start without it.
				p.dels = append(p.dels, m.off)
				continue
			}
			keep = append(keep, m)
		}
		for len(keep) >= markMax {
			// Full: drop the mark whose gap, once merged with its
			// neighbours', is the smallest against its age (never the
			// oldest nor the newest). Gaps so grow in proportion to age:
			// 128 marks over a week of writes answer within about a tenth
			// of the age asked for, at every age.
			i := thinnest(keep, now)
			p.dels = append(p.dels, keep[i].off)
			keep = append(keep[:i:i], keep[i+1:]...)
		}
		// Never earlier than the last mark: a mark's time is an upper bound
		// of its records' write times, so raising it stays true.
		add := timeMark{off: end, ms: max(now, last.ms)}
		p.add = &add
		p.keep = append(keep, add)
		r.rc.markMu.Unlock()
		plans = append(plans, p)
	}
	return plans
}

// writeMarks adds plans' changes to an index commit's transaction.
func (s *Store) writeMarks(tw *txnWriter, plans []markPlan) error {
	for _, p := range plans {
		for _, off := range p.dels {
			if err := tw.del(markKey(p.r.id, off)); err != nil {
				return err
			}
		}
		if p.add != nil {
			k := markKey(p.r.id, p.add.off)
			if err := tw.set(k, encodeU64(k, uint64(p.add.ms))); err != nil {
				return err
			}
		}
	}
	return nil
}

// applyMarks installs plans' marks in memory, once committed.
func applyMarks(plans []markPlan) {
	for _, p := range plans {
		p.r.rc.markMu.Lock()
		p.r.rc.marks = p.keep
		p.r.rc.markMu.Unlock()
	}
}

// loadMarks reads range r's marks at load, deleting those above its log
// end and any that fail their checksum (a lost mark only makes RetainSince
// more conservative). It reports whether it deleted any: Open syncs those
// deletes before any range takes a write.
func (s *Store) loadMarks(r *Range, end uint64) (pruned bool, err error) {
	prefix := markPrefix(r.id)
	var marks []timeMark
	var dels [][]byte
	err = s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			k := item.KeyCopy(nil)
			off, err := parseLogKey(prefix, k)
			if err != nil {
				dels = append(dels, k)
				continue
			}
			var ms uint64
			if err := item.Value(func(b []byte) error {
				ms, err = decodeU64(k, b)
				return err
			}); err != nil {
				s.log.Warn("deleting an unreadable time mark", "range", r.id, "offset", off, "err", err)
				dels = append(dels, k)
				continue
			}
			if off > end {
				dels = append(dels, k)
				continue
			}
			// Times never decrease along the marks (planMarks); if they did,
			// each mark still holds on its own, and RetainSince assumes no
			// order (it scans newest first).
			m := timeMark{off: off, ms: int64(ms)}
			marks = append(marks, m)
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("logstore: load time marks of %s: %w", r.id, err)
	}
	if len(dels) > 0 {
		wb := s.db.NewWriteBatch()
		defer wb.Cancel()
		for _, k := range dels {
			if err := wb.Delete(k); err != nil {
				return false, fmt.Errorf("logstore: prune time marks of %s: %w", r.id, err)
			}
		}
		if err := wb.Flush(); err != nil {
			return false, fmt.Errorf("logstore: prune time marks of %s: %w", r.id, err)
		}
	}
	r.rc.markMu.Lock()
	r.rc.marks = marks
	r.rc.markMu.Unlock()
	return len(dels) > 0, nil
}

// pruneMarksAbove deletes range r's marks above offset to (Truncate, before
// it syncs and clears its intent), not synced.
func (s *Store) pruneMarksAbove(r *Range, to uint64) error {
	r.rc.markMu.Lock()
	defer r.rc.markMu.Unlock()
	keep := r.rc.marks[:0:0]
	wb := s.db.NewWriteBatch()
	defer wb.Cancel()
	for _, m := range r.rc.marks {
		if m.off > to {
			if err := wb.Delete(markKey(r.id, m.off)); err != nil {
				return fmt.Errorf("logstore: prune time marks of %s: %w", r.id, err)
			}
			continue
		}
		keep = append(keep, m)
	}
	if err := wb.Flush(); err != nil {
		return fmt.Errorf("logstore: prune time marks of %s: %w", r.id, err)
	}
	r.rc.marks = keep
	return nil
}

// deleteMarks deletes every mark of range id (DropRange), not synced.
func (s *Store) deleteMarks(id string) error {
	wb := s.db.NewWriteBatch()
	defer wb.Cancel()
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: markPrefix(id), PrefetchValues: false})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			if err := wb.Delete(it.Item().KeyCopy(nil)); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		err = wb.Flush()
	}
	if err != nil {
		return fmt.Errorf("logstore: drop %s: delete time marks: %w", id, err)
	}
	return nil
}

// markCount is how many marks range r holds in memory (tests).
func (r *Range) markCount() int {
	r.rc.markMu.Lock()
	defer r.rc.markMu.Unlock()
	return len(r.rc.marks)
}
