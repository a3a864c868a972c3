package logstore

import (
	"fmt"
	"time"
)

// The index trails the WAL.
//
// A group commit is durable once its WAL entry is fdatasynced (wal.go) and
// readable once published: the range's in-memory tail (range.go) keeps
// every write until Badger holds it, and Read, ReadTail and EpochAt read
// the tail above what Badger holds. So no commit waits for Badger. The
// writer, or a follower committing inline, appends a batch to the WAL,
// publishes it and syncs it; the batch's keys wait in unindexed, and the
// indexer (indexLoop) commits them to Badger later, every batch waiting in one
// transaction, once the oldest has waited indexDelay or they hold
// indexMaxBytes.
//
// Why: a Badger commit is a hand-off to Badger's writer goroutine, which
// starts a goroutine of its own per commit (its stack grown by copying on
// every commit: ~6% of the process's CPU at one append in flight), writes
// its memtable WAL and inserts into the skiplist, then wakes the
// committer. (The batches themselves go to segment files, one pwrite per
// index commit, and Badger gets pointers: segment.go.) One per batch per replica sat on every acknowledgement's
// path: a follower's Badger commit before its fdatasync, and the leader's
// while its answers to the followers were being sent, competing for the
// two cores. Measured with the bench module at one in flight (stage
// timestamps, 2026-12-02): 47 us p50 of Badger commit on the follower's
// path; with no Badger write at all, as an upper bound, p50 went from
// ~1.10 to ~0.92 ms.
//
// Order. A batch joins unindexed under wal.mu, in the same critical
// section as its WAL append, so unindexed is in WAL order and a WAL switch
// (also under wal.mu) happens after every entry of the old file has
// joined it. A checkpoint indexes everything waiting before it syncs
// Badger (checkpoint, wal.go), so it still covers every entry of the old
// file. Truncate forces a checkpoint before it cuts, so nothing of the
// range waits to be indexed when its keys are deleted; Close indexes the
// rest before writing its final markers.
//
// A crash loses nothing durable: Badger was never synced for a group
// commit, and Open replays the WAL into it, as before.

// indexDelay bounds how long a batch waits for others to share its Badger
// commit. At one append in flight (~1-3k appends/s here) that is a handful
// of batches per commit; every read of a waiting batch is served from
// memory meanwhile.
//
// 25 ms, not 5: an index commit costs about the same whatever it carries
// (a segment write, a Badger transaction with its hand-offs, the time
// marks), and 25 ms against 5 ms gave 1.04-1.19x the records/s by shape,
// six rounds alternating which ran first (bench module, 2026-12-06, on a
// box with fast fsyncs). On the next box (2026-12-07), with the indexer
// on a goroutine of its own and indexMaxBytes 512 KiB, against 5 ms with
// the writer indexing: 1.14x at 100 ranges (CPU per record 224 -> 205 us),
// 0.98-1.05x on one range, 14 alternating rounds. What waits is bounded by
// indexMaxBytes, and served from the tails meanwhile.
// It was reverted once, because StoredBytes then counted a batch only once
// indexed and trailed an append by 25 ms (a status reader comparing two
// snapshots saw bytes arrive by themselves); StoredBytes now counts a batch
// when published (marks.go), and only retention, which can cut indexed
// batches only, waits for the index (IndexedBytes, IndexGrown).
var indexDelay = 25 * time.Millisecond

// indexMaxBytes bounds the value bytes waiting to be indexed before the
// indexer indexes them at once: it bounds the memory the tails hold beyond
// their keep limits (range.go) under load, and the size of one Badger
// commit (which splits itself at Badger's transaction limit anyway).
// 512 KiB, not the 4 MiB it was: with the 25 ms delay, 4 MiB let one
// replica at 256 appends in flight index ~2 MiB at a time, and that shape
// gave 0.91x the records/s of 5 ms (six alternating rounds, 2026-12-07;
// the cause was not isolated). With 512 KiB: 0.98x, and 1.14x at 100
// ranges (14 rounds).
// A variable so tests can hold batches unindexed.
var indexMaxBytes = 512 << 10

// indexBatch is one group commit's keys and values, in the WAL and not
// yet in Badger, and its writes (their ranges' tails hold them until then).
type indexBatch struct {
	keys, vals [][]byte
	writes     []*write
	bytes      int
}

// addUnindexed queues ib for the index. The caller holds wal.mu and has
// just appended ib's entry to the WAL.
func (s *Store) addUnindexed(ib *indexBatch) {
	s.imu.Lock()
	defer s.imu.Unlock()
	s.unindexed = append(s.unindexed, ib)
	s.unindexedBytes += ib.bytes
}

// scheduleIndex asks the indexer to index: at once when enough waits,
// otherwise once indexDelay has passed (one timer at a time).
func (s *Store) scheduleIndex() {
	s.imu.Lock()
	n, waiting := s.unindexedBytes, len(s.unindexed) > 0
	s.imu.Unlock()
	if !waiting {
		return
	}
	s.qmu.Lock()
	defer s.qmu.Unlock()
	if n >= indexMaxBytes {
		s.indexDue = true
		s.indexWork.Signal()
		return
	}
	s.dueAfterLocked(&s.indexArmed, &s.indexDue, s.indexWork, indexDelay)
}

// indexLoop is the indexer: it indexes whenever an index is due, until the
// writer exits (indexStop) or the store fails. A goroutine of its own, not
// the writer's: an index commit of a few MiB of new segment pages takes
// milliseconds, and a leader's appends waited behind it for the writer
// (the followers commit inline, beside it). Index commits also run on a
// checkpoint, Truncate, AdvanceLogStart and the writer's exit; indexMu
// serializes them.
func (s *Store) indexLoop() {
	for {
		s.qmu.Lock()
		for !s.indexDue && !s.indexStop && s.failed == nil {
			s.indexWork.Wait()
		}
		stop := s.indexStop || s.failed != nil
		s.indexDue = false
		s.qmu.Unlock()
		if stop {
			return // the writer's exit indexes what is left
		}
		// An index is due. A failure other than a want of space fails the
		// store (the loop then ends); for that one the batches wait again,
		// with a retry due after indexRetryDelay.
		_ = s.indexPending()
	}
}

// indexPending commits every waiting batch to Badger, in WAL order, and
// lets the ranges' tails drop them. Index commits run one at a time
// (indexMu), so when it returns every batch that was waiting when it
// was called is in Badger. A failure fails the store: the batches are
// durable in the WAL, and only a reopen (which replays it) knows what
// Badger holds. Except a segment write refused for want of space, before
// any pointer reached Badger: the batches wait again (requeueUnindexed),
// the store is full (disk.go), and the error wraps ErrDiskFull.
func (s *Store) indexPending() error {
	s.indexMu.Lock()
	defer s.indexMu.Unlock()
	if err := s.writeErrAfterClose(); err != nil {
		// Failed: nothing more is written here; the WAL holds the batches,
		// and they stay queued, so no checkpoint takes them for indexed.
		return err
	}
	s.imu.Lock()
	todo := s.unindexed
	s.unindexed, s.unindexedBytes = nil, 0
	s.imu.Unlock()
	if len(todo) == 0 {
		return nil
	}
	// Every batch waiting goes to the segments in one write; Badger gets
	// the pointers (segment.go), all in WAL order.
	var keys, vals [][]byte
	for _, ib := range todo {
		keys, vals = append(keys, ib.keys...), append(vals, ib.vals...)
	}
	if err := s.toSegments(keys, vals); err != nil {
		if s.noteNoSpace(err) {
			// Refused whole: no pointer was written, the WAL holds every
			// batch and the tails still serve them. They go back in
			// front of what joined since, in WAL order, for a retry.
			s.requeueUnindexed(todo)
			return fmt.Errorf("%w: index batch: %w", ErrDiskFull, err)
		}
		return s.fail(fmt.Errorf("logstore: index batch: %w", err))
	}
	tw := s.newTxnWriter()
	defer tw.discard()
	for i := range keys {
		if err := tw.set(keys[i], vals[i]); err != nil {
			return s.fail(fmt.Errorf("logstore: index batch: %w", err))
		}
	}
	// The time marks of the ranges written, in the same commit (marks.go).
	var writes []*write
	for _, ib := range todo {
		writes = append(writes, ib.writes...)
	}
	plans := s.planMarks(writes)
	if err := s.writeMarks(tw, plans); err != nil {
		return s.fail(fmt.Errorf("logstore: index batch: %w", err))
	}
	if err := tw.commit(); err != nil {
		return s.fail(fmt.Errorf("logstore: commit index batch: %w", err))
	}
	s.indexCommits.Add(1)
	applyMarks(plans)
	grown := map[*Range]bool{}
	indexedBytes := 0
	for _, w := range writes {
		indexedBytes += w.bytes
		// Under indexMu, after the commit: RetainBytes reads the counter
		// and a snapshot together under it (marks.go).
		w.r.rc.indexed.Add(int64(len(w.batch)))
		w.r.indexed(w)
		grown[w.r] = true
	}
	// The indexed part rose: wake IndexGrown once per range.
	for r := range grown {
		r.mu.Lock()
		r.grown.notify()
		r.mu.Unlock()
	}
	// Their bytes' room in the queue, held since they were admitted
	// (reserve), goes back to writers.
	s.release(0, indexedBytes)
	return nil
}

// indexRetryDelay is how long the indexer waits before indexing again
// after the segments refused a write for want of space.
const indexRetryDelay = 200 * time.Millisecond

// requeueUnindexed puts batches an index commit could not write back in
// front of unindexed, and has the indexer retry after indexRetryDelay.
func (s *Store) requeueUnindexed(todo []*indexBatch) {
	s.imu.Lock()
	s.unindexed = append(todo, s.unindexed...)
	for _, ib := range todo {
		s.unindexedBytes += ib.bytes
	}
	s.imu.Unlock()
	s.qmu.Lock()
	s.dueAfterLocked(&s.indexArmed, &s.indexDue, s.indexWork, indexRetryDelay)
	s.qmu.Unlock()
}

// allIndexed reports whether no batch waits for the index.
func (s *Store) allIndexed() bool {
	s.imu.Lock()
	defer s.imu.Unlock()
	return len(s.unindexed) == 0
}

// indexed records that w is in Badger, so the tail may drop it.
func (r *Range) indexed(w *write) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w.indexed = true
	r.trimTailLocked()
}
