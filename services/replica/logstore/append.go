package logstore

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"slices"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// Append writes values at the log end under epoch (the leader path) and
// returns the first offset once the records are written: readable by Read,
// not yet fsynced. ReadTail (followers' fetches) serves them earlier, from
// the moment their offsets are assigned. They are durable once DurableEnd
// passes them (WaitDurable). Concurrent Appends share commits and
// fsyncs; each gets a contiguous run of offsets, in call order.
//
// epochStart marks the epoch-start record a new leader writes first; values
// must then be exactly one empty value. The first record of an epoch on this
// log must be its epoch-start record, written at the start the journal holds
// for the epoch, and no other record may be one.
//
// Refused: an epoch below the fenced epoch or the log's last epoch
// (ErrStaleEpoch); an epoch that is not the journal's latest (ErrUnjournaled,
// or ErrStaleEpoch when a newer one is journaled: the leader journals first);
// a malformed batch (ErrInvalid); during a truncation (ErrBusy); while the
// disk is full (ErrDiskFull, except an epoch-start record); after a
// failure or close.
func (r *Range) Append(epoch uint64, epochStart bool, values [][]byte) (base uint64, err error) {
	if err := r.usable("Append"); err != nil {
		return 0, err
	}
	if epoch == 0 {
		return 0, fmt.Errorf("%w: Append on %s: epoch 0 never writes", ErrInvalid, r.id)
	}
	if err := wire.ValidateBatch(values); err != nil {
		return 0, fmt.Errorf("%w: Append on %s: %w", ErrInvalid, r.id, err)
	}
	var flags byte
	if epochStart {
		if len(values) != 1 || len(values[0]) != 0 {
			return 0, fmt.Errorf("%w: Append on %s: an epoch-start record is one empty value", ErrInvalid, r.id)
		}
		flags = flagEpochStart
	}
	p := prepare(len(values), func(i int) []byte { return values[i] }, nil)
	// A full disk refuses new records before they get offsets (disk.go),
	// except a new leader's epoch-start record: one empty record, written
	// out of the reserve, without which a fenced range could not lead.
	if !epochStart {
		if err := r.s.diskRefusal("Append", r.id, p.bytes); err != nil {
			return 0, err
		}
	}
	if err := r.s.reserve(len(values), p.bytes); err != nil {
		return 0, err
	}
	w, _, err := r.appendLocked(epoch, epochStart, flags, p, nil)
	if err != nil {
		r.s.release(len(values), p.bytes)
		return 0, err
	}
	// Not committed inline (writeInline), unlike a follower's records: the
	// appends' fetchers, woken by the enqueue, would then wait for a core
	// behind this goroutine's Badger write and fsync, and the followers'
	// copies, not the leader's, are what an acknowledgement waits for.
	<-w.done
	return w.base, w.err
}

// AppendProduced is Append for an idempotent producer (docs/idempotence.md):
// the records carry pa's producer id and epoch and the sequences
// pa.FirstSeq, pa.FirstSeq+1, ... It writes them only if the range's dedupe
// state says they are the producer's next ones. If they were written before
// (a retry), it writes nothing and returns the first one's offset then, with
// dup set: that write may still be in progress, and durable later. It
// refuses a gap or an overlap (ErrSequence), an epoch older than the
// range's latest for the producer (ErrProducerFenced), and a retry older
// than the window (ErrProducerWindow), writing nothing; and whatever Append
// refuses.
func (r *Range) AppendProduced(epoch uint64, pa ProducerAppend, values [][]byte) (base uint64, dup bool, err error) {
	if err := r.usable("AppendProduced"); err != nil {
		return 0, false, err
	}
	if epoch == 0 {
		return 0, false, fmt.Errorf("%w: AppendProduced on %s: epoch 0 never writes", ErrInvalid, r.id)
	}
	if pa.ID == (ProducerID{}) {
		return 0, false, fmt.Errorf("%w: AppendProduced on %s: the all-zero producer id", ErrInvalid, r.id)
	}
	if err := wire.ValidateBatch(values); err != nil {
		return 0, false, fmt.Errorf("%w: AppendProduced on %s: %w", ErrInvalid, r.id, err)
	}
	if err := r.producersReady(); err != nil {
		return 0, false, err
	}
	p := prepare(len(values), func(i int) []byte { return values[i] }, func(i int) Producer {
		return Producer{ID: pa.ID, Epoch: pa.Epoch, Seq: pa.FirstSeq + uint64(i)}
	})
	// Before the dedupe state is asked: a refused batch is retried whole.
	if err := r.s.diskRefusal("AppendProduced", r.id, p.bytes); err != nil {
		return 0, false, err
	}
	if err := r.s.reserve(len(values), p.bytes); err != nil {
		return 0, false, err
	}
	w, dupBase, err := r.appendLocked(epoch, false, 0, p, &pa)
	if err != nil || w == nil {
		r.s.release(len(values), p.bytes)
		return dupBase, err == nil, err
	}
	<-w.done
	return w.base, false, w.err
}

// appendLocked checks and queues a leader's write. With pa set, the range's
// dedupe state decides first, in the same hold of r.mu as the offsets are
// assigned, so two appends of one producer cannot both pass: it returns no
// write and the original base for a retry.
func (r *Range) appendLocked(epoch uint64, epochStart bool, flags byte, p prepared, pa *ProducerAppend) (_ *write, dupBase uint64, _ error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.s.writeErr(); err != nil {
		return nil, 0, err
	}
	if r.truncating {
		return nil, 0, fmt.Errorf("%w: Append(%d) on %s", ErrBusy, epoch, r.id)
	}
	// A replica fenced at E never again accepts a record from an epoch below
	// E (invariant 4): a deposed leader's appends stop at the fence, before
	// the new epoch reaches its journal or log.
	if epoch < r.state.FencedEpoch {
		return nil, 0, fmt.Errorf("%w: Append(%d) on %s: fenced at %d", ErrStaleEpoch, epoch, r.id, r.state.FencedEpoch)
	}
	// A deposed leader's late append: the log already holds records of a
	// newer epoch, and an older epoch after them would run the log backwards.
	if epoch < r.tailEpoch {
		return nil, 0, fmt.Errorf("%w: Append(%d) on %s: the log holds epoch %d", ErrStaleEpoch, epoch, r.id, r.tailEpoch)
	}
	// The leader journals its epoch before writing under it (invariant 5), so
	// the journal's latest epoch is the only one a leader may append under. A
	// newer one journaled means this leader was superseded.
	latest, ok := r.j.Latest()
	if !ok || latest.Epoch != epoch {
		if ok && epoch < latest.Epoch {
			return nil, 0, fmt.Errorf("%w: Append(%d) on %s: the journal holds epoch %d", ErrStaleEpoch, epoch, r.id, latest.Epoch)
		}
		return nil, 0, fmt.Errorf("%w: Append(%d) on %s: the journal's latest entry is %+v; RecordEpoch first", ErrUnjournaled, epoch, r.id, latest)
	}
	// The first record of an epoch here is its epoch-start record, and only
	// it: earlier epochs' records commit only through it (Raft 5.4.2), and a
	// second one would claim the epoch started twice.
	if newEpoch := epoch > r.tailEpoch; epochStart != newEpoch {
		if epochStart {
			return nil, 0, fmt.Errorf("%w: Append(%d, epochStart) on %s: epoch %d already has records here", ErrInvalid, epoch, r.id, epoch)
		}
		return nil, 0, fmt.Errorf("%w: Append(%d) on %s: the first record of epoch %d must be its epoch-start record", ErrInvalid, epoch, r.id, epoch)
	}
	// The journal says where the epoch starts; the start record must sit
	// exactly there, or the history would misattribute records.
	if epochStart && latest.Start != r.next {
		return nil, 0, fmt.Errorf("%w: Append(%d, epochStart) on %s: epoch %d is journaled at %d, the log ends at %d", ErrOutOfRange, epoch, r.id, epoch, latest.Start, r.next)
	}
	if pa != nil {
		if r.producers == nil {
			// A truncation dropped the table after producersReady.
			return nil, 0, fmt.Errorf("%w: Append(%d) on %s: truncated while appending; retry", ErrBusy, epoch, r.id)
		}
		base, dup, err := r.producers.check(*pa, len(p.vals), r.next)
		if err != nil || dup {
			return nil, base, err
		}
	}
	w, err := r.enqueueLocked(p, func(int) (uint64, byte) { return epoch, flags }, true)
	return w, 0, err
}

// AppendRecords writes records fetched from the leader (the follower path)
// and returns once they are written. When no commit was running it runs the
// group commit on the caller's goroutine (writeInline), sync included, and
// they are durable on return too; otherwise they are durable later, as with
// Append (WaitDurable).
//
// recs[0].Offset must be the log end (including records still being
// written), offsets contiguous, epochs non-decreasing and at least the log's
// last epoch. A record marked epoch-start must begin its epoch. When a
// record's epoch is newer than the journal's latest, (epoch, offset) is
// journaled and fsynced before that record is written: the follower's
// history mirrors the leader's, from the record's own epoch and offset,
// rather than claiming an epoch started wherever the follower happened to be.
func (r *Range) AppendRecords(recs []*tenurev1.Record) error {
	wait, err := r.QueueRecords(recs)
	if err != nil {
		return err
	}
	r.s.writeInline(true)
	return wait()
}

// QueueRecords is AppendRecords without its commit: it checks, journals
// and queues the records exactly as AppendRecords does, and returns what
// waits until they are written (AppendRecords' return). Queuing does not
// wake the writer: the caller then calls CommitQueued. A caller
// applying fetched records for several ranges at once (a fetch session's
// answers) queues each range's, then commits once, so that one group
// commit and one WAL sync write them all, not one or two per range. On an
// error nothing was queued.
func (r *Range) QueueRecords(recs []*tenurev1.Record) (wait func() error, err error) {
	if err := r.usable("AppendRecords"); err != nil {
		return nil, err
	}
	if err := validateRecords(recs); err != nil {
		return nil, fmt.Errorf("%w: AppendRecords on %s: %w", ErrInvalid, r.id, err)
	}
	// A follower stores the producer fields it was sent: its dedupe state,
	// should it lead, derives from them.
	var prodAt func(int) Producer
	if slices.ContainsFunc(recs, func(rec *tenurev1.Record) bool { return len(rec.GetProducerId()) != 0 }) {
		prodAt = func(i int) Producer { p, _ := producerFromRecord(recs[i]); return p }
	}
	p := prepare(len(recs), func(i int) []byte { return recs[i].GetValue() }, prodAt)
	// Before anything is journaled or assigned: a full follower fetches
	// the same records again later.
	if err := r.s.diskRefusal("AppendRecords", r.id, p.bytes); err != nil {
		return nil, err
	}
	if err := r.s.reserve(len(recs), p.bytes); err != nil {
		return nil, err
	}
	w, err := r.appendRecordsLocked(recs, p)
	if err != nil {
		r.s.release(len(recs), p.bytes)
		return nil, err
	}
	return func() error {
		<-w.done
		return w.err
	}, nil
}

// CommitQueued runs the group commit of everything queued on r's store,
// every range's, on the caller's goroutine, as AppendRecords does for its
// own records (writeInline), but hands the sync to the syncer: the records
// are written on return, and durable once WaitDurable says so. When a
// commit is already running it leaves the queue to the writer, which takes
// it next. With nothing queued it returns at once.
func (r *Range) CommitQueued() { r.s.writeInline(false) }

// validateRecords checks a fetched batch on its own: bounds, no nil record,
// no epoch 0, contiguous offsets, non-decreasing epochs, and epoch-start
// records that are empty and begin their epoch.
func validateRecords(recs []*tenurev1.Record) error {
	if len(recs) == 0 || len(recs) > wire.MaxBatchRecords {
		return fmt.Errorf("%d records, want 1 to %d", len(recs), wire.MaxBatchRecords)
	}
	total := 0
	for i, rec := range recs {
		if rec == nil {
			return fmt.Errorf("record %d is missing", i)
		}
		flags := epochStartFlag(rec)
		if id := rec.GetProducerId(); len(id) != 0 {
			if _, ok := producerFromRecord(rec); !ok {
				return fmt.Errorf("record %d (offset %d): producer id of %d bytes, want %d and not all zero", i, rec.GetOffset(), len(id), len(ProducerID{}))
			}
			flags |= flagProducer
		}
		if err := checkRecordFields(rec.GetEpoch(), flags, len(rec.GetValue())); err != nil {
			return fmt.Errorf("record %d (offset %d): %w", i, rec.GetOffset(), err)
		}
		total += len(rec.GetValue())
		if i == 0 {
			continue
		}
		prev := recs[i-1]
		if prev.GetOffset() == math.MaxUint64 || rec.GetOffset() != prev.GetOffset()+1 {
			return fmt.Errorf("record %d has offset %d after offset %d", i, rec.GetOffset(), prev.GetOffset())
		}
		// Epochs only grow along a log: each stretch was written by a later
		// leadership than the one before it.
		if rec.GetEpoch() < prev.GetEpoch() {
			return fmt.Errorf("record %d (offset %d) has epoch %d after epoch %d", i, rec.GetOffset(), rec.GetEpoch(), prev.GetEpoch())
		}
		if rec.GetEpochStart() && rec.GetEpoch() == prev.GetEpoch() {
			return fmt.Errorf("epoch-start record %d (offset %d) does not begin epoch %d", i, rec.GetOffset(), rec.GetEpoch())
		}
	}
	if total > wire.MaxBatchBytes {
		return fmt.Errorf("%d value bytes, at most %d", total, wire.MaxBatchBytes)
	}
	return nil
}

func epochStartFlag(rec *tenurev1.Record) byte {
	if rec.GetEpochStart() {
		return flagEpochStart
	}
	return 0
}

func (r *Range) appendRecordsLocked(recs []*tenurev1.Record, p prepared) (*write, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.s.writeErr(); err != nil {
		return nil, err
	}
	if r.truncating {
		return nil, fmt.Errorf("%w: AppendRecords on %s", ErrBusy, r.id)
	}
	first := recs[0]
	if first.GetOffset() != r.next {
		return nil, fmt.Errorf("%w: AppendRecords on %s: records start at %d, the log ends at %d", ErrOutOfRange, r.id, first.GetOffset(), r.next)
	}
	// The fetch check (last_fetched_epoch against the leader's history)
	// guarantees the leader's record here is at least our last epoch; an
	// older one means the sender's log and ours disagree below this offset.
	if first.GetEpoch() < r.tailEpoch {
		return nil, fmt.Errorf("%w: AppendRecords on %s: record %d has epoch %d, the log holds epoch %d", ErrStaleEpoch, r.id, first.GetOffset(), first.GetEpoch(), r.tailEpoch)
	}
	if first.GetEpochStart() && first.GetEpoch() == r.tailEpoch {
		return nil, fmt.Errorf("%w: AppendRecords on %s: epoch-start record %d does not begin epoch %d", ErrInvalid, r.id, first.GetOffset(), first.GetEpoch())
	}
	journaled, err := r.journalNewEpochs(recs)
	if err != nil {
		return nil, err
	}
	if journaled {
		r.notifyLocked() // the history changed
		if err := r.s.crash(CrashAppendJournal); err != nil {
			return nil, err
		}
	}
	// The writer is not woken: AppendRecords commits the queue itself next
	// (writeInline), or whoever holds the writer role takes it after.
	return r.enqueueLocked(p, func(i int) (uint64, byte) { return recs[i].GetEpoch(), epochStartFlag(recs[i]) }, false)
}

// journalNewEpochs journals, and fsyncs, each epoch of recs newer than the
// log's last, at its first record's offset, before any of recs is written
// (invariant 5). It reports whether the journal changed. r.mu is held.
func (r *Range) journalNewEpochs(recs []*tenurev1.Record) (changed bool, err error) {
	// Entries starting at the log end with an epoch above the first
	// record's describe epochs that wrote nothing here: a leader that
	// journaled its epoch and crashed before its epoch-start record, or
	// records of that epoch lost unsynced. The leader's log holds an older
	// epoch at this offset, so keeping them would claim records that are not
	// theirs; drop them, as Truncate(LogEnd) would.
	if latest, ok := r.j.Latest(); ok && latest.Epoch > recs[0].GetEpoch() {
		if latest.Start != r.next {
			// By the range invariant only entries at the log end can be newer
			// than the log's last epoch.
			return false, fmt.Errorf("%w: range %s: journal epoch %d starts at %d, below the log end %d, above the log's last epoch %d", ErrCorrupt, r.id, latest.Epoch, latest.Start, r.next, r.tailEpoch)
		}
		if err := r.j.TruncateFrom(r.next); err != nil {
			return false, r.journalErr(fmt.Errorf("logstore: AppendRecords on %s: drop epochs above %d at %d: %w", r.id, recs[0].GetEpoch(), r.next, err))
		}
		r.s.log.Info("dropped journal entries of epochs that wrote nothing here", "range", r.id, "at", r.next, "above_epoch", recs[0].GetEpoch())
		changed = true
	}
	prev := r.tailEpoch
	for _, rec := range recs {
		e, off := rec.GetEpoch(), rec.GetOffset()
		if e > prev {
			latest, ok := r.j.Latest()
			switch {
			case ok && latest.Epoch == e && latest.Start == off:
				// Already journaled here (a retry after a crash at
				// append:journal, or a pending leader entry): nothing to do.
			case ok && latest.Epoch >= e:
				return changed, fmt.Errorf("%w: range %s: journal's latest entry %+v, record %d has epoch %d", ErrCorrupt, r.id, latest, off, e)
			default:
				if err := r.j.Record(e, off); err != nil {
					return changed, r.journalErr(fmt.Errorf("logstore: AppendRecords on %s: journal (%d, %d): %w", r.id, e, off, err))
				}
				changed = true
			}
		}
		prev = e
	}
	return changed, nil
}

// prepared is a batch's values copied into the stored batch (batch.go),
// record headers not yet filled in, with each value's checksum: the
// per-byte work of an append, done before taking the range lock. vals are
// the batch's records, each a slice of batch. prods, when not nil, are the
// records' producers (zero: none), whose headers are already written.
type prepared struct {
	batch []byte
	vals  [][]byte
	crcs  []uint32
	prods []Producer
	bytes int
}

// prepare copies n values into one stored batch; prod, if not nil, gives
// each record's producer (zero: none).
func prepare(n int, value func(i int) []byte, prod func(i int) Producer) prepared {
	p := prepared{vals: make([][]byte, n), crcs: make([]uint32, n)}
	for i := range n {
		p.bytes += len(value(i))
	}
	size := batchBytes(n, p.bytes)
	if prod != nil {
		p.prods = make([]Producer, n)
		for i := range n {
			if p.prods[i] = prod(i); p.prods[i].ID != (ProducerID{}) {
				size += producerHeaderBytes
			}
		}
	}
	// One allocation for the whole write: its records are stored, and leave
	// the in-memory tail, together.
	p.batch = make([]byte, size)
	p.batch[0] = batchMagic
	binary.BigEndian.PutUint32(p.batch[1:batchHeaderBytes], uint32(n))
	pos := batchHeaderBytes
	for i := range n {
		v := value(i)
		hdr := 0
		if p.prods != nil && p.prods[i].ID != (ProducerID{}) {
			hdr = producerHeaderBytes
		}
		size := recordHeaderBytes + hdr + len(v)
		binary.BigEndian.PutUint32(p.batch[pos:], uint32(size))
		pos += batchLengthBytes
		rec := p.batch[pos : pos+size : pos+size]
		if hdr != 0 {
			encodeProducer(rec[recordHeaderBytes:], p.prods[i])
		}
		copy(rec[recordHeaderBytes+hdr:], v)
		// The checksum covers the producer header as part of the value.
		p.vals[i], p.crcs[i] = rec, crc32.Checksum(rec[recordHeaderBytes:], castagnoli)
		pos += size
	}
	return p
}

// enqueueLocked assigns offsets from r.next to p's records, seals them with
// epochAt's epoch and flags and queues them for the committer (waking the
// writer if wake is set). r.mu is held:
// that is what makes offsets contiguous in call order, and the queue order
// the offset order.
func (r *Range) enqueueLocked(p prepared, epochAt func(i int) (uint64, byte), wake bool) (*write, error) {
	n := uint64(len(p.vals))
	w := &write{r: r, base: r.next, end: r.next + n, key: logKey(r.id, r.next), batch: p.batch, vals: p.vals, bytes: p.bytes, done: make(chan struct{})}
	// Each record is sealed under the key of its own offset, so that it
	// fails its checksum anywhere else (batch.go).
	recKey := logKey(r.id, w.base)
	for i := range p.vals {
		epoch, flags := epochAt(i)
		valueBytes := len(p.vals[i]) - recordHeaderBytes
		if p.prods != nil && p.prods[i].ID != (ProducerID{}) {
			flags |= flagProducer
			valueBytes -= producerHeaderBytes
		}
		// Assert before writing: nothing that decodeRecord would refuse
		// reaches the disk.
		if err := checkRecordFields(epoch, flags, valueBytes); err != nil {
			return nil, fmt.Errorf("%w: range %s offset %d: %w", ErrInvalid, r.id, w.base+uint64(i), err)
		}
		binary.BigEndian.PutUint64(recKey[len(recKey)-8:], w.base+uint64(i))
		sealRecord(p.vals[i], p.crcs[i], recKey, epoch, flags)
		w.lastEpoch = epoch
	}
	if err := r.s.enqueue(w, wake); err != nil {
		return nil, err
	}
	r.addTailLocked(w)
	if r.producers != nil && p.prods != nil {
		// The dedupe state follows every record queued, a leader's or a
		// follower's, so it stays what the window's records say; a
		// stretch of one producer's consecutive sequences is one step.
		for i := 0; i < len(p.prods); {
			prod, j := p.prods[i], i+1
			for j < len(p.prods) && p.prods[j].ID == prod.ID && p.prods[j].Epoch == prod.Epoch && p.prods[j].Seq == prod.Seq+uint64(j-i) {
				j++
			}
			if prod.ID != (ProducerID{}) {
				r.producers.observeRun(w.base+uint64(i), prod, uint64(j-i))
			}
			i = j
		}
	}
	r.next, r.tailEpoch = w.end, w.lastEpoch
	// Fetchable now (ReadTail), before the write commits.
	r.notifyLocked()
	return w, nil
}
