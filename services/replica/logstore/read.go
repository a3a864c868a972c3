package logstore

import (
	"fmt"

	"github.com/dgraph-io/badger/v4"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// Read returns the records in [from, min(LogEnd, from+maxRecords)), stopping
// early once their values would exceed maxBytes, but always at least one
// record when from < LogEnd. maxRecords <= 0 or above wire.MaxReadRecords
// means wire.MaxReadRecords; maxBytes <= 0 means wire.MaxBatchBytes. Each
// record is verified against its checksum as it is read: a mismatch, or a
// record missing below LogEnd, is an error wrapping ErrCorrupt. from ==
// LogEnd returns no records; from > LogEnd is ErrOutOfRange; from below
// LogStart is ErrBelowLogStart (which is ErrOutOfRange too), naming the log
// start: those records were removed by retention.
//
// Read returns written records, durable or not: callers that must serve
// committed records only (LogService.Read) bound from and maxRecords by the
// HWM themselves.
func (r *Range) Read(from uint64, maxRecords int, maxBytes int) ([]*tenurev1.Record, error) {
	if maxRecords <= 0 || maxRecords > wire.MaxReadRecords {
		maxRecords = wire.MaxReadRecords
	}
	if maxBytes <= 0 {
		maxBytes = wire.MaxBatchBytes
	}
	// Shared with Truncate: the records below end stay while we read them.
	r.cutMu.RLock()
	defer r.cutMu.RUnlock()
	// Below the log start: removed on purpose, not missing.
	if err := r.belowStart("Read", from); err != nil {
		return nil, err
	}
	end := r.LogEnd()
	if from > end {
		return nil, fmt.Errorf("%w: Read(%d) on %s: log ends at %d", ErrOutOfRange, from, r.id, end)
	}
	stop := from + min(uint64(maxRecords), end-from)
	if from == stop {
		return nil, nil
	}
	done, err := r.s.begin()
	if err != nil {
		return nil, err
	}
	defer done()

	out := make([]*tenurev1.Record, 0, stop-from)
	total := 0
	full := false // stopped at maxBytes
	// Records from the tail's first offset on may not be indexed yet
	// (index.go): they are read from memory, after Badger's part.
	base, _, writes := r.tailFrom(from, stop)
	if from < base {
		out, total, full, err = r.readIndexed(out, from, min(stop, base), maxBytes)
		if err != nil {
			// An AdvanceLogStart since the check above may have removed
			// the records read: that is below the log start, not damage.
			return nil, r.errBelowStartGap("Read", from, err)
		}
	}
	if !full {
		out, _, _ = appendTailRecords(out, total, writes, from, stop, maxBytes)
	}
	return out, nil
}

// readIndexed appends to out the records in [from, stop) from Badger, all
// of which it holds, as Read returns them.
func (r *Range) readIndexed(out []*tenurev1.Record, from, stop uint64, maxBytes int) (_ []*tenurev1.Record, total int, full bool, err error) {
	err = r.s.db.View(func(txn *badger.Txn) error {
		// Records below stop were indexed before the tail let them go,
		// and that was before tailFrom read the tail, so this
		// snapshot, taken after, holds them all.
		next, gap, err := r.s.scanLog(txn, r.id, from, func(sr storedRecord) (bool, error) {
			if sr.offset >= stop {
				return false, nil
			}
			if len(out) > 0 && total+len(sr.value) > maxBytes {
				full = true
				return false, nil
			}
			rec := &tenurev1.Record{Offset: sr.offset, Epoch: sr.epoch, EpochStart: sr.flags&flagEpochStart != 0}
			if sr.flags&flagProducer != 0 {
				rec.ProducerId = append([]byte(nil), sr.prod.ID[:]...)
				rec.ProducerEpoch, rec.ProducerSequence = sr.prod.Epoch, sr.prod.Seq
			}
			if len(sr.value) > 0 {
				rec.Value = append([]byte(nil), sr.value...)
			}
			total += len(sr.value)
			out = append(out, rec)
			return true, nil
		})
		if err != nil {
			return fmt.Errorf("logstore: Read on %s at %d: %w", r.id, next, err)
		}
		if next < stop && !full {
			if gap == "" {
				gap = fmt.Sprintf("record %d is missing", next)
			}
			return fmt.Errorf("%w: range %s: %s (indexed up to %d)", ErrCorrupt, r.id, gap, stop)
		}
		return nil
	})
	return out, total, full, err
}
