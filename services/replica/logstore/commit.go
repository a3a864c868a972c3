package logstore

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/tenurelog/tenure/pkg/journal"
)

// Group commit.
//
// Badger fsyncs once per commit request, and one small synced transaction
// per append tops out near 400 commits/s on the target box, while one
// WriteBatch of 20,000 entries commits in a quarter of a second. So appends
// do not commit themselves. (Durability is the WAL's now, wal.go, and
// Badger is written behind it, index.go; the batching below is what makes
// one fdatasync cover many appends.) Append and AppendRecords assign
// offsets under their range's mutex and put a write on the store's queue.
// Two goroutines per Store then move it through the two later stages, as a
// pipeline:
//
// The writer loops:
//
//  1. take every queued write (across all ranges), and the dirty HWMs when
//     there are records to carry them or they have waited hwmFlushDelay;
//  2. append them to the WAL as one entry, with each touched range's
//     synced-end marker (Badger receives them later: index.go);
//  3. publish the new log ends: the records are readable, Append returns,
//     Changed wakes (a follower's fetch can take them now);
//  4. hand the new log ends to the syncer, and go back to 1 at once.
//
// The syncer loops: take every log end handed over so far, fdatasync the
// WAL once (syncWAL, wal.go), then publish them as durable ends and wake
// again (the leader can count them toward the commit). For a leader whose
// quorum needs a follower it first waits for a demand: a fetch that took
// the records, or a wait for their durability (see "Sync on demand").
//
// So an append that arrives while an fsync is in flight is written, and
// fetchable by followers, at once instead of one fsync later; and under load
// the next fsync covers every batch written during the previous one.
//
// A follower's AppendRecords may play both parts itself (writeInline): when
// no commit is running it takes the queue, commits and publishes it, then
// syncs it, on its own goroutine. Commits still never overlap (writerBusy
// is the writer role, whoever holds it), so the queue order stays the
// commit order. A
// durable end is only ever the end of a batch whose commit returned before
// the sync that publishes it started, so it is covered by that sync; and
// only if no truncation cut that batch meanwhile (syncEnd), or the end would
// cover records written at the same offsets after the sync began.
//
// Offsets are assigned in call order under the range mutex, and a write is
// queued before that mutex is released, so each range's writes sit in the
// queue in offset order and commit in offset order. Badger replays its WAL
// as a prefix, so a crash leaves each range's log a prefix too (see
// recoverLogEnd for the power-loss case).

// hwmFlushDelay bounds how long a raised HWM waits for a records batch to
// ride before the writer commits it alone. A leader raises its HWM on every
// follower ack and a follower after every fetch: committing each one alone
// costs a Badger write that the next records batch then waits behind. The
// persisted HWM may lag anyway (see SetHWM); this only bounds by how much
// when the range goes idle.
const hwmFlushDelay = 5 * time.Millisecond

// The queue is bounded so that a burst of appends (or a slow disk) applies
// backpressure to writers instead of growing memory: at most maxQueueRecords
// records wait or are being committed at once, and at most maxQueueBytes of
// values wait, are being committed, or wait in the WAL for the index
// (index.go), whose batches the ranges' tails hold in memory until then.
// The index runs on a goroutine of its own, so nothing else stops commits
// from outrunning it: with the index stalled (Badger throttling its
// writes, a slow disk under the segments), appends went on, and the WAL
// file and the tails grew without bound. 64 MiB is 8 full batches
// (wire.MaxBatchBytes) and well below what the box can spare, and far
// above what waits for the index when it keeps up (indexMaxBytes); 64k
// records is 16 full batches (wire.MaxBatchRecords). A single write is
// always admitted when nothing waits, so any valid batch fits. Variables
// so tests can reach the bounds with small batches.
var (
	maxQueueBytes   = 64 << 20
	maxQueueRecords = 64 << 10
)

// write is one Append or AppendRecords on the queue: records [base, end) of
// range r, encoded as one stored batch under key (batch.go); vals are its
// records, slices of batch.
type write struct {
	r         *Range
	base, end uint64
	lastEpoch uint64 // epoch of the record at end-1
	key       []byte
	batch     []byte
	vals      [][]byte
	bytes     int // value bytes, as reserved
	// indexed: Badger holds the write (index.go), so the tail may drop
	// it. Guarded by r.mu.
	indexed bool

	err  error
	done chan struct{} // closed when committed (err nil) or failed
}

func (w *write) finish(err error) {
	w.err = err
	close(w.done)
}

// reserve waits for room for records and bytes in the queue and takes it.
// The records' room comes back when their write is committed, the bytes'
// when it is indexed (commitBatch, indexPending).
func (s *Store) reserve(records, bytes int) error {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	waited := false
	for {
		if err := s.writeErrLocked(); err != nil {
			return err
		}
		empty := s.queuedRecords == 0 && s.queuedBytes == 0
		if empty || s.queuedRecords+records <= maxQueueRecords && s.queuedBytes+bytes <= maxQueueBytes {
			break
		}
		if !waited {
			// Counted once per write, not per wake-up: QueueStatus's
			// Waits says how many appends the bounds held back.
			waited = true
			s.queueWaits++
		}
		s.space.Wait()
	}
	s.queuedRecords += records
	s.queuedBytes += bytes
	return nil
}

// QueueStatus is the append queue's room held now against its bounds
// (reserve). An append waits for room while either held amount would pass
// its bound: Records when group commits fall behind, Bytes also when the
// index does (Badger throttling its writes, a slow disk under the
// segments), since a write's bytes are held until it is indexed.
type QueueStatus struct {
	// Records admitted and not yet committed, and their bound.
	Records, MaxRecords int
	// Value bytes admitted and not yet indexed, and their bound.
	Bytes, MaxBytes int
	// Waits counts the writes (appends, follower writes) that had to wait
	// for room since Open.
	Waits uint64
}

// QueueStatus returns the queue's room held now, its bounds and how many
// writes waited for room.
func (s *Store) QueueStatus() QueueStatus {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	return QueueStatus{Records: s.queuedRecords, MaxRecords: maxQueueRecords, Bytes: s.queuedBytes, MaxBytes: maxQueueBytes, Waits: s.queueWaits}
}

// release returns room taken by reserve.
func (s *Store) release(records, bytes int) {
	s.qmu.Lock()
	s.queuedRecords -= records
	s.queuedBytes -= bytes
	s.space.Broadcast()
	s.qmu.Unlock()
}

// enqueue puts w on the queue and, if wake is set, wakes the writer. The
// caller holds w.r.mu, which is what keeps a range's writes in offset order
// on the queue. A caller that does not wake the writer must call
// writeInline next: a queued write must never wait for a writer nobody
// woke (writeInline either commits it, or leaves it to the commit running
// now, whose end wakes the writer).
func (s *Store) enqueue(w *write, wake bool) error {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	if err := s.writeErrLocked(); err != nil {
		return err
	}
	s.queue = append(s.queue, w)
	if wake {
		s.work.Signal()
	}
	return nil
}

// markDirty asks the writer to persist r's HWM: with the next records batch,
// or alone after hwmFlushDelay. The caller holds r.mu.
func (s *Store) markDirty(r *Range) {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	s.dirty[r] = struct{}{}
	s.dueAfterLocked(&s.hwmArmed, &s.hwmDue, s.work, hwmFlushDelay)
}

// dueAfterLocked sets *due and wakes the one goroutine waiting on c (the
// writer, or the indexer) after d, unless *due is set already or a timer
// for it is armed (*armed). s.qmu is held.
func (s *Store) dueAfterLocked(armed, due *bool, c *sync.Cond, d time.Duration) {
	if *armed || *due {
		return
	}
	*armed = true
	time.AfterFunc(d, func() {
		s.qmu.Lock()
		*armed, *due = false, true
		c.Signal()
		s.qmu.Unlock()
	})
}

// batch is what the writer takes from the queue in one go.
type batch struct {
	writes []*write
	hwms   []*Range
}

// run is the committer: the writer loop here, and the syncer loop and the
// indexer loop (index.go) in goroutines of their own. It exits once the
// store is closing and the queue is drained and synced, or at the first
// failure.
func (s *Store) run() {
	syncerDone, indexerDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(syncerDone)
		s.syncLoop()
	}()
	go func() {
		defer close(indexerDone)
		s.indexLoop()
	}()
	defer func() {
		s.qmu.Lock()
		// A caller still committing inline (writeInline) finishes first:
		// after this the syncer may exit, and Close closes the database.
		for s.writerBusy {
			s.work.Wait()
		}
		s.writerDone = true
		s.syncWork.Signal()
		s.indexStop = true
		s.indexWork.Signal()
		s.qmu.Unlock()
		<-syncerDone
		<-indexerDone
		// Nothing joins unindexed any more (no writer, no inline commit):
		// index the rest, so Close's final markers and a reopen find
		// Badger complete. A failure has failed the store.
		_ = s.indexPending()
		s.qmu.Lock()
		s.stopped = true
		s.qmu.Unlock()
		close(s.done)
		s.wakeAll()
	}()
	for {
		b, ok := s.take()
		if !ok {
			return
		}
		_, err := s.commitBatch(b, true)
		s.qmu.Lock()
		s.writerBusy = false
		s.qmu.Unlock()
		if err != nil {
			return // commitBatch failed the store
		}
	}
}

// take waits for work: it takes the queue and the dirty HWMs (and the
// writer role) to commit; ok false means exit. Dirty HWMs alone are work
// only once due (or at Close).
func (s *Store) take() (b batch, ok bool) {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	commit := func() bool {
		return !s.writerBusy && (len(s.queue) > 0 || len(s.dirty) > 0 && s.hwmDue || s.closing)
	}
	for s.failed == nil && !commit() {
		s.work.Wait()
	}
	if s.failed != nil {
		return batch{}, false // fail already failed the queue
	}
	if len(s.queue) == 0 && len(s.dirty) == 0 {
		return batch{}, false // closing and drained
	}
	s.writerBusy = true
	return s.takeLocked(), true
}

// takeLocked takes the queue and the dirty HWMs for the caller, which holds
// qmu and has just set writerBusy.
func (s *Store) takeLocked() batch {
	s.takes++
	b := batch{writes: s.queue}
	for r := range s.dirty {
		b.hwms = append(b.hwms, r)
	}
	s.queue = nil
	clear(s.dirty)
	s.hwmDue = false
	return b
}

// writeInline runs the group commit on the caller's goroutine when no
// commit is running: it writes, commits and publishes everything queued
// (the caller's own write among it), then syncs it, exactly as the writer
// and the syncer would. For a follower applying a fetched batch that saves
// four goroutine hand-offs on the way to its acknowledgement: to the writer
// and back, to the syncer and back to the caller. On a busy 2-core box each
// hand-off waits its turn behind every other runnable goroutine. (A
// leader's Append does not call it; see Append.) When a commit is
// already running the write stays queued for the writer, which takes it
// next, so commits still never overlap and the queue order is still the
// commit order; a sync may still run beside the next commit, as with the
// syncer.
//
// With syncInline false the caller only commits, and hands the sync to the
// syncer as the writer does: CommitQueued's caller, a fetch session's
// receiver, is then free for the next message while the sync runs, and the
// records that message brings join the next sync.
func (s *Store) writeInline(syncInline bool) {
	s.qmu.Lock()
	if s.writerBusy || len(s.queue) == 0 || s.failed != nil || s.closing {
		// Busy: the writer takes the queue next. Closing: the writer
		// drains it.
		s.qmu.Unlock()
		return
	}
	s.writerBusy = true
	b := s.takeLocked()
	s.qmu.Unlock()
	ends, err := s.commitBatch(b, !syncInline)
	if !syncInline {
		ends = nil // the syncer has them
	}
	s.qmu.Lock()
	s.writerBusy = false
	// Wake the writer only if it has something to do (writes queued
	// meanwhile, due HWMs, a close or a failure: what it waits on). Woken
	// for nothing it costs a wake-up per inline commit, and it may take the
	// caller's next write from under its writeInline, which then goes the
	// slow way, through the writer and the syncer.
	if len(s.queue) > 0 || s.hwmDue || s.indexDue || s.closing || s.failed != nil {
		s.work.Signal()
	}
	if err != nil || len(ends) == 0 {
		s.qmu.Unlock()
		return
	}
	// Counted before writerBusy is seen clear by anyone (same critical
	// section): the syncer does not exit, and Close does not close the
	// database, while this sync runs.
	s.inlineSyncs++
	// Take what the writer handed the syncer too: one sync covers it all.
	mergeEnds(ends, s.takeUnsyncedLocked())
	s.qmu.Unlock()
	s.syncEnds(ends)
	s.qmu.Lock()
	s.inlineSyncs--
	// The syncer waits for inline syncs only on its way out (the writer
	// exited or the store failed, and neither is ever undone). Woken at
	// any other time it would find nothing new: this sync took its work.
	if s.writerDone || s.failed != nil {
		s.syncWork.Broadcast()
	}
	s.qmu.Unlock()
}

// syncEnds makes ends durable: one WAL sync, which covers every batch
// appended before it started (these ends were committed, and appended to
// the WAL, before the call), then the durable ends are published. A failed sync fails the store: the
// records stay written but never become durable, and WaitDurable returns
// the failure.
func (s *Store) syncEnds(ends map[*Range]syncEnd) bool {
	err := s.crash(CrashCommitSync)
	if err == nil {
		err = s.syncWAL()
	}
	if err != nil {
		_ = s.fail(err)
		return false
	}
	if h := syncedHook.Load(); h != nil {
		plain := make(map[*Range]uint64, len(ends))
		for r, e := range ends {
			plain[r] = e.end
		}
		(*h)(plain)
	}
	for r, e := range ends {
		r.madeDurable(e)
	}
	return true
}

// syncEnd is a range's log end handed to a sync, with the truncation
// generation (Range.truncGen) its records were published under. A sync
// publishes it as durable only if no truncation came in between: after one,
// the offsets below end may hold newer records, written after the sync's
// fdatasync began, which it need not have covered.
type syncEnd struct{ end, gen uint64 }

// later returns whichever of a and b describes the range's log as it is
// now: the one of the newer generation (an older one's offsets were cut),
// or within one generation the larger end.
func (a syncEnd) later(b syncEnd) syncEnd {
	if a.gen != b.gen {
		if a.gen > b.gen {
			return a
		}
		return b
	}
	if a.end >= b.end {
		return a
	}
	return b
}

// mergeEnds adds from's ends to into, keeping per range the later one.
func mergeEnds(into, from map[*Range]syncEnd) {
	for r, e := range from {
		if cur, ok := into[r]; ok {
			e = cur.later(e)
		}
		into[r] = e
	}
}

// syncedHook, when set (tests only), runs after a sync and before its ends
// are published as durable: the seam that holds a sync there.
var syncedHook atomic.Pointer[func(ends map[*Range]uint64)]

// commitBatch writes, commits and publishes one batch and returns its log
// ends, after handing them to the syncer if handoff is set (otherwise the
// caller syncs them). The caller holds the writer role (writerBusy). An
// error has failed the store: what reached the disk is unknown until
// reopened.
func (s *Store) commitBatch(b batch, handoff bool) (map[*Range]syncEnd, error) {
	records, bytes := 0, 0
	for _, w := range b.writes {
		records += len(w.vals)
		bytes += w.bytes
	}
	var err error
	if len(b.writes) > 0 {
		err = s.crash(CrashCommitWrite)
	}
	if err == nil {
		err = s.writeBatch(b)
	}
	// In the WAL (or failed): the records' room goes back to writers while
	// this batch syncs. Its bytes' room comes back once Badger indexes it
	// (indexPending): until then the tails hold the batch in memory.
	if err != nil {
		s.release(records, bytes)
		err = s.fail(err)
		for _, w := range b.writes {
			w.finish(err)
		}
		return nil, err
	}
	s.release(records, 0)
	s.commits.Add(1)

	// Publish in queue order: each range's writes are in offset order.
	ends := map[*Range]syncEnd{}
	for _, w := range b.writes {
		gen := w.r.published(w)
		ends[w.r] = syncEnd{end: w.end, gen: gen}
		w.finish(nil)
	}
	s.scheduleIndex()
	if len(ends) == 0 || !handoff {
		// Only HWMs: they ride the next sync (see SetHWM), so an idle
		// follower's HWM updates cost no fsync of their own.
		return ends, nil
	}
	// Committed before the handover, so the sync that takes these ends,
	// which starts after it, covers them.
	s.qmu.Lock()
	mergeEnds(s.unsynced, ends)
	s.syncWork.Signal()
	s.qmu.Unlock()
	return ends, nil
}

// Sync on demand.
//
// A leader whose commit needs a follower's copy (a replica set of two or
// more: a quorum is then at least two) gains nothing from syncing records
// that no follower holds yet. Its own copy counts toward the HWM only
// beside a follower's, and a follower holds a copy only once a fetch took
// it. Yet its syncer would fsync after every group commit: measured with
// the bench module's 64-clients shape, the leader synced ~1000 times/s
// against ~240 per follower, each sync competing for the disk and the two
// cores with the followers' syncs that the commit waits for. For such a
// range (SetSyncOnDemand) the syncer syncs once something needs the
// records durable:
//
//   - a fetch took records above the durable end (ReadTail): a commit may
//     pair this copy with the follower's, whose sync starts about now;
//   - someone waits for durability (WaitDurable; a fence or a truncation
//     quiescing the range);
//   - syncDemandDelay passed since the syncer began waiting with them, so
//     what a leader holds unreplicated is durable within a bound anyway.
//
// Other ranges (followers, a leader alone) make every hand-over due at
// once, as before, and one fdatasync covers every range's writes. Only
// when a write becomes durable changes, never what counts as durable.

// syncDemandDelay bounds how long writes of ranges that sync on demand
// wait for a demand: about one sync every few ms when followers fetch
// nothing (they are down, or far behind), at most two delays after the
// previous sync. A variable so tests can hold writes unsynced.
var syncDemandDelay = 5 * time.Millisecond

// SetSyncOnDemand says whether the syncer may wait for a demand before
// making this range's writes durable (see "Sync on demand"): set it only
// while the range leads a replica set whose quorum needs a follower.
// Turning it off makes what waits due at once.
func (r *Range) SetSyncOnDemand(on bool) {
	if r.syncOnDemand.Swap(on) && !on {
		// Its waiting writes are due now: the syncer sees that once woken.
		s := r.s
		s.qmu.Lock()
		s.syncWork.Signal()
		s.qmu.Unlock()
	}
}

// SyncsOnDemand reports whether SetSyncOnDemand set r to sync on demand.
func (r *Range) SyncsOnDemand() bool { return r.syncOnDemand.Load() }

// demandLocked says something needs r durable up to end: if that is above
// the durable end of a range that syncs on demand, the syncer syncs once
// it holds r's writes (at once if it does). r.mu is held (r.mu comes
// before s.qmu, as in enqueue).
func (r *Range) demandLocked(end uint64) {
	if !r.syncOnDemand.Load() || end <= r.durableEnd {
		return
	}
	r.demandEnd = max(r.demandEnd, end)
	r.demanded.Store(true)
	s := r.s
	s.qmu.Lock()
	// With nothing handed over yet (a fetch usually takes records while
	// the writer still writes them) the hand-over wakes the syncer: a
	// wake-up now would find nothing to do.
	if _, waiting := s.unsynced[r]; waiting {
		s.syncWork.Signal()
	}
	s.qmu.Unlock()
}

// syncReadyLocked reports whether the syncer has a sync due: unsynced
// ends, and a demand or a range that syncs at once among them. When only
// ranges that sync on demand wait, it arms the timer that bounds their
// wait. s.qmu is held.
func (s *Store) syncReadyLocked() bool {
	if len(s.unsynced) == 0 {
		return false
	}
	if s.syncDue {
		return true
	}
	for r := range s.unsynced {
		if !r.syncOnDemand.Load() || r.demanded.Load() {
			return true
		}
	}
	if !s.syncArmed {
		s.syncArmed = true
		round := s.syncRounds
		time.AfterFunc(syncDemandDelay, func() {
			s.qmu.Lock()
			defer s.qmu.Unlock()
			s.syncArmed = false
			// Armed before a sync that took the writes then waiting: the
			// writes waiting now came later. The syncer re-arms for them.
			if s.syncRounds == round {
				s.syncDue = true
			}
			s.syncWork.Signal()
		})
	}
	return false
}

// takeUnsyncedLocked takes the log ends waiting for a sync, and with them
// any demand for one. s.qmu is held.
func (s *Store) takeUnsyncedLocked() map[*Range]syncEnd {
	ends := s.unsynced
	s.unsynced = map[*Range]syncEnd{}
	s.syncDue = false
	s.syncRounds++
	return ends
}

// syncLoop is the syncer: it makes the log ends the writer handed over
// durable, one db.Sync for all of them, until the writer has exited and
// nothing is left, or the store fails.
func (s *Store) syncLoop() {
	for {
		s.qmu.Lock()
		for !s.syncReadyLocked() && !s.writerDone && s.failed == nil {
			s.syncWork.Wait()
		}
		if s.failed != nil || len(s.unsynced) == 0 {
			// Exiting lets Close close the database: wait for syncs
			// running inline (writeInline) first. None starts now: the
			// writer has exited, so nobody commits inline any more.
			for s.inlineSyncs > 0 {
				s.syncWork.Wait()
			}
			s.qmu.Unlock()
			return
		}
		ends := s.takeUnsyncedLocked()
		s.qmu.Unlock()
		if !s.syncEnds(ends) {
			return
		}
	}
}

// writeErrAfterClose is the failure the store ended with, if any.
func (s *Store) writeErrAfterClose() error {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	return s.failed
}

// writeFinalMarkers sets every range's synced-end marker to its log end, at
// a clean Close: the writer and the syncer have drained, so every record is
// synced, and Close holds s.life exclusively, so no Truncate is lowering a
// marker meanwhile. A marker written with a batch is the durable end when
// that batch was written, which with the syncer running alongside can be a
// few batches behind; without this a clean restart would re-check that tail
// as if it could have been lost (and cut damage there instead of refusing it
// as ErrCorrupt). Badger's Close makes it durable.
func (s *Store) writeFinalMarkers() error {
	wb := s.db.NewWriteBatch()
	defer wb.Cancel()
	for _, r := range s.snapshotRanges() {
		r.mu.Lock()
		end, quiet := r.durableEnd, r.durableEnd == r.logEnd && r.next == r.logEnd
		r.mu.Unlock()
		if !quiet || end == 0 {
			continue
		}
		key := rangeKey(prefixSynced, r.id)
		if err := wb.Set(key, encodeU64(key, end)); err != nil {
			return fmt.Errorf("logstore: close: write synced-end markers: %w", err)
		}
	}
	if err := wb.Flush(); err != nil {
		return fmt.Errorf("logstore: close: write synced-end markers: %w", err)
	}
	return nil
}

// writeBatch appends b's records, each touched range's synced-end marker
// and the dirty HWMs, in order, to the WAL as one entry; the same keys join
// unindexed, for a later Badger commit (index.go).
func (s *Store) writeBatch(b batch) error {
	// A key per write (its stored batch) and at most one synced-end marker
	// per write, then the HWMs.
	n := 2*len(b.writes) + len(b.hwms)
	keys, vals := make([][]byte, 0, n), make([][]byte, 0, n)
	add := func(k, v []byte) { keys, vals = append(keys, k), append(vals, v) }
	touched := map[*Range]bool{}
	for _, w := range b.writes {
		add(w.key, w.batch)
		touched[w.r] = true
	}
	// The synced-end marker says "records below this were durable before
	// this batch was written": whatever survives of this batch after a
	// crash, recovery trusts the log up to the marker and checks only the
	// tail above it for records lost to an unsynced write (recoverLogEnd).
	// DurableEnd is raised only after a sync returned, so it is such an
	// offset even while the syncer is syncing earlier batches. (Durable in
	// the WAL: Open replays it before recovery reads the marker. Indexed
	// later, it still says the same: records below it were durable before
	// this batch was written.)
	for r := range touched {
		key := rangeKey(prefixSynced, r.id)
		add(key, encodeU64(key, r.DurableEnd()))
	}
	// HWMs after the records: a HWM is never persisted ahead of the records
	// it covers (transactions commit, and replay, in this order).
	for _, r := range b.hwms {
		key := rangeKey(prefixHWM, r.id)
		add(key, encodeU64(key, r.HWM()))
	}
	ib := &indexBatch{keys: keys, vals: vals, writes: b.writes}
	for _, w := range b.writes {
		ib.bytes += w.bytes
	}
	return s.appendWAL(ib)
}

// txnWriter writes a sequence of keys in Badger transactions committed one
// after the other, starting a new one when the current one is full
// (ErrTxnTooBig: 15% of the memtable). It is what a WriteBatch does, minus
// its hand-offs: WriteBatch.Flush commits through CommitWith, whose callback
// runs on a goroutine of its own that then wakes the flusher through a
// throttle, two more goroutine wake-ups per commit.
// Txn.Commit waits for Badger's writer itself. Transactions are committed in
// order, so a crash leaves a prefix of them (Badger replays its WAL in
// order), as with WriteBatch.
type txnWriter struct {
	db  *badger.DB
	txn *badger.Txn
}

func (s *Store) newTxnWriter() *txnWriter {
	return &txnWriter{db: s.db, txn: s.db.NewTransaction(true)}
}

func (t *txnWriter) set(key, val []byte) error {
	err := t.txn.Set(key, val)
	if !errors.Is(err, badger.ErrTxnTooBig) {
		return err
	}
	if err := t.commit(); err != nil {
		return err
	}
	t.txn = t.db.NewTransaction(true)
	return t.txn.Set(key, val)
}

func (t *txnWriter) del(key []byte) error {
	err := t.txn.Delete(key)
	if !errors.Is(err, badger.ErrTxnTooBig) {
		return err
	}
	if err := t.commit(); err != nil {
		return err
	}
	t.txn = t.db.NewTransaction(true)
	return t.txn.Delete(key)
}

// commit commits the current transaction; the writer is then spent until
// set starts another.
func (t *txnWriter) commit() error {
	txn := t.txn
	t.txn = nil
	return txn.Commit()
}

// discard drops an uncommitted transaction (after a failure).
func (t *txnWriter) discard() {
	if t.txn != nil {
		t.txn.Discard()
	}
}

// published makes w's records visible: the writer calls it in queue order
// after the commit. It returns the truncation generation they were published
// under, which their sync must still find (madeDurable).
func (r *Range) published(w *write) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	// Assert the contiguity the queue order guarantees: a write that does
	// not start at the log end means offsets were handed out wrongly.
	if w.base != r.logEnd {
		panic(fmt.Sprintf("logstore: range %s: committed write at %d, log end is %d", r.id, w.base, r.logEnd))
	}
	r.logEnd, r.lastEpoch = w.end, w.lastEpoch
	// Counted with the log end that makes it readable (marks.go), not
	// when indexed.
	r.rc.published.Add(int64(len(w.batch)))
	r.trimTailLocked()
	r.notifyLocked()
	return r.truncGen
}

// madeDurable raises durableEnd to e.end after a sync.
func (r *Range) madeDurable(e syncEnd) {
	r.mu.Lock()
	defer r.mu.Unlock()
	// A truncation since these records were published cut them, and set
	// durableEnd to its target itself (everything below was synced first).
	// The offsets up to e.end may hold newer records by now, written after
	// this sync's fdatasync began: publishing e.end would count them durable
	// (a follower would report them to its leader as held, a leader count
	// them toward the commit) though a power loss may take them.
	if e.gen != r.truncGen {
		return
	}
	end := e.end
	// Truncate waits for the range to be durable before cutting, so end
	// never exceeds logEnd; min keeps the invariant if that ever changed.
	if end = min(end, r.logEnd); end > r.durableEnd {
		r.durableEnd = end
		if end >= r.demandEnd {
			r.demanded.Store(false)
		}
		r.notifyLocked()
	}
}

// isJournalIOFailure reports whether a journal error means the journal's
// file is in an unknown state (a failed write, fsync or truncate), as
// opposed to a refusal of the request.
func isJournalIOFailure(err error) bool {
	return errors.Is(err, journal.ErrPoisoned)
}
