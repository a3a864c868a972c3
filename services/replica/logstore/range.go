package logstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// State is a range's durable metadata.
type State struct {
	// FencedEpoch is the highest epoch this replica has been fenced at.
	// Invariant: never decreases (SetState refuses).
	FencedEpoch uint64
	// Epoch is the epoch the replica acts under (leads or follows).
	// Invariant: Epoch <= FencedEpoch.
	Epoch uint64
	// Role is what the replica does for the range.
	Role tenurev1.Role
	// LeaderID and LeaderAddress name the leader this replica knows of.
	LeaderID, LeaderAddress string
	// Replicas is the range's replica set, at most wire.MaxReplicas, with
	// each member's recorded incarnation and learner flag.
	Replicas []*tenurev1.Replica
	// Generation is the range's generation the replica hosts it at (the
	// lease service's RangeInfo.generation; 0 = not known: stored before
	// generations, or never told). A fence for a higher one finds this
	// data belonging to a deleted range of the same id.
	Generation uint64
}

// clone returns a deep copy, so no caller shares Replicas with the Range.
func (st State) clone() State {
	c := st
	c.Replicas = make([]*tenurev1.Replica, len(st.Replicas))
	for i, r := range st.Replicas {
		c.Replicas[i] = &tenurev1.Replica{Id: r.GetId(), Address: r.GetAddress(), Incarnation: r.GetIncarnation(), Learner: r.GetLearner()}
	}
	if len(c.Replicas) == 0 {
		c.Replicas = nil
	}
	return c
}

// A Range is one range's log, journal and state in a Store. It is safe for
// concurrent use.
//
// Offsets move through three stages: assigned (an Append or AppendRecords
// took them, next), written (committed to Badger and readable, logEnd) and
// durable (fsynced, durableEnd).
type Range struct {
	s  *Store
	id string
	// quarantined is why the range's data failed its checks at Open
	// (quarantine.go); nil for a range that loaded. Set before the range
	// is visible and never changed: a quarantined range refuses every read
	// and write (usable), and its j is nil.
	quarantined error
	// j is the range's epoch journal, opened (or rebuilt) at load and never
	// replaced while the Store is open.
	// Invariant (with the log): every entry starts at or below logEnd; the
	// last entry starting at or below an offset below logEnd carries the
	// epoch of the record there; every record's epoch has an entry.
	j *journal.Journal

	// cutMu is held exclusively by Truncate and shared by reads of records,
	// so a read never sees records vanish under it.
	cutMu sync.RWMutex
	// stateMu serializes SetState, whose fsync runs outside mu.
	stateMu sync.Mutex
	// startMu serializes AdvanceLogStart and ResetTo.
	startMu sync.Mutex

	mu    sync.Mutex
	state State
	// logStart is the lowest offset the log holds (persisted, b/<id>).
	// Invariant: logStart <= hwm <= logEnd; it never decreases.
	logStart uint64
	// next is the next offset to assign. Invariant: logEnd <= next.
	next uint64
	// tailEpoch is the epoch of the record at next-1 (0 when none).
	// Invariant: lastEpoch <= tailEpoch.
	tailEpoch uint64
	// logEnd is the next offset to be written: records below it are
	// committed and readable. Invariant: durableEnd <= logEnd.
	logEnd uint64
	// lastEpoch is the epoch of the record at logEnd-1 (0 when empty).
	lastEpoch uint64
	// durableEnd: records below it are fsynced.
	durableEnd uint64
	// hwm is the high-water mark: records below it are committed.
	// Invariant: hwm <= logEnd, and hwm never decreases while open.
	hwm uint64
	// truncating is set while Truncate runs; writes are refused and the HWM
	// may not rise above truncTo, so the bound checked at the start holds.
	truncating bool
	truncTo    uint64
	// dropped is set once DropRange quiesced the range (truncating then
	// stays set): waits fail with ErrDropped.
	dropped bool
	// truncGen counts completed truncations; lastTruncTo is the latest one's
	// target. WaitDurable uses them to notice its offset was cut.
	truncGen, lastTruncTo uint64
	// tail holds the most recent writes, newest last, from the moment their
	// offsets were assigned: contiguous, ending at next. A leader answers
	// fetches from it (ReadTail), so followers receive a batch while the
	// leader's own Badger write is still in progress instead of after it.
	// It holds every write not yet published or not yet indexed (Read
	// serves those from here) and, beyond those, at most
	// tailKeepBytes / tailKeepRecords of others. tailRecords and
	// tailBytes count what it holds. tailGen is the truncGen it was built
	// under: a truncation invalidates it (see tailLocked).
	tail                   []*write
	tailRecords, tailBytes int
	tailGen                uint64
	// producers is the dedupe state of idempotent producers
	// (producers.go), derived from the records below next; nil until an
	// idempotent append needs it, and again after a truncation.
	producers *producerTable
	// buildMu is held while the dedupe state is built (producersReady),
	// outside mu.
	buildMu sync.Mutex
	// changed is closed at every change of next, logEnd, durableEnd,
	// hwm, state or history (Changed).
	changed broadcast
	// grown is closed when an index commit stores batches of the range
	// (IndexGrown).
	grown broadcast

	// syncOnDemand: the syncer makes this range's writes durable only once
	// something needs them to be (SetSyncOnDemand, commit.go). Read
	// without mu.
	syncOnDemand atomic.Bool
	// demandEnd is the highest offset something needs durable (a fetch
	// took the records below it, or someone waits for it), and demanded
	// says it is above durableEnd: the syncer reads that without mu.
	// Guarded by mu; demanded is set and cleared under it.
	demandEnd uint64
	demanded  atomic.Bool

	// rc is the range's stored bytes and time marks (marks.go).
	rc reclaimRange
}

func newRange(s *Store, id string, j *journal.Journal) *Range {
	return &Range{s: s, id: id, j: j}
}

// broadcast wakes every goroutine waiting for the next change: each takes
// the channel (wait) and the change closes it (notify), under the mutex of
// the state that changes. A channel is made only when someone waits: on a
// busy replica most changes (a write's publish, its sync, a HWM, an index
// commit) find nobody waiting, and a new channel for each was about six
// allocations a record on each replica at 1,000 ranges (five of them
// Changed's).
type broadcast struct{ ch chan struct{} }

// wait returns the channel the next notify closes.
func (b *broadcast) wait() chan struct{} {
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

// notify closes the channel waiters hold, if any.
func (b *broadcast) notify() {
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}

// notifyLocked wakes Changed waiters. r.mu is held.
func (r *Range) notifyLocked() { r.changed.notify() }

// ID returns the range id.
func (r *Range) ID() string { return r.id }

// State returns a copy of the range's durable state.
func (r *Range) State() State {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state.clone()
}

// SetState writes st and fsyncs it before returning: a fence must be durable
// before the fence reply is sent, or a restarted replica could accept the
// deposed epoch it promised to refuse. A decreasing FencedEpoch is refused
// (ErrStaleEpoch), and so is Epoch > FencedEpoch (ErrInvalid).
//
// Raising FencedEpoch also stops writes under lower epochs (Append refuses
// them from then on) and waits for writes already accepted to be committed
// and synced, so LogEnd, DurableEnd and History read after SetState returns
// are final for every epoch below the fence: what the fence reply reports is
// what the replica holds.
func (r *Range) SetState(st State) error {
	if err := r.usable("SetState"); err != nil {
		return err
	}
	if err := checkState(st); err != nil {
		return fmt.Errorf("%w: SetState(%s): %w", ErrInvalid, r.id, err)
	}
	r.stateMu.Lock()
	defer r.stateMu.Unlock()
	// Read under stateMu: no other SetState can change it before the write.
	if cur := r.State(); st.FencedEpoch < cur.FencedEpoch {
		// A fence is a promise never to act under a lower epoch again;
		// lowering it would let a deposed leader's epoch back in.
		return fmt.Errorf("%w: SetState(%s): fenced epoch %d is below the current fence %d", ErrStaleEpoch, r.id, st.FencedEpoch, cur.FencedEpoch)
	}
	end, err := r.s.begin()
	if err != nil {
		return err
	}
	defer end()
	if err := r.s.writeErr(); err != nil {
		return err
	}
	key := rangeKey(prefixState, r.id)
	val := encodeState(key, st)
	// Assert before writing: what would be read back is what was meant.
	if back, err := decodeState(key, val); err != nil || back.FencedEpoch != st.FencedEpoch || back.Epoch != st.Epoch {
		return fmt.Errorf("logstore: SetState(%s): encoding does not round-trip: %v", r.id, err)
	}
	if err := r.s.putSynced(key, val); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	fenced := st.FencedEpoch > r.state.FencedEpoch
	r.state = st.clone()
	r.notifyLocked()
	if fenced {
		return r.quiesceLocked()
	}
	return nil
}

// quiesceLocked waits until every write accepted for the range is committed
// and synced: next == logEnd == durableEnd. r.mu is held (and released
// while waiting).
func (r *Range) quiesceLocked() error {
	for r.next != r.logEnd || r.durableEnd != r.logEnd {
		if err := r.s.waitErr(); err != nil {
			return err
		}
		r.demandLocked(r.next)
		ch := r.changed.wait()
		r.mu.Unlock()
		<-ch
		r.mu.Lock()
	}
	return nil
}

// LogEnd returns the next offset to be written: records below it are written
// and readable (by Read, and so by followers' fetches), not necessarily
// durable.
func (r *Range) LogEnd() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.logEnd
}

// AssignedEnd returns the next offset to be assigned: records below it were
// accepted by Append or AppendRecords and are being written, or written.
// ReadTail serves them; LogEnd <= AssignedEnd.
func (r *Range) AssignedEnd() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.next
}

// DurableEnd returns the offset below which every record is fsynced.
// DurableEnd <= LogEnd.
func (r *Range) DurableEnd() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.durableEnd
}

// HWM returns the high-water mark.
func (r *Range) HWM() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.hwm
}

// SetHWM raises the high-water mark to h. A lower h is ignored: the HWM
// never decreases, and a late, smaller report is stale, not a rewind. h above
// LogEnd is refused: a replica never claims as committed a record it does not
// hold. (A follower should pass min(leader's HWM, DurableEnd), which keeps
// HWM <= DurableEnd; the store only enforces LogEnd.)
//
// The HWM is persisted without its own fsync or commit: the group commit's
// writer writes it with the next records batch (or alone within
// hwmFlushDelay when none comes), which the following sync (or a SetState's)
// makes durable. That is safe because a persisted HWM can only lag: after a crash
// the replica reports a smaller HWM, which only makes a promotion's committed
// bound smaller, never wrong (the committed records are still on a quorum),
// and readers of a restarted replica see committed records only up to the
// recovered HWM until a new adoption raises it again.
func (r *Range) SetHWM(h uint64) error {
	if err := r.usable("SetHWM"); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if h <= r.hwm {
		return nil
	}
	bound := r.logEnd
	if r.truncating {
		// Truncate checked its target against the HWM before it started;
		// the HWM must not overtake the target while it runs.
		bound = min(bound, r.truncTo)
	}
	if h > bound {
		return fmt.Errorf("%w: SetHWM(%d) on %s: above the log end %d", ErrOutOfRange, h, r.id, bound)
	}
	if err := r.s.writeErr(); err != nil {
		return err
	}
	r.hwm = h
	r.notifyLocked()
	r.s.markDirty(r)
	return nil
}

// LastEpoch returns the epoch of the record at LogEnd-1, 0 when the log is
// empty. It is the last_fetched_epoch a follower sends.
func (r *Range) LastEpoch() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastEpoch
}

// EpochAt returns the epoch of the record at offset, read from the log and
// verified. Offsets at or above LogEnd are ErrOutOfRange.
func (r *Range) EpochAt(offset uint64) (uint64, error) {
	if err := r.usable("EpochAt"); err != nil {
		return 0, err
	}
	r.cutMu.RLock()
	defer r.cutMu.RUnlock()
	r.mu.Lock()
	end, last := r.logEnd, r.lastEpoch
	r.mu.Unlock()
	if offset >= end {
		return 0, fmt.Errorf("%w: EpochAt(%d) on %s: log ends at %d", ErrOutOfRange, offset, r.id, end)
	}
	// Below the log start the record is gone (retention).
	if err := r.belowStart("EpochAt", offset); err != nil {
		return 0, err
	}
	if offset == end-1 {
		return last, nil
	}
	if epoch, ok := r.tailEpochAt(offset); ok {
		return epoch, nil
	}
	done, err := r.s.begin()
	if err != nil {
		return 0, err
	}
	defer done()
	epoch, _, _, err := r.s.readRecord(r.id, offset)
	// An advance of the log start may have removed it since the check.
	return epoch, r.errBelowStartGap("EpochAt", offset, err)
}

// History returns the journal's entries: this replica's epoch history. Empty
// means unknown (or, with an empty log, complete); a poisoned journal reads
// empty, never partial.
func (r *Range) History() []journal.EpochStart {
	if r.j == nil {
		return nil // quarantined: no history is trusted
	}
	return r.j.Entries()
}

// RecordEpoch journals (epoch, start) and fsyncs it before returning. A
// leader calls it at Adopt before its epoch can be observed and before it
// appends the epoch-start record: invariant 5, the epoch's start is durable
// before any record of the epoch exists.
//
// start must be the current log end (including records still being
// written): an epoch starts where the log ends, and any other start would
// misattribute records or leave a gap. An epoch below the log's last epoch or
// the journal's latest is ErrStaleEpoch (the journal would silently ignore
// it, and the caller would then believe it had recorded it).
func (r *Range) RecordEpoch(epoch, start uint64) error {
	if err := r.usable("RecordEpoch"); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.s.writeErr(); err != nil {
		return err
	}
	if r.truncating {
		return fmt.Errorf("%w: RecordEpoch(%d, %d) on %s", ErrBusy, epoch, start, r.id)
	}
	// The leader journals the epoch it was fenced at; a lower one is a
	// deposed promoter's or leader's late command.
	if epoch < r.state.FencedEpoch {
		return fmt.Errorf("%w: RecordEpoch(%d, %d) on %s: fenced at %d", ErrStaleEpoch, epoch, start, r.id, r.state.FencedEpoch)
	}
	if start != r.next {
		return fmt.Errorf("%w: RecordEpoch(%d, %d) on %s: an epoch starts at the log end %d", ErrOutOfRange, epoch, start, r.id, r.next)
	}
	// The log already holds records of tailEpoch; an older epoch cannot
	// start after them.
	if epoch < r.tailEpoch {
		return fmt.Errorf("%w: RecordEpoch(%d, %d) on %s: the log holds epoch %d", ErrStaleEpoch, epoch, start, r.id, r.tailEpoch)
	}
	if latest, ok := r.j.Latest(); ok && epoch < latest.Epoch {
		return fmt.Errorf("%w: RecordEpoch(%d, %d) on %s: the journal holds epoch %d", ErrStaleEpoch, epoch, start, r.id, latest.Epoch)
	}
	// Under mu, so no append can take the offset before the entry is durable.
	if err := r.j.Record(epoch, start); err != nil {
		return r.journalErr(fmt.Errorf("logstore: RecordEpoch(%d, %d) on %s: %w", epoch, start, r.id, err))
	}
	r.notifyLocked()
	return nil
}

// journalErr fails the store when a journal write failed (the journal is
// poisoned: its tail is unknown until reopened) and passes refusals through.
func (r *Range) journalErr(err error) error {
	if isJournalIOFailure(err) {
		return r.s.fail(err)
	}
	return err
}

// Changed returns a channel closed at the next change of AssignedEnd,
// LogEnd, DurableEnd, HWM, state or history, or when the store fails or closes. Take a new
// channel after each wake (broadcast pattern); check the condition after
// taking the channel, so no change is missed between the two.
func (r *Range) Changed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed.wait()
}

// IndexGrown returns a channel closed when an index commit next stores
// batches of the range (take a new one after each wake, as with Changed).
// RetainBytes sees a batch only once indexed, up to indexDelay after its
// append returned, so a size limit passed by the last appends can be
// enforced only then: the leader checks its range's limit on this too.
// Apart from Changed, so that the fetches and reads waiting on Changed
// are not woken by every index commit.
func (r *Range) IndexGrown() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.grown.wait()
}

// WaitDurable waits until DurableEnd >= off, ctx is done, the store fails
// or closes, or a truncation cuts below off (ErrTruncated: the records it
// waited for are gone, and later records at those offsets are not them).
func (r *Range) WaitDurable(ctx context.Context, off uint64) error {
	if err := r.usable("WaitDurable"); err != nil {
		return err
	}
	r.mu.Lock()
	gen := r.truncGen
	for {
		if r.dropped {
			r.mu.Unlock()
			return fmt.Errorf("%w: WaitDurable(%d) on %s", ErrDropped, off, r.id)
		}
		if r.truncGen != gen && (r.truncGen-gen > 1 || r.lastTruncTo < off) {
			r.mu.Unlock()
			return fmt.Errorf("%w: WaitDurable(%d) on %s: the log was cut to %d", ErrTruncated, off, r.id, r.lastTruncTo)
		}
		if r.durableEnd >= off {
			r.mu.Unlock()
			return nil
		}
		if err := r.s.waitErr(); err != nil {
			r.mu.Unlock()
			return err
		}
		r.demandLocked(off)
		ch := r.changed.wait()
		r.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
		r.mu.Lock()
	}
}

// How much of the published log the in-memory tail keeps per range besides
// the writes still in flight (which the queue bounds store-wide,
// maxQueueBytes): a few batches, so that a follower whose fetch arrives
// while the leader's next writes commit still reads memory. With 256
// records in flight a follower fetches ~100 records behind the log end;
// at 64 records / 64 KiB those fetches read Badger, and keeping 256 made
// the 256-in-flight benchmark ~8% faster (bench, 2 interleaved rounds).
// It is per range, and a replica may host a thousand ranges, so it stays
// small (a thousand busy ranges keep at most ~256 MB, values the log
// shares rather than copies): a follower further behind reads Badger, as
// it always could.
const (
	tailKeepBytes   = 256 << 10
	tailKeepRecords = 256
)

// addTailLocked appends w, just queued, to the in-memory tail. r.mu is held.
func (r *Range) addTailLocked(w *write) {
	tail := r.tailLocked()
	if n := len(tail); n > 0 && tail[n-1].end != w.base {
		// Not contiguous with what is held: start over rather than serve a
		// gap. (Offsets are assigned from next under r.mu, so this only
		// happens if that ever changed.)
		clear(tail)
		tail, r.tailRecords, r.tailBytes = tail[:0], 0, 0
	}
	r.tail = append(tail, w)
	r.tailRecords += len(w.vals)
	r.tailBytes += w.bytes
}

// trimTailLocked drops published and indexed writes from the front of the
// tail while it holds more than tailKeepBytes or tailKeepRecords. r.mu is
// held.
func (r *Range) trimTailLocked() {
	tail := r.tailLocked()
	i := 0
	// Only writes Badger holds may go: Read serves everything from the
	// tail's first offset on from memory, and what lies below it from
	// Badger.
	for i < len(tail) && tail[i].end <= r.logEnd && tail[i].indexed &&
		(r.tailBytes-tail[i].bytes >= tailKeepBytes || r.tailRecords-len(tail[i].vals) >= tailKeepRecords) {
		r.tailRecords -= len(tail[i].vals)
		r.tailBytes -= tail[i].bytes
		tail[i] = nil
		i++
	}
	r.tail = tail[i:]
}

// tailLocked returns the tail, emptied first if a truncation completed since
// it was built: its records may be the ones cut. r.mu is held.
func (r *Range) tailLocked() []*write {
	if r.tailGen != r.truncGen {
		clear(r.tail)
		r.tail, r.tailRecords, r.tailBytes, r.tailGen = r.tail[:0], 0, 0, r.truncGen
	}
	return r.tail
}

// ReadTail is Read for a leader answering fetches: it returns the records
// in [from, min(AssignedEnd, from+maxRecords)), stopping early once their
// values would exceed maxBytes but always at least one record when from <
// AssignedEnd. Records still being written come from memory, exactly as
// Append sealed them (epoch, flags, value), so a follower can write them
// while the leader's own Badger write runs. Where from is below what the
// in-memory tail holds it reads Badger (Read), up to LogEnd only.
//
// Records above LogEnd are not durable nor readable here yet: a caller that
// counts or serves records as committed must bound by LogEnd and
// DurableEnd. If the store fails before writing them they are never
// written here, exactly as if the process had crashed after sending them.
func (r *Range) ReadTail(from uint64, maxRecords int, maxBytes int) ([]*tenurev1.Record, error) {
	out, err := r.readTail(from, maxRecords, maxBytes)
	// A follower now holds copies of records that are not durable here
	// yet, and a commit may pair them with this replica's own: sync them
	// now (sync on demand, commit.go).
	if n := len(out); n > 0 && r.syncOnDemand.Load() {
		r.mu.Lock()
		r.demandLocked(out[n-1].GetOffset() + 1)
		r.mu.Unlock()
	}
	return out, err
}

func (r *Range) readTail(from uint64, maxRecords int, maxBytes int) ([]*tenurev1.Record, error) {
	if err := r.usable("ReadTail"); err != nil {
		return nil, err
	}
	if maxRecords <= 0 || maxRecords > wire.MaxReadRecords {
		maxRecords = wire.MaxReadRecords
	}
	if maxBytes <= 0 {
		maxBytes = wire.MaxBatchBytes
	}
	// Below the log start: gone, on purpose (retention).
	if err := r.belowStart("ReadTail", from); err != nil {
		return nil, err
	}
	// Shared with Truncate, as in Read: nothing is cut while we copy.
	r.cutMu.RLock()
	stop := from + uint64(maxRecords)
	base, next, writes := r.tailFrom(from, stop)
	r.cutMu.RUnlock()
	if from < next && from < base {
		// Below what the tail holds: Badger has it.
		return r.Read(from, maxRecords, maxBytes)
	}
	if from > next {
		return nil, fmt.Errorf("%w: ReadTail(%d) on %s: log ends at %d", ErrOutOfRange, from, r.id, next)
	}
	if err := r.s.writeErrAfterClose(); err != nil {
		// Failed: what is in memory may never be written.
		return nil, err
	}
	out := make([]*tenurev1.Record, 0, min(uint64(maxRecords), next-from))
	out, _, _ = appendTailRecords(out, 0, writes, from, stop, maxBytes)
	return out, nil
}

// appendTailRecords appends to out the records of writes (tail writes,
// contiguous) in [from, stop), as Read would return them, while out holds
// at most maxBytes of values (but at least one record). total is the value
// bytes out already holds; full says it stopped at maxBytes.
func appendTailRecords(out []*tenurev1.Record, total int, writes []*write, from, stop uint64, maxBytes int) (_ []*tenurev1.Record, _ int, full bool) {
	for _, w := range writes {
		for off := max(from, w.base); off < min(stop, w.end); off++ {
			stored := w.vals[off-w.base]
			value := stored[recordHeaderBytes:]
			prod, hasProd := storedProducer(stored)
			if hasProd {
				value = value[producerHeaderBytes:]
			}
			if len(out) > 0 && total+len(value) > maxBytes {
				return out, total, true
			}
			rec := &tenurev1.Record{
				Offset:     off,
				Epoch:      binary.BigEndian.Uint64(stored[0:8]),
				EpochStart: stored[8]&flagEpochStart != 0,
			}
			if hasProd {
				// Shared, as the value is.
				rec.ProducerId = stored[recordHeaderBytes : recordHeaderBytes+16]
				rec.ProducerEpoch, rec.ProducerSequence = prod.Epoch, prod.Seq
			}
			if len(value) > 0 {
				// Shared, not copied: a sealed write is never modified.
				rec.Value = value
			}
			total += len(value)
			out = append(out, rec)
		}
	}
	return out, total, false
}

// tailEpochAt returns the epoch of the record at offset if the tail holds
// it.
func (r *Range) tailEpochAt(offset uint64) (uint64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	tail := r.tailLocked()
	if len(tail) == 0 || offset < tail[0].base || offset >= r.next {
		return 0, false
	}
	w := tail[sort.Search(len(tail), func(i int) bool { return tail[i].end > offset })]
	return binary.BigEndian.Uint64(w.vals[offset-w.base][0:8]), true
}

// tailFrom returns, under r.mu, next, the tail's first offset as base
// (next when the tail is empty) and the tail's writes holding offsets in
// [max(from, base), stop). Every record below base is in Badger (only
// indexed writes leave the tail); the records from base on may not be.
func (r *Range) tailFrom(from, stop uint64) (base, next uint64, writes []*write) {
	r.mu.Lock()
	defer r.mu.Unlock()
	next = r.next
	tail := r.tailLocked()
	if len(tail) == 0 {
		return next, next, nil
	}
	base = tail[0].base
	i := sort.Search(len(tail), func(i int) bool { return tail[i].end > max(from, base) })
	for ; i < len(tail) && tail[i].base < stop; i++ {
		writes = append(writes, tail[i])
	}
	return base, next, writes
}
