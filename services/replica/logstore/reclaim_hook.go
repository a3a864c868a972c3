package logstore

import (
	"errors"

	"github.com/dgraph-io/badger/v4"
)

// releaseStored is told, after the change is flushed to Badger, of every l/
// key whose stored value logstore removed: keys deleted (AdvanceLogStart
// below the log start, Truncate's cutLog at and above the cut, DropRange's
// deleteRangeKeys) and the key of a batch cutLog rewrote in place (its old
// value, usually a pointer into a segment, is no longer referenced; the
// rewritten batch is held inline in Badger). vals[i] is keys[i]'s old
// stored value (a pointer or an inline batch, see doc.go), copied: the
// callee may keep both.
//
// It takes each pointer off its segment's live count (reclaim.go): a
// segment whose count reaches zero is deleted by the next reclaim pass,
// after a Badger sync that started after this call, so after the flush
// that removed the pointers: no durable pointer is left to it. It takes
// the released bytes off the range's StoredBytes and its indexed part
// (marks.go): every batch released was indexed, since Truncate checkpoints
// before it cuts and retention deletes only indexed keys.
//
// "After the flush" is what makes this safe: a call made before the
// deletion was committed could let a pass sync, then delete a segment a
// pointer committed later (or a crash) still names.
func (s *Store) releaseStored(keys, vals [][]byte) {
	if len(keys) == 0 {
		return
	}
	freed := s.segs.release(vals)
	// Per range (one id per call in practice; a map keeps it general).
	byRange := map[string]int64{}
	for i, k := range keys {
		if id, ok := logKeyRange(k); ok {
			byRange[id] += int64(storedSize(vals[i]))
		}
	}
	for id, n := range byRange {
		r, ok := s.Range(id)
		if !ok {
			// Dropped (forgotten before its keys went), or not loaded yet
			// (a redo at Open: the accounting is built from Badger after).
			continue
		}
		r.rc.indexed.Add(-n)
		r.rc.published.Add(-n)
	}
	// cutLog rewrites the batch that straddles the cut in place, and it is
	// the first key it reports: a key still present after the flush holds
	// the rewritten batch, whose bytes the range still stores. One lookup
	// per call (a bulk delete reports its keys in few calls).
	if id, ok := logKeyRange(keys[0]); ok {
		if r, ok := s.Range(id); ok {
			if n, ok := s.storedSizeOf(keys[0]); ok {
				r.rc.indexed.Add(int64(n))
				r.rc.published.Add(int64(n))
			}
		}
	}
	if freed {
		s.kickReclaim()
	}
}

// storedSizeOf is the stored size of key's current value; ok is false
// when key is absent (or unreadable: then nothing is counted).
func (s *Store) storedSizeOf(key []byte) (n uint64, ok bool) {
	_ = s.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(key)
		if errors.Is(err, badger.ErrKeyNotFound) || err != nil {
			return nil
		}
		return item.Value(func(b []byte) error {
			n, ok = storedSize(b), true
			return nil
		})
	})
	return n, ok
}
