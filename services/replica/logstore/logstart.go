package logstore

import (
	"bytes"
	"errors"
	"fmt"
	"sort"

	"github.com/dgraph-io/badger/v4"

	"github.com/tenurelog/tenure/pkg/journal"
)

// ErrBelowLogStart: a read of an offset below the range's log start, whose
// records retention removed on purpose (they were all committed). It wraps
// ErrOutOfRange, so errors.Is(err, ErrOutOfRange) holds too; the error's
// message names the log start, where the reader can resume.
var ErrBelowLogStart = fmt.Errorf("%w: below the log start", ErrOutOfRange)

// Crash points of AdvanceLogStart and ResetTo (Options.CrashAt).
const (
	// CrashAdvanceStart: the new log start is persisted and synced; the
	// journal is not trimmed, no log key deleted.
	CrashAdvanceStart = "advance:start"
	// CrashAdvanceJournal: the journal is trimmed too; no log key deleted.
	CrashAdvanceJournal = "advance:journal"
	// CrashAdvanceLog: the first bounded transaction of log-key deletions
	// is committed (not synced); others may remain.
	CrashAdvanceLog = "advance:log"
	// CrashResetJournal: ResetTo emptied the journal; nothing else changed.
	CrashResetJournal = "reset:journal"
	// CrashResetStart: ResetTo persisted the new start (with the HWM and
	// synced-end marker at it), synced; the old log keys are still there.
	CrashResetStart = "reset:start"
	// CrashResetLog: ResetTo deleted the old log keys, not synced.
	CrashResetLog = "reset:log"
)

// deleteChunk bounds the log keys deleted in one Badger transaction: a
// range may hold millions of batches below a new log start, and one
// transaction of them all would exceed Badger's limit and hold its value
// copies (for releaseStored) in memory at once. A variable so tests can
// crash between two transactions.
var deleteChunk = 1024

// LogStart returns the lowest offset the log holds: 0 for a range never
// trimmed, else the start AdvanceLogStart or ResetTo last set (persisted,
// b/<id>). Reads below it fail with ErrBelowLogStart. Invariant: LogStart
// <= HWM <= LogEnd, and it never decreases.
func (r *Range) LogStart() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.logStart
}

// belowStart returns the error of a read of offset by op when offset is
// below the log start, nil otherwise.
func (r *Range) belowStart(op string, offset uint64) error {
	if start := r.LogStart(); offset < start {
		return fmt.Errorf("%w: %s(%d) on %s: the log starts at %d (records below it were removed by retention)", ErrBelowLogStart, op, offset, r.id, start)
	}
	return nil
}

// AdvanceLogStart raises the log start to min(to, HWM, DurableEnd) and
// returns the effective start; it never lowers it (a smaller to returns the
// current start). DurableEnd <= LogEnd, so that is also at most min(to, HWM,
// LogEnd). Then it removes what the new start leaves below it.
//
// In order: index every batch waiting (so none below the start lands in
// Badger after its key is deleted); persist the start (b/<id>) and sync;
// publish it (reads below it are refused from then on); trim the journal
// from the front, keeping the entry in force at the last removed offset
// (start-1) and every later one; delete the l/ keys of the batches wholly
// below the start, in bounded transactions (a batch straddling the start
// stays until a later advance leaves it wholly below: its records at and
// above the start are live, and those below it are refused anyway), and
// hand them to releaseStored. A crash after the start is persisted leaves
// the rest to Open, which redoes both (loadRange).
//
// It runs alongside reads and appends (only batches wholly below the start,
// committed and indexed, are touched; a read that raced with it and found
// its records gone reports ErrBelowLogStart), and one at a time with
// Truncate, ResetTo and DropRange (it holds cutMu shared, they hold it
// exclusively) and with other AdvanceLogStart calls.
//
// On an error the start may have advanced anyway (LogStart says); a failed
// write fails the store (ErrFailed), and Open finishes the advance.
func (r *Range) AdvanceLogStart(to uint64) (start uint64, err error) {
	// A quarantined range has no journal to trim and nothing to trust.
	if err := r.usable("AdvanceLogStart"); err != nil {
		return r.LogStart(), err
	}
	r.cutMu.RLock()
	defer r.cutMu.RUnlock()
	r.startMu.Lock()
	defer r.startMu.Unlock()
	done, err := r.s.begin()
	if err != nil {
		return r.LogStart(), err
	}
	defer done()

	r.mu.Lock()
	cur := r.logStart
	// Only committed records (below the HWM) are ever removed: a record
	// above it may still be cut by a truncation and replaced, and a
	// follower or promotion may need it. Only durable ones (below
	// DurableEnd): a power loss must never take records at or above a
	// persisted start, or Open would find the log ending below its start.
	target := min(to, r.hwm, r.durableEnd)
	dropped, busy := r.dropped, r.truncating
	r.mu.Unlock()
	switch {
	case dropped:
		return cur, fmt.Errorf("%w: AdvanceLogStart(%d) on %s", ErrDropped, to, r.id)
	case busy:
		// Truncate and ResetTo hold cutMu exclusively: only a DropRange of
		// this value that failed leaves this set.
		return cur, fmt.Errorf("%w: AdvanceLogStart(%d) on %s", ErrBusy, to, r.id)
	case target <= cur:
		// Never lowered: records below the current start are gone.
		return cur, nil
	}
	s := r.s
	if err := s.writeErr(); err != nil {
		return cur, err
	}
	// Every record below target is published (target <= LogEnd), so its
	// batch is in Badger or waiting in unindexed; after this it is in
	// Badger, and no later index commit can write a key below target back.
	if err := s.indexPending(); err != nil {
		return cur, err
	}
	key := rangeKey(prefixLogStart, r.id)
	if err := s.putSynced(key, encodeU64(key, target)); err != nil {
		return cur, err
	}
	if err := s.crash(CrashAdvanceStart); err != nil {
		return cur, err
	}
	r.mu.Lock()
	r.logStart = target
	if r.producers != nil {
		// The producers whose records went are unknown from now on, as
		// to a table rebuilt from the log.
		r.producers.advanceFloor(target)
	}
	r.notifyLocked()
	r.mu.Unlock()
	// target > cur >= 0. The entry in force at target-1 is the epoch of the
	// last removed record: a follower fetching at target sends it as its
	// last fetched epoch, and LastEpoch of a log emptied to target is it.
	if err := r.j.TrimBefore(target - 1); err != nil {
		return target, r.journalErr(fmt.Errorf("logstore: AdvanceLogStart(%d) on %s: trim journal: %w", target, r.id, err))
	}
	if err := s.crash(CrashAdvanceJournal); err != nil {
		return target, err
	}
	n, err := s.deleteBelow(r.id, target, s.crash)
	if err != nil {
		return target, s.fail(err)
	}
	s.log.Debug("advanced log start", "range", r.id, "from", cur, "to", target, "batches", n)
	return target, nil
}

// deleteBelow deletes the l/ keys of range id's batches wholly below start,
// deleteChunk per transaction, not synced, and hands each transaction's
// keys and old values to releaseStored once committed. Each step is
// idempotent (the next call finds what is left). crash, when not nil, is
// called after the first transaction (CrashAdvanceLog). It returns how many
// keys it deleted.
func (s *Store) deleteBelow(id string, start uint64, crash func(string) error) (int, error) {
	prefix := logPrefix(id)
	n := 0
	seek := logKey(id, 0)
	for {
		var keys, vals [][]byte
		more := false
		err := s.db.View(func(txn *badger.Txn) error {
			it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
			defer it.Close()
			for it.Seek(seek); it.Valid(); it.Next() {
				item := it.Item()
				base, err := parseLogKey(prefix, item.Key())
				if err != nil {
					return err
				}
				if base >= start {
					return nil
				}
				val, err := item.ValueCopy(nil)
				if err != nil {
					return err
				}
				// The count is in the header of a pointer and of a batch
				// alike. Keys are in offset order and batches do not
				// overlap: the first batch not wholly below start is the
				// one straddling it, and every later one is above it.
				if base+storedCount(val) > start {
					return nil
				}
				if len(keys) == deleteChunk {
					more = true
					return nil
				}
				keys, vals = append(keys, item.KeyCopy(nil)), append(vals, val)
			}
			return nil
		})
		if err == nil && len(keys) > 0 {
			err = s.db.Update(func(txn *badger.Txn) error {
				for _, k := range keys {
					if err := txn.Delete(k); err != nil {
						return err
					}
				}
				return nil
			})
		}
		if err != nil {
			return n, fmt.Errorf("logstore: delete %s below its log start %d: %w", id, start, err)
		}
		if len(keys) == 0 {
			return n, nil
		}
		s.releaseStored(keys, vals)
		if n == 0 && crash != nil {
			if err := crash(CrashAdvanceLog); err != nil {
				return n + len(keys), err
			}
		}
		n += len(keys)
		if !more {
			return n, nil
		}
		seek = keys[len(keys)-1]
		seek = append(bytes.Clone(seek), 0) // just after the last deleted key
	}
}

// epochInForce returns the epoch of the last entry of h starting at or
// below offset, 0 when there is none: the epoch of the record at offset,
// for a journal that describes the log there.
func epochInForce(h []journal.EpochStart, offset uint64) uint64 {
	i := sort.Search(len(h), func(i int) bool { return h[i].Start > offset }) - 1
	if i < 0 {
		return 0
	}
	return h[i].Epoch
}

// ResetTo discards the whole log of a follower that is wholly below the
// leader's log start (it was down while retention ran there): everything it
// lacks up to start is committed and was deleted on purpose. It requires
// AssignedEnd <= start and HWM <= start (else ErrInvalid: it never discards
// a record at or above start, nor claims one it does not hold). Afterwards
// LogStart == LogEnd == HWM == start, LastEpoch is 0 and the journal is
// empty: the next record fetched journals its epoch, as AppendRecords
// always does, and appends resume at start.
//
// Crash-safe, in order: quiesce the range (writes refused, ErrBusy, as in
// Truncate); empty the journal (fsynced; a crash here leaves the old log and
// an empty journal, which Open rebuilds from the log: nothing reset);
// persist the start, the HWM and the synced-end marker at start in one
// transaction and sync (the reset is done from here: Open deletes every key
// below the start and finds an empty log at it); delete the old log keys;
// publish.
func (r *Range) ResetTo(start uint64) error {
	// A quarantined range has no journal to empty; only DropRange clears it.
	if err := r.usable("ResetTo"); err != nil {
		return err
	}
	r.cutMu.Lock()
	defer r.cutMu.Unlock()
	r.startMu.Lock()
	defer r.startMu.Unlock()
	done, err := r.s.begin()
	if err != nil {
		return err
	}
	defer done()
	s := r.s

	r.mu.Lock()
	switch {
	case r.dropped:
		r.mu.Unlock()
		return fmt.Errorf("%w: ResetTo(%d) on %s", ErrDropped, start, r.id)
	case r.truncating:
		r.mu.Unlock()
		return fmt.Errorf("%w: ResetTo(%d) on %s", ErrBusy, start, r.id)
	case r.next > start:
		// Records at or above start may be the leader's too: discarding
		// them is a truncation's job, which checks them against the
		// leader's history. (A start below the log start lands here as
		// well: the log start never decreases.)
		end := r.next
		r.mu.Unlock()
		return fmt.Errorf("%w: ResetTo(%d) on %s: the log ends at %d, above the start", ErrInvalid, start, r.id, end)
	case r.hwm > start:
		hwm := r.hwm
		r.mu.Unlock()
		return fmt.Errorf("%w: ResetTo(%d) on %s: the high-water mark %d is above the start", ErrInvalid, start, r.id, hwm)
	}
	if err := s.writeErr(); err != nil {
		r.mu.Unlock()
		return err
	}
	r.truncating, r.truncTo = true, start
	if err := r.quiesceLocked(); err != nil {
		r.truncating = false
		r.mu.Unlock()
		return err
	}
	r.mu.Unlock()

	fail := func(err error) error { return s.fail(fmt.Errorf("logstore: ResetTo(%d) on %s: %w", start, r.id, err)) }
	// The journal first: it describes the old log, whose last epoch need
	// not be the leader's at start-1; kept over the reset it would make
	// the follower's fetch claim an epoch the leader never had there.
	if err := r.j.TruncateFrom(0); err != nil {
		return fail(err)
	}
	if err := s.crash(CrashResetJournal); err != nil {
		return err
	}
	err = s.db.Update(func(txn *badger.Txn) error {
		for _, p := range []string{prefixLogStart, prefixHWM, prefixSynced} {
			key := rangeKey(p, r.id)
			if err := txn.Set(key, encodeU64(key, start)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fail(err)
	}
	if err := s.syncDB(); err != nil {
		return fail(err)
	}
	if err := s.crash(CrashResetStart); err != nil {
		return err
	}
	// The old log ends at or below start: every batch is wholly below it.
	// Some may still wait for the index: in Badger first, so no later
	// index commit writes one back.
	if err := s.indexPending(); err != nil {
		return fail(err)
	}
	n, err := s.deleteBelow(r.id, start, nil)
	if err != nil {
		return fail(err)
	}
	if err := s.crash(CrashResetLog); err != nil {
		return err
	}

	r.mu.Lock()
	r.logStart, r.next, r.logEnd, r.durableEnd, r.hwm = start, start, start, start, start
	r.tailEpoch, r.lastEpoch = 0, 0
	r.demandEnd = min(r.demandEnd, start)
	r.demanded.Store(false)
	// As a truncation: the in-memory tail and a sync taken before are void.
	r.truncGen++
	r.lastTruncTo = start
	r.producers = nil
	r.truncating = false
	r.notifyLocked()
	r.mu.Unlock()
	s.log.Info("reset the log to the leader's log start", "range", r.id, "start", start, "batches", n)
	return nil
}

// errBelowStartGap reports whether a failed read of offset (a missing
// record) is explained by a log start that moved above it meanwhile.
func (r *Range) errBelowStartGap(op string, offset uint64, err error) error {
	if err != nil && errors.Is(err, ErrCorrupt) {
		if below := r.belowStart(op, offset); below != nil {
			return below
		}
	}
	return err
}
