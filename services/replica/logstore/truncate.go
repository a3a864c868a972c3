package logstore

import (
	"fmt"

	"github.com/dgraph-io/badger/v4"
)

// Truncate cuts the log to end at to: records at and above to are removed,
// and journal entries starting at or above to (epochs whose first record is
// gone, or that wrote nothing here). It returns how many records it removed.
// to at or above LogEnd removes no records, only such journal entries.
//
// to below the HWM is refused with ErrBelowHWM: records below the HWM are
// committed, and no truncation ever removes a committed record (invariant 3).
// The service also refuses Truncate on a leader and at any epoch but the
// fenced one; the store refuses concurrent writes (ErrBusy) and waits for
// writes already queued to be durable before cutting.
//
// Truncate is crash-atomic with the journal. In order: persist the intent
// (t/<range> = to) and sync; cut the journal (fsynced); delete the log keys
// from to (with the synced-end marker lowered to to); sync; clear the intent
// and sync again (clearIntent says why).
// A crash anywhere leaves the intent, and Open redoes the cut (every step is
// idempotent) before the range is served, so journal and log never disagree
// after a restart.
func (r *Range) Truncate(to uint64) (removed uint64, err error) {
	if err := r.usable("Truncate"); err != nil {
		return 0, err
	}
	r.cutMu.Lock()
	defer r.cutMu.Unlock()
	done, err := r.s.begin()
	if err != nil {
		return 0, err
	}
	defer done()

	oldEnd, err := r.startTruncate(to)
	if err != nil {
		return 0, err
	}
	if to >= oldEnd {
		// No record to cut; entries at or above to can only be epochs that
		// wrote nothing here (a leader's journaled start at the log end).
		// The journal's own cut is crash-safe, so no intent is needed.
		err := r.j.TruncateFrom(to)
		r.finishTruncate(to, oldEnd, 0)
		if err != nil {
			return 0, r.journalErr(fmt.Errorf("logstore: Truncate(%d) on %s: %w", to, r.id, err))
		}
		return 0, nil
	}

	s := r.s
	// The WAL may hold the records about to be cut (wal.go): a replay after
	// a crash would write them back. A checkpoint that starts now (every
	// write to the range is durable and no new one is accepted) makes those
	// entries redundant, so Open never replays them.
	if err := s.forceCheckpoint(); err != nil {
		return 0, s.fail(err)
	}
	intent := rangeKey(prefixIntent, r.id)
	if err := s.putSynced(intent, encodeU64(intent, to)); err != nil {
		return 0, err
	}
	if err := s.crash(CrashTruncateIntent); err != nil {
		return 0, err
	}
	if err := r.j.TruncateFrom(to); err != nil {
		// Even a refusal here is fatal: the intent is persisted, and only a
		// reopen redoes it.
		return 0, s.fail(fmt.Errorf("logstore: Truncate(%d) on %s: journal: %w", to, r.id, err))
	}
	if err := s.crash(CrashTruncateJournal); err != nil {
		return 0, err
	}
	removed, err = s.cutLog(r.id, to, to)
	if err == nil {
		// Marks above the cut would say the records written there next
		// are old (marks.go); deleted before the sync below, so before
		// the intent is cleared and the range takes writes again.
		err = s.pruneMarksAbove(r, to)
	}
	if err != nil {
		return 0, s.fail(err)
	}
	if err := s.crash(CrashTruncateLog); err != nil {
		return 0, err
	}
	if err := s.syncDB(); err != nil {
		return 0, s.fail(err)
	}
	if err := s.clearIntent(r.id, to); err != nil {
		return 0, s.fail(fmt.Errorf("logstore: Truncate(%d) on %s: %w", to, r.id, err))
	}
	var last uint64
	switch start := r.LogStart(); {
	case to > start:
		if last, _, _, err = s.readRecord(r.id, to-1); err != nil {
			return 0, s.fail(err)
		}
	case to > 0:
		// Cut to the log start itself: the record at to-1 is gone
		// (retention), and the journal, trimmed to keep the entry in
		// force there, says its epoch.
		last = epochInForce(r.j.Entries(), to-1)
	}
	r.finishTruncate(to, to, last)
	if removed != oldEnd-to {
		// The keys counted are the keys that were there: fewer means the log
		// had holes below its end, which no writer makes.
		return removed, fmt.Errorf("%w: Truncate(%d) on %s: removed %d records, the log end said %d", ErrCorrupt, to, r.id, removed, oldEnd-to)
	}
	s.log.Info("truncated log", "range", r.id, "to", to, "removed", removed)
	return removed, nil
}

// startTruncate checks to against the HWM, marks the range truncating and
// waits until every queued write to it is committed and durable, so the cut
// sees a quiet, fully synced log. It returns the log end.
func (r *Range) startTruncate(to uint64) (uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if to < r.hwm {
		return 0, fmt.Errorf("%w: Truncate(%d) on %s: the high-water mark is %d, and records below it are committed", ErrBelowHWM, to, r.id, r.hwm)
	}
	// Implied by the HWM check (LogStart <= HWM), and said on its own: the
	// log start never moves down, and nothing below it is left to cut.
	if to < r.logStart {
		return 0, fmt.Errorf("%w: Truncate(%d) on %s: the log starts at %d", ErrBelowHWM, to, r.id, r.logStart)
	}
	if err := r.s.writeErr(); err != nil {
		return 0, err
	}
	r.truncating, r.truncTo = true, to
	if err := r.quiesceLocked(); err != nil {
		r.truncating = false
		return 0, err
	}
	return r.logEnd, nil
}

// clearIntent deletes range id's truncation intent and syncs the delete.
// The sync is what makes the cut final: once the intent is gone the range
// takes records at and above the cut again, and those are durable as soon
// as the WAL is synced, with no Badger sync in between. A power loss could
// then keep them (Open replays them) yet lose an unsynced delete, and Open
// would redo the finished cut over them: records acknowledged after the
// cut, and the journal entries of their epochs, gone.
func (s *Store) clearIntent(id string, to uint64) error {
	intent := rangeKey(prefixIntent, id)
	if err := s.db.Update(func(txn *badger.Txn) error { return txn.Delete(intent) }); err != nil {
		return fmt.Errorf("clear truncation intent: %w", err)
	}
	s.syncGate.Lock()
	if s.intentClears == nil {
		s.intentClears = map[string]intentClear{}
	}
	// A clear that a finished sync covers can no longer come back
	// (PowerLoss reads only those with syncDone <= ticket): drop them, or
	// the map kept one entry per range id ever truncated, dropped ranges
	// included, for the life of the store.
	for k, c := range s.intentClears {
		if s.syncDone > c.ticket {
			delete(s.intentClears, k)
		}
	}
	s.intentClears[id] = intentClear{to: to, ticket: s.syncWanted}
	s.syncGate.Unlock()
	return s.syncDB()
}

// intentClear is a deleted truncation intent, for PowerLoss: its target,
// and the last sync ticket handed out when it was deleted.
type intentClear struct {
	to, ticket uint64
}

// finishTruncate publishes the cut log: everything below to was synced
// before the cut began, so it is all durable.
func (r *Range) finishTruncate(to, end, lastEpoch uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if end < r.logEnd {
		r.next, r.logEnd, r.durableEnd = end, end, end
		// A demand for what was cut is void.
		r.demandEnd = min(r.demandEnd, end)
		r.demanded.Store(false)
		r.tailEpoch, r.lastEpoch = lastEpoch, lastEpoch
		r.truncGen++
		r.lastTruncTo = to
		// The dedupe state may count cut records: the next idempotent
		// append derives it again from what the log now holds.
		r.producers = nil
	}
	r.truncating = false
	r.notifyLocked()
}

// cutLog removes range id's records at and above to and sets its
// synced-end marker to synced, in one WriteBatch, not synced: a stored
// batch that starts below to and reaches past it is rewritten with its
// records below to, and every batch starting at or above to is deleted
// (Badger has no range delete). Each step is idempotent, so a crash
// anywhere in it is redone by running it again. It returns how many
// records it removed.
func (s *Store) cutLog(id string, to, synced uint64) (uint64, error) {
	wb := s.db.NewWriteBatch()
	defer wb.Cancel()
	prefix := logPrefix(id)
	var n uint64
	// The keys whose stored values go (releaseStored), told once flushed.
	var relKeys, relVals [][]byte
	err := s.db.View(func(txn *badger.Txn) error {
		rit := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, Reverse: true})
		defer rit.Close()
		if rit.Seek(logKey(id, to)); rit.Valid() {
			item := rit.Item()
			base, err := parseLogKey(prefix, item.Key())
			if err != nil {
				return err
			}
			if base < to {
				err := item.Value(func(b []byte) error {
					b, err := s.loadBatch(item.Key(), b)
					if err != nil {
						return err
					}
					recs, err := decodeBatch(id, base, item.Key(), b)
					if err != nil {
						return err
					}
					if end := base + uint64(len(recs)); end > to {
						n += end - to
						old, err := item.ValueCopy(nil)
						if err != nil {
							return err
						}
						relKeys, relVals = append(relKeys, item.KeyCopy(nil)), append(relVals, old)
						return wb.Set(item.KeyCopy(nil), batchPrefix(b, int(to-base)))
					}
					return nil
				})
				if err != nil {
					return err
				}
			}
		}
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Seek(logKey(id, to)); it.Valid(); it.Next() {
			item := it.Item()
			// Only the count is read (a pointer carries it too); a damaged
			// batch still goes.
			var count uint64
			old, err := item.ValueCopy(nil)
			if err != nil {
				return err
			}
			count = storedCount(old)
			key := item.KeyCopy(nil)
			if err := wb.Delete(key); err != nil {
				return err
			}
			relKeys, relVals = append(relKeys, key), append(relVals, old)
			n += count
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("logstore: cut %s to %d: %w", id, to, err)
	}
	// The marker must not claim records at or above the cut were synced:
	// the next ones written there will not be, yet.
	key := rangeKey(prefixSynced, id)
	if err := wb.Set(key, encodeU64(key, synced)); err != nil {
		return 0, fmt.Errorf("logstore: cut %s to %d: %w", id, to, err)
	}
	if err := wb.Flush(); err != nil {
		return 0, fmt.Errorf("logstore: cut %s to %d: %w", id, to, err)
	}
	s.releaseStored(relKeys, relVals)
	return n, nil
}
