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
// LogEnd returns no records; from > LogEnd is ErrOutOfRange.
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
	prefix := logPrefix(r.id)
	total := 0
	err = r.s.db.View(func(txn *badger.Txn) error {
		// Records below end were committed before end was published, so this
		// snapshot, taken after, holds them all.
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		it.Seek(logKey(r.id, from))
		for next := from; next < stop; next++ {
			if !it.Valid() {
				return fmt.Errorf("%w: range %s: record %d is missing (log ends at %d)", ErrCorrupt, r.id, next, end)
			}
			item := it.Item()
			off, err := parseLogKey(prefix, item.Key())
			if err != nil {
				return err
			}
			if off != next {
				return fmt.Errorf("%w: range %s: record %d is missing (found %d)", ErrCorrupt, r.id, next, off)
			}
			var rec *tenurev1.Record
			err = item.Value(func(stored []byte) error {
				epoch, flags, value, err := decodeRecord(item.Key(), stored)
				if err != nil {
					return err
				}
				rec = &tenurev1.Record{Offset: off, Epoch: epoch, EpochStart: flags&flagEpochStart != 0}
				if len(value) > 0 {
					rec.Value = append([]byte(nil), value...)
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("logstore: Read on %s at %d: %w", r.id, off, err)
			}
			if len(out) > 0 && total+len(rec.Value) > maxBytes {
				return nil
			}
			total += len(rec.Value)
			out = append(out, rec)
			it.Next()
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
