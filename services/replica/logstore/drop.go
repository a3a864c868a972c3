package logstore

import (
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// ErrDropped: the range was dropped (DropRange) while the caller used it.
var ErrDropped = errors.New("logstore: range dropped")

// DropRange deletes range id: its log, state, HWM, markers and journal. It
// reports whether the range existed; dropping a range that does not exist
// changes nothing. A Range value the caller still holds refuses writes from
// then on (ErrBusy) and its waits fail (ErrDropped).
//
// DropRange is crash-atomic, the way Truncate is: in order, quiesce the
// range (every accepted write committed and synced, no new one accepted,
// and no HWM of it waiting in the writer), checkpoint the WAL (so Open never
// replays its records back), persist the intent x/<id> and sync, forget the
// range, delete its keys and its journal, sync, clear the intent and sync.
// A crash after the intent leaves it, and Open finishes the drop before it
// loads any range (every step is idempotent), so no crash leaves a range
// that looks hosted with part of its log; a crash before the intent leaves
// the range whole.
func (s *Store) DropRange(id string) (existed bool, err error) {
	unlock := s.lockID(id)
	defer unlock()
	r, ok := s.Range(id)
	if !ok {
		return false, nil
	}
	r.cutMu.Lock()
	defer r.cutMu.Unlock()
	done, err := s.begin()
	if err != nil {
		return false, err
	}
	defer done()
	if err := r.startDrop(); err != nil {
		return false, err
	}
	s.forgetHWM(r)
	if err := s.forceCheckpoint(); err != nil {
		return false, s.fail(err)
	}
	intent := rangeKey(prefixDrop, id)
	if err := s.putSynced(intent, encodeU64(intent, 0)); err != nil {
		return false, err
	}
	if err := s.crash(CrashDropIntent); err != nil {
		return false, err
	}
	// From here the range is gone, whatever happens next: Open redoes the
	// rest. Forgotten first, so nothing new finds it.
	s.rangesMu.Lock()
	delete(s.ranges, id)
	s.rangesMu.Unlock()
	_ = r.j.Close()
	n, err := s.deleteRangeKeys(id, s.crash)
	if err != nil {
		return true, s.fail(err)
	}
	if err := s.finishDrop(id); err != nil {
		return true, s.fail(err)
	}
	s.log.Info("dropped range", "range", id, "batches", n)
	return true, nil
}

// startDrop marks r dropped and waits until every write accepted for it is
// committed and synced. It stays refusing writes for good: the truncating
// flag refuses them, with the HWM pinned where it is.
func (r *Range) startDrop() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.s.writeErr(); err != nil {
		return err
	}
	if r.truncating {
		// Truncate holds cutMu for its whole run, so this is an earlier
		// drop of this same value that failed; the store has failed too.
		return fmt.Errorf("%w: DropRange(%s): already being dropped", ErrBusy, r.id)
	}
	r.truncating, r.truncTo = true, r.hwm
	if err := r.quiesceLocked(); err != nil {
		return err
	}
	r.dropped = true
	r.notifyLocked()
	return nil
}

// forgetHWM takes r off the writer's dirty HWMs and waits for a commit in
// progress, which may carry one, to end: after this no write of r's keys
// is in flight, so none lands in Badger after the drop deleted them (a
// stale h/<id> would be read by a range created again under the id).
func (s *Store) forgetHWM(r *Range) {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	delete(s.dirty, r)
	// Only the commit running now may carry r's HWM: one that takes the
	// queue after this (takes moved) finds r no longer dirty. The writer
	// clears writerBusy without a broadcast (it is on the hot path); a
	// drop is rare, so it polls. A commit takes a few milliseconds.
	round := s.takes
	for s.writerBusy && s.takes == round && s.failed == nil {
		s.qmu.Unlock()
		time.Sleep(time.Millisecond)
		s.qmu.Lock()
	}
}

// deleteRangeKeys deletes every Badger key of range id, not synced: the
// log keys first, then its state, HWM and markers (two WriteBatches, each
// possibly several transactions: a crash in between leaves a state over
// part of a log, which only the intent's redo at Open makes whole). crash
// is the simulated-crash hook between the two (nil at Open's redo). It
// returns how many log keys it deleted.
func (s *Store) deleteRangeKeys(id string, crash func(point string) error) (int, error) {
	wb := s.db.NewWriteBatch()
	defer wb.Cancel()
	n := 0
	// The deleted keys and their stored values (releaseStored).
	var relKeys, relVals [][]byte
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: logPrefix(id)})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			key := it.Item().KeyCopy(nil)
			old, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			if err := wb.Delete(key); err != nil {
				return err
			}
			relKeys, relVals = append(relKeys, key), append(relVals, old)
			n++
		}
		return nil
	})
	if err == nil {
		err = wb.Flush()
	}
	if err != nil {
		return 0, fmt.Errorf("logstore: drop %s: %w", id, err)
	}
	s.releaseStored(relKeys, relVals)
	if crash != nil {
		if err := crash(CrashDropLog); err != nil {
			return 0, err
		}
	}
	meta := s.db.NewWriteBatch()
	defer meta.Cancel()
	for _, p := range []string{prefixHWM, prefixSynced, prefixIntent, prefixLogStart, prefixState} {
		if err := meta.Delete(rangeKey(p, id)); err != nil {
			return 0, fmt.Errorf("logstore: drop %s: %w", id, err)
		}
	}
	if err := meta.Flush(); err != nil {
		return 0, fmt.Errorf("logstore: drop %s: %w", id, err)
	}
	return n, nil
}

// finishDrop removes range id's journal, syncs the deletes and clears the
// drop intent, synced: a range created again under the id must never meet
// the intent at a later Open, which would drop it too.
func (s *Store) finishDrop(id string) error {
	if err := s.jfs.Remove(s.journalPath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("logstore: drop %s: remove journal: %w", id, err)
	}
	if err := s.jfs.SyncDir(s.journalDir); err != nil {
		return fmt.Errorf("logstore: drop %s: sync journal directory: %w", id, err)
	}
	if err := s.syncDB(); err != nil {
		return err
	}
	intent := rangeKey(prefixDrop, id)
	if err := s.db.Update(func(txn *badger.Txn) error { return txn.Delete(intent) }); err != nil {
		return fmt.Errorf("logstore: drop %s: clear intent: %w", id, err)
	}
	return s.syncDB()
}

// redoDrops finishes, at Open, every drop a crash interrupted: before any
// range is loaded, so a half-dropped range is never served.
func (s *Store) redoDrops() error {
	var ids []string
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(prefixDrop)})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			// Assert right after reading: a damaged intent is not a
			// reason to delete a range.
			if err := item.Value(func(b []byte) error {
				_, err := decodeU64(item.Key(), b)
				return err
			}); err != nil {
				return err
			}
			ids = append(ids, string(item.Key()[len(prefixDrop):]))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("logstore: list drop intents: %w", err)
	}
	for _, id := range ids {
		n, err := s.deleteRangeKeys(id, nil)
		if err != nil {
			return err
		}
		if err := s.finishDrop(id); err != nil {
			return err
		}
		s.log.Warn("redid an interrupted drop", "range", id, "batches", n)
	}
	return nil
}
