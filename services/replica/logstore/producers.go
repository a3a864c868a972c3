package logstore

import (
	"errors"
	"fmt"
	"math"

	"github.com/dgraph-io/badger/v4"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// Idempotent producers (docs/idempotence.md).
//
// A record an idempotent producer appended carries (producer id, producer
// epoch, sequence) in its stored header (format.go), and followers store the
// same fields from the fetched records. A range's dedupe state is a pure
// function of the records in its window, the last ProducerWindow offsets
// below the log end: whatever holds those records (a follower promoted, a
// replica restarted, a log cut back by a truncation) derives the same
// decisions from them, and there is no side file that could disagree with
// the log.
//
// The table is built lazily (producersReady) by scanning the window's record
// headers (values are not copied), then
// kept up to date by every record queued (leader and follower paths alike),
// and dropped by a truncation. The window reaches no lower than the log
// start: the records retention removed are not in it. Entries for producers
// that have left the window are ignored, and pruned now and then: they
// cannot change a decision.

// These bound the dedupe state per range. ProducerWindow also bounds the
// rebuild: at most that many records are read to derive the table.
const (
	// ProducerWindow is how many offsets below the log end the dedupe state
	// looks back. A producer with no record in the window is unknown: its
	// next append must start a producer epoch (sequence 0).
	ProducerWindow = 1 << 20
	// ProducerRuns is how many runs (contiguous stretches of offsets with
	// contiguous sequences, one or more appends each) are kept per
	// producer: a retry of anything older is ErrProducerWindow.
	ProducerRuns = 8
)

// ProducerID names an idempotent producer: 16 random bytes. The all-zero id
// is never valid (it means "no producer").
type ProducerID [16]byte

// Producer is the producer fields of one stored record.
type Producer struct {
	ID    ProducerID
	Epoch uint32
	Seq   uint64
}

// ProducerAppend is an idempotent append's producer fields: its records
// carry sequences FirstSeq, FirstSeq+1, ...
type ProducerAppend struct {
	ID       ProducerID
	Epoch    uint32
	FirstSeq uint64
}

var (
	// ErrSequence: an append's sequence is not the next one its producer
	// may write (a gap, or a retry that overlaps what was written
	// differently). Nothing was written; the message names the expected
	// sequence.
	ErrSequence = errors.New("logstore: producer sequence out of order")
	// ErrProducerFenced: the range holds a newer epoch of the producer.
	ErrProducerFenced = errors.New("logstore: producer epoch fenced")
	// ErrProducerWindow: the sequence is older than the dedupe window
	// holds, so whether it was written cannot be told.
	ErrProducerWindow = errors.New("logstore: producer sequence outside the dedupe window")
)

// producerFromRecord returns rec's producer fields, or zero and false.
func producerFromRecord(rec *tenurev1.Record) (Producer, bool) {
	id := rec.GetProducerId()
	if len(id) != len(ProducerID{}) {
		return Producer{}, false
	}
	var p Producer
	copy(p.ID[:], id)
	if p.ID == (ProducerID{}) {
		return Producer{}, false
	}
	p.Epoch, p.Seq = rec.GetProducerEpoch(), rec.GetProducerSequence()
	return p, true
}

// seqRun is a stretch of one producer's records: offsets [offset, offset+n)
// carry sequences [seq, seq+n).
type seqRun struct{ seq, offset, n uint64 }

// producerState is what the table holds for one producer.
type producerState struct {
	epoch uint32
	// last is the offset of its newest record.
	last uint64
	// runs are its newest runs under epoch, oldest first.
	// Invariant: 1 <= len(runs) <= ProducerRuns.
	runs []seqRun
}

// producerTable is a range's dedupe state. Guarded by Range.mu.
type producerTable struct {
	m map[ProducerID]*producerState
	// pruneAt is the offset at which stale entries are next dropped.
	pruneAt uint64
	// floor is the range's log start as last advanced: records below it
	// were removed by retention, so the window holds nothing below it,
	// as a table built from the log (scanProducers starts at the log
	// start) finds. Without it the table kept every producer of the last
	// ProducerWindow offsets however little retention kept (a soak's
	// ranges keeping a few MiB held the producers of a million offsets),
	// and decided their retries unlike the table a restart rebuilds.
	floor uint64
	// floorPruned is the floor at the last prune by the floor.
	floorPruned uint64
}

func newProducerTable() *producerTable {
	return &producerTable{m: map[ProducerID]*producerState{}}
}

// windowStart is the lowest offset the window holds at log end end.
func windowStart(end uint64) uint64 { return end - min(end, ProducerWindow) }

// lo is the lowest offset the window holds at log end end, the log start
// included.
func (t *producerTable) lo(end uint64) uint64 { return max(windowStart(end), t.floor) }

// advanceFloor records that the log now starts at start, and drops the
// producers whose newest record lies below it. Each producer's newest
// record has its own offset, so at most start-floorPruned entries can go:
// the pass runs once that is a quarter of the table, which keeps its cost
// per offset removed constant.
func (t *producerTable) advanceFloor(start uint64) {
	if start <= t.floor {
		return
	}
	t.floor = start
	if start-t.floorPruned < uint64(len(t.m)/4) {
		return
	}
	for id, st := range t.m {
		if st.last < start {
			delete(t.m, id)
		}
	}
	t.floorPruned = start
}

// observe takes the record at off, appended by p, into the table. Records
// are observed in offset order.
func (t *producerTable) observe(off uint64, p Producer) { t.observeRun(off, p, 1) }

// observeRun is n observes: the records at off, off+1, ... appended by p
// with sequences p.Seq, p.Seq+1, ... (one append's records: one map lookup
// for the batch, under the range lock).
func (t *producerTable) observeRun(off uint64, p Producer, n uint64) {
	st := t.m[p.ID]
	switch {
	case st == nil:
		st = &producerState{}
		t.m[p.ID] = st
		fallthrough
	case st.last < t.lo(off+1), st.epoch != p.Epoch:
		// Unknown (out of the window) or another epoch: the runs before
		// say nothing about this one. (A leader never writes an epoch
		// below the one its window holds; after the window forgot it,
		// what the window holds is all there is.)
		st.epoch, st.runs = p.Epoch, st.runs[:0]
	}
	st.last = off + n - 1
	if k := len(st.runs); k > 0 {
		if r := &st.runs[k-1]; r.offset+r.n == off && r.seq+r.n == p.Seq {
			r.n += n
			return
		}
	}
	if len(st.runs) == ProducerRuns {
		copy(st.runs, st.runs[1:])
		st.runs = st.runs[:ProducerRuns-1]
	}
	st.runs = append(st.runs, seqRun{seq: p.Seq, offset: off, n: n})
	if st.last >= t.pruneAt {
		t.prune(st.last + 1)
	}
}

// prune drops the producers that have left the window at log end end. It
// changes no decision (check ignores them); it bounds memory.
func (t *producerTable) prune(end uint64) {
	lo := t.lo(end)
	for id, st := range t.m {
		if st.last < lo {
			delete(t.m, id)
		}
	}
	t.pruneAt = end + ProducerWindow/4
}

// check decides an idempotent append of n records at log end end: write it
// (dup false, nil), answer it as the retry of the append at base (dup
// true), or refuse it. A pure function of the records in the window.
func (t *producerTable) check(a ProducerAppend, n int, end uint64) (base uint64, dup bool, err error) {
	if a.FirstSeq > math.MaxUint64-uint64(n) {
		return 0, false, fmt.Errorf("%w: producer %x: sequences from %d for %d records overflow", ErrSequence, a.ID, a.FirstSeq, n)
	}
	lo := t.lo(end)
	st := t.m[a.ID]
	if st == nil || st.last < lo {
		if a.FirstSeq == 0 {
			return 0, false, nil
		}
		return 0, false, fmt.Errorf("%w: producer %x has no record in the last %d offsets above the log start (from %d): sequence %d cannot be checked; start a new producer epoch at sequence 0", ErrProducerWindow, a.ID, ProducerWindow, lo, a.FirstSeq)
	}
	switch {
	case a.Epoch < st.epoch:
		// A newer instance of the producer has written here.
		return 0, false, fmt.Errorf("%w: producer %x epoch %d: the range holds its epoch %d", ErrProducerFenced, a.ID, a.Epoch, st.epoch)
	case a.Epoch > st.epoch:
		if a.FirstSeq != 0 {
			return 0, false, fmt.Errorf("%w: producer %x epoch %d is new here: expected sequence 0, got %d", ErrSequence, a.ID, a.Epoch, a.FirstSeq)
		}
		return 0, false, nil
	}
	last := st.runs[len(st.runs)-1]
	next := last.seq + last.n
	switch {
	case a.FirstSeq == next:
		return 0, false, nil
	case a.FirstSeq > next:
		return 0, false, fmt.Errorf("%w: producer %x epoch %d: expected sequence %d, got %d (a gap)", ErrSequence, a.ID, a.Epoch, next, a.FirstSeq)
	}
	// A retry: find the run that holds it, as far as the window reaches.
	for i := len(st.runs) - 1; i >= 0; i-- {
		r := st.runs[i]
		skip := max(r.offset, lo) - r.offset
		if skip >= r.n {
			break // this run and the older ones are below the window
		}
		seq, cnt := r.seq+skip, r.n-skip
		if a.FirstSeq < seq || a.FirstSeq >= seq+cnt {
			continue
		}
		if a.FirstSeq+uint64(n) > seq+cnt {
			return 0, false, fmt.Errorf("%w: producer %x epoch %d: sequences [%d, %d) overlap the end of a run written as [%d, %d); expected sequence %d", ErrSequence, a.ID, a.Epoch, a.FirstSeq, a.FirstSeq+uint64(n), seq, seq+cnt, next)
		}
		return r.offset + skip + (a.FirstSeq - seq), true, nil
	}
	return 0, false, fmt.Errorf("%w: producer %x epoch %d: sequence %d is older than the dedupe window holds (the last %d runs within %d offsets); expected sequence %d", ErrProducerWindow, a.ID, a.Epoch, a.FirstSeq, ProducerRuns, ProducerWindow, next)
}

// maxProducerBuildPasses bounds producersReady's catch-up passes: each reads
// what was written during the one before, so under a steady load they
// shrink; past the bound the append is refused with ErrBusy.
const maxProducerBuildPasses = 8

// producersReady builds the dedupe table if the range has none, from the
// records in the window. It reads outside r.mu (a window can be large), then
// catches up with what was queued meanwhile from the in-memory tail, and
// installs the table under r.mu, from which point every queued record keeps
// it current.
func (r *Range) producersReady() error {
	r.mu.Lock()
	ready := r.producers != nil
	r.mu.Unlock()
	if ready {
		return nil
	}
	// One build at a time: the appends that arrive meanwhile (a failover's
	// retries, all at once) wait for it rather than each reading the window.
	r.buildMu.Lock()
	defer r.buildMu.Unlock()
	r.mu.Lock()
	ready, gen := r.producers != nil, r.truncGen
	r.mu.Unlock()
	if ready {
		return nil
	}
	t := newProducerTable()
	end := r.LogEnd()
	from := windowStart(end)
	for range maxProducerBuildPasses {
		if err := r.scanProducers(from, end, t.observe); err != nil {
			return fmt.Errorf("logstore: dedupe state of %s from %d: %w", r.id, from, err)
		}
		if done, err := r.installProducers(t, gen, end); done || err != nil {
			return err
		}
		// The tail no longer holds what was queued after end: read it.
		from, end = end, r.LogEnd()
	}
	return fmt.Errorf("%w: %s: the dedupe state could not catch up with appends; retry", ErrBusy, r.id)
}

// scanProducers calls fn, in offset order, with the producer of each record
// in [from, stop) that has one (stop at most LogEnd). It reads as Read does,
// Badger below the in-memory tail and the tail from there, but copies no
// value.
func (r *Range) scanProducers(from, stop uint64, fn func(off uint64, p Producer)) error {
	r.cutMu.RLock()
	defer r.cutMu.RUnlock()
	// Records below the log start are gone (retention): the window holds
	// what the log still holds. A producer whose last append lies below
	// it starts over, as one older than the window does.
	from = max(from, r.LogStart())
	if from >= stop {
		return nil
	}
	done, err := r.s.begin()
	if err != nil {
		return err
	}
	defer done()
	base, _, writes := r.tailFrom(from, stop)
	if from < base {
		indexed := min(stop, base)
		err := r.s.db.View(func(txn *badger.Txn) error {
			next, gap, err := r.s.scanLog(txn, r.id, from, func(sr storedRecord) (bool, error) {
				if sr.offset >= indexed {
					return false, nil
				}
				if sr.flags&flagProducer != 0 {
					fn(sr.offset, sr.prod)
				}
				return true, nil
			})
			if err != nil {
				return err
			}
			if next < indexed {
				return fmt.Errorf("%w: range %s: record %d is not readable (%s)", ErrCorrupt, r.id, next, gap)
			}
			return nil
		})
		if err != nil {
			if below := r.errBelowStartGap("scanProducers", from, err); below != err {
				// The log start moved above from while scanning.
				return fmt.Errorf("%w: %s: the log start moved while building the dedupe state; retry: %w", ErrBusy, r.id, below)
			}
			return err
		}
	}
	for _, w := range writes {
		for off := max(from, w.base); off < min(stop, w.end); off++ {
			if p, ok := storedProducer(w.vals[off-w.base]); ok {
				fn(off, p)
			}
		}
	}
	return nil
}

// installProducers installs t, built from the records below end, once the
// records from end to the assigned end are taken from the in-memory tail.
// It reports false if the tail no longer holds them all.
func (r *Range) installProducers(t *producerTable, gen, end uint64) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.producers != nil {
		return true, nil // built meanwhile by another append
	}
	if r.truncGen != gen {
		// Records the table took may have been cut.
		return false, fmt.Errorf("%w: %s: truncated while building the dedupe state; retry", ErrBusy, r.id)
	}
	tail := r.tailLocked()
	if end < r.next && (len(tail) == 0 || tail[0].base > end) {
		return false, nil
	}
	for _, w := range tail {
		for off := max(end, w.base); off < w.end; off++ {
			if p, ok := storedProducer(w.vals[off-w.base]); ok {
				t.observe(off, p)
			}
		}
	}
	// The log start may have advanced during the build.
	t.advanceFloor(r.logStart)
	r.producers = t
	return true, nil
}

// storedProducer returns the producer fields of a sealed record.
func storedProducer(stored []byte) (Producer, bool) {
	if stored[8]&flagProducer == 0 {
		return Producer{}, false
	}
	return decodeProducer(stored[recordHeaderBytes:]), true
}
