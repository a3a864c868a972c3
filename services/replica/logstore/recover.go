package logstore

import (
	"errors"
	"fmt"

	"github.com/dgraph-io/badger/v4"

	"github.com/tenurelog/tenure/pkg/journal"
)

// loadRange loads range id at Open and brings its journal and log into
// agreement before anything is served from it:
//
//  1. read its state (a fence that cannot be read cannot be kept, so a
//     corrupt state refuses the Open), HWM, synced-end marker, intent and
//     log start;
//  2. finish an advance of the log start: delete the batches wholly below
//     it (a crash, or the WAL's replay, may have left them);
//  3. open its journal; a corrupt one is rebuilt in step 6;
//  4. redo a pending truncation;
//  5. recover the log end, cutting an unsynced tail at its first hole;
//  6. reconcile the journal with the log from the log start, or rebuild it
//     from the records there, and trim its front to the log start;
//  7. clamp the HWM to the log end, and raise it to the log start.
//
// DurableEnd starts at the log end: after a restart everything on disk was
// either synced or has been lost already.
func (s *Store) loadRange(id string) (*Range, error) {
	wrap := func(err error) error { return fmt.Errorf("logstore: load range %s: %w", id, err) }
	stKey := rangeKey(prefixState, id)
	b, _, err := s.get(stKey)
	if err != nil {
		return nil, wrap(err)
	}
	st, err := decodeState(stKey, b)
	if err != nil {
		return nil, wrap(err)
	}
	hwm, _, err := s.getU64(prefixHWM, id)
	if err != nil {
		return nil, wrap(err)
	}
	synced, _, err := s.getU64(prefixSynced, id)
	if err != nil {
		return nil, wrap(err)
	}
	intentTo, hasIntent, err := s.getU64(prefixIntent, id)
	if err != nil {
		return nil, wrap(err)
	}
	logStart, _, err := s.getU64(prefixLogStart, id)
	if err != nil {
		return nil, wrap(err)
	}
	if logStart > 0 {
		// Before anything reads the log: a batch left below the start may
		// point into a segment already reclaimed. The start was synced
		// before any deletion, so this finishes what AdvanceLogStart or
		// ResetTo began (or undoes the WAL replay of batches below it).
		n, err := s.deleteBelow(id, logStart, nil)
		if err != nil {
			return nil, wrap(err)
		}
		if n > 0 {
			s.log.Info("deleted batches below the log start", "range", id, "log_start", logStart, "batches", n)
		}
	}

	var rebuild string
	j, err := journal.OpenFS(s.jfs, s.journalPath(id))
	if errors.Is(err, journal.ErrCorrupt) {
		rebuild = err.Error()
	} else if err != nil {
		return nil, wrap(err)
	}
	closeJournal := func() {
		if j != nil {
			_ = j.Close()
			j = nil
		}
	}

	if hasIntent {
		if err := s.redoTruncate(id, j, intentTo, synced); err != nil {
			closeJournal()
			return nil, wrap(err)
		}
		synced = min(synced, intentTo)
	}
	end, lastEpoch, err := s.recoverLogEnd(id, logStart, synced)
	if err != nil {
		closeJournal()
		return nil, wrap(err)
	}
	if j != nil {
		if rebuild, err = s.reconcileJournal(id, j, logStart, end); err != nil {
			closeJournal()
			return nil, wrap(err)
		}
	}
	if rebuild != "" {
		closeJournal()
		if j, err = s.rebuildJournal(id, logStart, end, rebuild); err != nil {
			return nil, wrap(err)
		}
	}
	if logStart > 0 {
		// An advance that crashed before its journal trim: redone (a
		// no-op when done). The entry in force at the last removed record
		// stays, as AdvanceLogStart keeps it.
		if err := j.TrimBefore(logStart - 1); err != nil {
			closeJournal()
			return nil, wrap(err)
		}
		if end == logStart {
			// No record left to say the last epoch: the journal does (0
			// after ResetTo, whose journal is empty).
			lastEpoch = epochInForce(j.Entries(), logStart-1)
		}
	}

	r := newRange(s, id, j)
	r.state = st
	r.next, r.logEnd, r.durableEnd = end, end, end
	r.tailEpoch, r.lastEpoch = lastEpoch, lastEpoch
	r.hwm = hwm
	r.logStart = logStart
	if hwm < logStart {
		// The start is at most the HWM when set, and the HWM is persisted
		// lazily, so it may lag: the records below the start were
		// committed.
		r.hwm = logStart
		s.dirty[r] = struct{}{}
	}
	if hwm > end {
		// The HWM is persisted after the records it covers, so this needs
		// records lost after they were counted: a power loss took this
		// replica's unsynced tail, which a leader may count toward the
		// commit through the followers. Claiming records it does not hold
		// would be wrong; a lower HWM only makes a promotion's committed
		// bound smaller, and the replica catches up by fetching.
		s.log.Warn("persisted HWM is above the recovered log end; lowering it", "range", id, "hwm", hwm, "log_end", end)
		r.hwm = end
		s.dirty[r] = struct{}{}
	}
	return r, nil
}

// redoTruncate finishes a truncation a crash interrupted: every step is
// idempotent, so redoing a finished one changes nothing. j is nil when the
// journal is corrupt; it is rebuilt from the cut log afterwards.
func (s *Store) redoTruncate(id string, j *journal.Journal, to, synced uint64) error {
	if j != nil {
		if err := j.TruncateFrom(to); err != nil {
			return err
		}
	}
	n, err := s.cutLog(id, to, min(synced, to))
	if err != nil {
		return err
	}
	if err := s.syncDB(); err != nil {
		return err
	}
	// Synced (clearIntent): the range takes new records once served.
	if err := s.clearIntent(id, to); err != nil {
		return err
	}
	s.log.Warn("redid an interrupted truncation", "range", id, "to", to, "removed", n)
	return nil
}

// recoverLogEnd returns the log end of range id and the epoch of its last
// record, given its log start and synced-end marker.
//
// Records below the log start are gone on purpose, and were durable before
// it was persisted (AdvanceLogStart clamps it by DurableEnd; ResetTo sets the
// marker with it), so the log is checked from max(synced, logStart). With
// no record left below that, lastEpoch is 0 here (the caller asks the
// journal when the log is empty at its start).
//
// Records below the marker were fsynced before the batch that wrote the
// marker (commit.go), so they are trusted: only the record just below it is
// read, and damage there is ErrCorrupt. Records at and above it may not have
// been synced when the machine stopped. Badger replays each WAL file as a
// prefix, but a power loss can keep a later memtable's WAL and lose an
// earlier one's unsynced pages, leaving a hole. Everything above a hole was
// committed after the lost record and so was never covered by a completed
// sync: it was never reported durable, and the tail is cut at the first
// missing or unreadable record.
func (s *Store) recoverLogEnd(id string, logStart, synced uint64) (end, lastEpoch uint64, err error) {
	synced = max(synced, logStart)
	if synced > logStart {
		if lastEpoch, _, _, err = s.readRecord(id, synced-1); err != nil {
			return 0, 0, fmt.Errorf("record below the synced marker %d: %w", synced, err)
		}
	}
	var hole string
	err = s.db.View(func(txn *badger.Txn) error {
		end, hole, err = s.scanLog(txn, id, synced, func(sr storedRecord) (bool, error) {
			// Epochs never decrease along a log, and a lost write cannot
			// make them: this is damage, not a torn tail.
			if sr.epoch < lastEpoch {
				return false, fmt.Errorf("%w: record %d has epoch %d after epoch %d", ErrCorrupt, sr.offset, sr.epoch, lastEpoch)
			}
			lastEpoch = sr.epoch
			return true, nil
		})
		return err
	})
	if err != nil {
		return 0, 0, err
	}
	if hole != "" {
		n, err := s.cutLog(id, end, synced)
		if err != nil {
			return 0, 0, err
		}
		if err := s.syncDB(); err != nil {
			return 0, 0, err
		}
		s.log.Warn("cut the unsynced log tail at its first hole", "range", id, "at", end, "removed", n, "reason", hole)
	}
	return end, lastEpoch, nil
}

// reconcileJournal brings an opened journal into agreement with a log
// ending at end. Entries starting beyond end are removed: their records were
// lost unsynced (an entry starting exactly at end is legal: a leader
// journals (E, LogEnd) before writing its epoch-start record, and a follower
// its epoch before the record). It returns a reason to rebuild the journal
// from the log instead, or "" when the journal describes the log.
func (s *Store) reconcileJournal(id string, j *journal.Journal, logStart, end uint64) (rebuild string, err error) {
	entries := j.Entries()
	if n := len(entries); n > 0 && entries[n-1].Start > end {
		if err := j.TruncateFrom(end + 1); err != nil {
			return "", err
		}
		s.log.Warn("removed journal entries beyond the log end", "range", id, "log_end", end, "latest", entries[n-1])
		entries = j.Entries()
	}
	if len(entries) == 0 {
		if end > logStart {
			// Empty means unknown; with records present it is a lost or
			// missing journal, and the log can say what it was.
			return "the journal is empty and the log is not", nil
		}
		// An empty log and an empty journal: empty is complete.
		return "", nil
	}
	return s.checkJournal(id, entries, logStart, end)
}

// checkJournal verifies that entries describe the log in [logStart, end):
// the first epoch starts at or below the log start (a trimmed journal's
// first entry may start below it, the kept entry in force there), and the
// part at or above the log start of each non-empty stretch [start, next
// start) holds its epoch at both ends. Epochs never decrease along the log, so both ends
// agreeing means every record between does; three point reads per entry,
// instead of reading the log. A mismatch is a reason to rebuild.
func (s *Store) checkJournal(id string, entries []journal.EpochStart, logStart, end uint64) (rebuild string, err error) {
	if end == logStart {
		// No record to describe; every entry starts at or below end
		// (reconcileJournal): epochs that wrote nothing yet, or that
		// wrote records retention removed.
		return "", nil
	}
	if entries[0].Start > logStart {
		return fmt.Sprintf("the journal's first epoch %d starts at %d, records from the log start %d below it are unattributed", entries[0].Epoch, entries[0].Start, logStart), nil
	}
	for i, e := range entries {
		if e.Start >= end {
			break
		}
		stretchEnd := end
		if i+1 < len(entries) {
			stretchEnd = min(entries[i+1].Start, end)
		}
		// Only the part the log still holds is checked.
		lo := max(e.Start, logStart)
		if stretchEnd <= lo {
			continue // an epoch that wrote nothing before the next began, or only below the log start
		}
		for _, off := range []uint64{lo, stretchEnd - 1} {
			epoch, _, _, err := s.readRecord(id, off)
			if err != nil {
				return "", err
			}
			if epoch != e.Epoch {
				return fmt.Sprintf("the journal says epoch %d holds [%d, %d), the log has epoch %d at %d", e.Epoch, lo, stretchEnd, epoch, off), nil
			}
		}
	}
	return "", nil
}

// rebuildJournal scans the log of range id in [logStart, end), where every
// record carries its epoch, and atomically installs the history it finds
// (journal.Create: written, fsynced, renamed, directory fsynced) before the
// range is served. Epochs that wrote nothing here are not recovered; they
// describe no record, so the history still describes the log. With a log
// start above 0 the history begins at the first record still held: at
// logStart-1 when a batch straddling the start still holds that record (so
// a follower fetching at the log start is still vouched for), else at
// logStart (see journal.DivergencePoint on trimmed histories).
func (s *Store) rebuildJournal(id string, logStart, end uint64, reason string) (*journal.Journal, error) {
	from := logStart
	if logStart > 0 {
		if _, _, _, err := s.readRecord(id, logStart-1); err == nil {
			from = logStart - 1
		}
	}
	entries, err := s.scanEpochs(id, from, end)
	if err != nil {
		return nil, fmt.Errorf("rebuild journal (%s): %w", reason, err)
	}
	j, err := journal.CreateFS(s.jfs, s.journalPath(id), entries)
	if err != nil {
		return nil, fmt.Errorf("rebuild journal (%s): %w", reason, err)
	}
	s.log.Warn("rebuilt the epoch journal from the log", "range", id, "reason", reason, "entries", len(entries), "log_end", end)
	return j, nil
}

// scanEpochs reads every record of range id in [from, end), verifying each,
// and returns the first offset of each epoch (the first one's at from).
func (s *Store) scanEpochs(id string, from, end uint64) ([]journal.EpochStart, error) {
	var entries []journal.EpochStart
	err := s.db.View(func(txn *badger.Txn) error {
		next, gap, err := s.scanLog(txn, id, from, func(sr storedRecord) (bool, error) {
			if sr.offset >= end {
				return false, nil
			}
			switch n := len(entries); {
			case n > 0 && sr.epoch < entries[n-1].Epoch:
				return false, fmt.Errorf("%w: record %d has epoch %d after epoch %d", ErrCorrupt, sr.offset, sr.epoch, entries[n-1].Epoch)
			case n == 0 || sr.epoch > entries[n-1].Epoch:
				if n == journal.MaxEntries {
					return false, fmt.Errorf("the log holds more than %d epochs", journal.MaxEntries)
				}
				entries = append(entries, journal.EpochStart{Epoch: sr.epoch, Start: sr.offset})
			}
			return true, nil
		})
		if err != nil {
			return err
		}
		if next < end {
			if gap == "" {
				gap = fmt.Sprintf("record %d is missing", next)
			}
			return fmt.Errorf("%w: %s (log ends at %d)", ErrCorrupt, gap, end)
		}
		return nil
	})
	return entries, err
}
