package logstore

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/dgraph-io/badger/v4"

	"github.com/tenurelog/tenure/pkg/wire"
)

// Stored batches.
//
// A write (one Append, or one fetched batch a follower applies) is stored
// as one Badger key, l/<range>/<offset of its first record>, whose value
// points to the write's batch in a segment file (segment.go) or, in a store
// written before segments, is the batch itself: its records in offset
// order,
//
//	batch:  batchMagic u8 | count u32 | (length u32 | record) per record
//
// where each record is exactly a record as the package comment describes it
// (epoch, flags, crc32c, value), sealed under the key of its own offset
// (logKey(range, first+i)): a record moved to any other offset, in or out of
// a batch, fails its checksum. Badger's cost per key (a memtable skiplist
// insert and its WAL entry, a transaction entry, a value-log entry header
// and checksum) is then paid once per write, not once per record: measured
// with the bench module's 256-in-flight shape (6 interleaved runs each),
// 57.6k against 45.8k records/s.
//
// Stores written before batches hold one record per key, with the record
// itself as the value. Its first byte is the most significant byte of its
// epoch, which is 0 for every epoch a lease service can grant (they count
// up from 1 and stay far below 2^56), so the first byte tells the two
// apart and such stores read unchanged: a key whose value is a bare record
// is a batch of one.
//
// These constants are part of the on-disk format.
const (
	batchMagic byte = 0xB7
	// batchHeaderBytes precedes a batch's records: magic u8, count u32.
	batchHeaderBytes = 1 + 4
	// batchLengthBytes precedes each record in a batch: its length u32.
	batchLengthBytes = 4
)

// batchBytes is the stored size of a batch whose records carry valueBytes
// of values in all.
func batchBytes(records, valueBytes int) int {
	return batchHeaderBytes + records*(batchLengthBytes+recordHeaderBytes) + valueBytes
}

// storedRecord is one verified record of a stored batch; value aliases the
// bytes it was decoded from.
type storedRecord struct {
	offset uint64
	epoch  uint64
	flags  byte
	value  []byte
	// prod is the producer that appended it (flags has flagProducer), or
	// zero; its id aliases the stored bytes too.
	prod Producer
}

// decodeBatch verifies the value stored under key, the log key of range id
// at offset base, and returns its records, the first at base. Every failure
// wraps ErrCorrupt.
func decodeBatch(id string, base uint64, key, stored []byte) ([]storedRecord, error) {
	if len(stored) == 0 || stored[0] != batchMagic {
		// A store written before batches: one bare record.
		epoch, flags, value, prod, err := decodeRecord(key, stored)
		if err != nil {
			return nil, err
		}
		return []storedRecord{{offset: base, epoch: epoch, flags: flags, value: value, prod: prod}}, nil
	}
	if len(stored) < batchHeaderBytes {
		return nil, fmt.Errorf("%w: batch %s is %d bytes, shorter than its header", ErrCorrupt, keyString(key), len(stored))
	}
	count := binary.BigEndian.Uint32(stored[1:batchHeaderBytes])
	// Assert the writer's bound before allocating on the count's say-so.
	if count == 0 || count > wire.MaxBatchRecords {
		return nil, fmt.Errorf("%w: batch %s holds %d records, want 1 to %d", ErrCorrupt, keyString(key), count, wire.MaxBatchRecords)
	}
	recs := make([]storedRecord, 0, count)
	recKey := logKey(id, base)
	rest := stored[batchHeaderBytes:]
	for i := range uint64(count) {
		if len(rest) < batchLengthBytes {
			return nil, fmt.Errorf("%w: batch %s ends inside record %d of %d", ErrCorrupt, keyString(key), i, count)
		}
		n := binary.BigEndian.Uint32(rest[:batchLengthBytes])
		rest = rest[batchLengthBytes:]
		if uint64(n) > uint64(len(rest)) {
			return nil, fmt.Errorf("%w: batch %s: record %d of %d claims %d bytes, %d remain", ErrCorrupt, keyString(key), i, count, n, len(rest))
		}
		off := base + i
		binary.BigEndian.PutUint64(recKey[len(recKey)-8:], off)
		epoch, flags, value, prod, err := decodeRecord(recKey, rest[:n])
		if err != nil {
			return nil, err
		}
		if len(recs) > 0 && epoch < recs[len(recs)-1].epoch {
			return nil, fmt.Errorf("%w: batch %s: record %d has epoch %d after epoch %d", ErrCorrupt, keyString(key), off, epoch, recs[len(recs)-1].epoch)
		}
		recs = append(recs, storedRecord{offset: off, epoch: epoch, flags: flags, value: value, prod: prod})
		rest = rest[n:]
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("%w: batch %s has %d bytes after its %d records", ErrCorrupt, keyString(key), len(rest), count)
	}
	return recs, nil
}

// batchPrefix returns the stored batch holding the first keep records of
// stored (a batch or a bare record that decodeBatch accepted), for a
// truncation that cuts a batch: the kept records' bytes, checksums included,
// are copied unchanged, since each is sealed under its own offset.
func batchPrefix(stored []byte, keep int) []byte {
	if stored[0] != batchMagic {
		return append([]byte(nil), stored...) // a bare record: all or nothing
	}
	rest := stored[batchHeaderBytes:]
	n := 0
	for range keep {
		n += batchLengthBytes + int(binary.BigEndian.Uint32(rest[n:]))
	}
	out := make([]byte, batchHeaderBytes, batchHeaderBytes+n)
	out[0] = batchMagic
	binary.BigEndian.PutUint32(out[1:], uint32(keep))
	return append(out, rest[:n]...)
}

// errScanStop ends a scanLog whose fn declined a record.
var errScanStop = errors.New("logstore: scan stopped")

// scanLog calls fn with each record of range id from offset from on, in
// offset order, each verified, until fn declines one (false: it is not
// counted) or fails, or the stored log ends. It returns next, the offset
// after the last record fn took. gap is set when the scan stopped at a
// record that is missing (a gap between stored batches) or unreadable (a
// batch that fails its checks): it says why there is no record at next.
// Callers decide what a gap is: damage (Read), or a torn tail (Open).
// fn's values alias Badger's buffers and are valid only during the call.
func (s *Store) scanLog(txn *badger.Txn, id string, from uint64, fn func(storedRecord) (bool, error)) (next uint64, gap string, err error) {
	prefix := logPrefix(id)
	start := logKey(id, from)
	// The batch holding from may start below it: the last key at or below
	// from is where the scan begins.
	rit := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, Reverse: true})
	if rit.Seek(start); rit.Valid() {
		start = rit.Item().KeyCopy(nil)
	}
	rit.Close()
	it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
	defer it.Close()
	next = from
	first := true
	for it.Seek(start); it.Valid(); it.Next() {
		item := it.Item()
		base, err := parseLogKey(prefix, item.Key())
		if err != nil {
			return next, "", err
		}
		if base > next {
			return next, fmt.Sprintf("record %d is missing, %d follows", next, base), nil
		}
		// Only the first batch may start below next (it holds from);
		// the writer and the cut never leave batches that overlap.
		if base < next && !first {
			return next, "", fmt.Errorf("%w: range %s: the batch at %d overlaps records below %d", ErrCorrupt, id, base, next)
		}
		var fnErr error
		err = item.Value(func(b []byte) error {
			b, err := s.loadBatch(item.Key(), b)
			if err != nil {
				return err
			}
			recs, err := decodeBatch(id, base, item.Key(), b)
			if err != nil {
				return err
			}
			if base+uint64(len(recs)) <= next {
				// The last batch below from, found by the reverse seek,
				// ends at or below it: from starts the next key, if any.
				return nil
			}
			for _, rec := range recs[next-base:] {
				ok, err := fn(rec)
				if err != nil {
					fnErr = err
					return err
				}
				if !ok {
					return errScanStop
				}
				next++
			}
			return nil
		})
		switch {
		case fnErr != nil:
			return next, "", fnErr
		case errors.Is(err, errScanStop):
			return next, "", nil
		case errors.Is(err, ErrCorrupt):
			return next, fmt.Sprintf("record %d is unreadable: %v", next, err), nil
		case err != nil:
			return next, "", err
		}
		first = false
	}
	return next, "", nil
}
