package logstore

import (
	"encoding/binary"
	"fmt"

	"github.com/dgraph-io/badger/v4"
)

// LogBytes returns how many bytes range id's stored batches take: each
// batch's length in its segment file, or the batch itself where Badger
// holds it. It reads every log key of the range (no segment file), so a
// caller asks it rarely (the metrics refresh it at most every 30s).
// Records not yet indexed (the last moments' group commits, held in the
// WAL and memory) are not counted yet. Range.StoredBytes is the same
// count kept as a counter (marks.go); this scan is what tests check it
// against. Released batches' bytes stay in their segment until the whole
// file is released (reclaim.go), so the files hold at least this much.
func (s *Store) LogBytes(id string) (uint64, error) {
	end, err := s.begin()
	if err != nil {
		return 0, err
	}
	defer end()
	var n uint64
	err = s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: logPrefix(id)})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			if err := item.Value(func(b []byte) error {
				if len(b) == segmentPointerBytes && b[0] == segmentMagic {
					// The pointer's length field (segment.go's format).
					n += uint64(binary.BigEndian.Uint32(b[17:21]))
					return nil
				}
				n += uint64(len(b))
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("logstore: size of %s: %w", id, err)
	}
	return n, nil
}
