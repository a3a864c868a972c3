package logstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/dgraph-io/badger/v4"
)

// sealedBatch encodes values as the stored batch of range id starting at
// base, as Append does: epoch e for every record.
func sealedBatch(id string, base, epoch uint64, values ...[]byte) []byte {
	p := prepare(len(values), func(i int) []byte { return values[i] }, nil)
	key := logKey(id, base)
	for i := range p.vals {
		binary.BigEndian.PutUint64(key[len(key)-8:], base+uint64(i))
		sealRecord(p.vals[i], p.crcs[i], key, epoch, 0)
	}
	return p.batch
}

func TestBatchRoundTrip(t *testing.T) {
	values := [][]byte{[]byte("a"), {}, bytes.Repeat([]byte("x"), 300)}
	b := sealedBatch("r1", 40, 7, values...)
	recs, err := decodeBatch("r1", 40, logKey("r1", 40), b)
	if err != nil || len(recs) != len(values) {
		t.Fatalf("decodeBatch = %d records, %v; want %d", len(recs), err, len(values))
	}
	for i, rec := range recs {
		if rec.offset != 40+uint64(i) || rec.epoch != 7 || rec.flags != 0 || !bytes.Equal(rec.value, values[i]) {
			t.Errorf("record %d = %+v", i, rec)
		}
	}
	// A bare record (a store written before batches) is a batch of one.
	key := logKey("r1", 9)
	recs, err = decodeBatch("r1", 9, key, sealed(key, 3, flagEpochStart, nil))
	if err != nil || len(recs) != 1 || recs[0].offset != 9 || recs[0].epoch != 3 || recs[0].flags != flagEpochStart {
		t.Fatalf("decodeBatch(bare record) = %+v, %v", recs, err)
	}
}

func TestBatchDamageIsCorrupt(t *testing.T) {
	good := sealedBatch("r1", 40, 7, []byte("one"), []byte("two"))
	key := logKey("r1", 40)
	for i := range good {
		bad := bytes.Clone(good)
		bad[i] ^= 0x20
		if _, err := decodeBatch("r1", 40, key, bad); !errors.Is(err, ErrCorrupt) {
			t.Errorf("byte %d flipped: decodeBatch = %v, want ErrCorrupt", i, err)
		}
	}
	for name, tc := range map[string]struct {
		id     string
		base   uint64
		stored []byte
	}{
		"other offset":  {"r1", 41, good},
		"other range":   {"r2", 40, good},
		"torn":          {"r1", 40, good[:len(good)-1]},
		"trailing byte": {"r1", 40, append(bytes.Clone(good), 0)},
		"header only":   {"r1", 40, good[:batchHeaderBytes]},
		"no records":    {"r1", 40, []byte{batchMagic, 0, 0, 0, 0}},
		"count too big": {"r1", 40, append([]byte{batchMagic, 0xff, 0xff, 0xff, 0xff}, good[batchHeaderBytes:]...)},
	} {
		if _, err := decodeBatch(tc.id, tc.base, logKey(tc.id, tc.base), tc.stored); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: decodeBatch = %v, want ErrCorrupt", name, err)
		}
	}
}

func TestBatchPrefix(t *testing.T) {
	values := [][]byte{[]byte("a"), []byte("bb"), []byte("ccc")}
	b := sealedBatch("r1", 5, 2, values...)
	for keep := 1; keep <= len(values); keep++ {
		recs, err := decodeBatch("r1", 5, logKey("r1", 5), batchPrefix(b, keep))
		if err != nil || len(recs) != keep {
			t.Fatalf("batchPrefix(%d) decodes to %d records, %v", keep, len(recs), err)
		}
		for i, rec := range recs {
			if !bytes.Equal(rec.value, values[i]) {
				t.Errorf("batchPrefix(%d) record %d = %q, want %q", keep, i, rec.value, values[i])
			}
		}
	}
}

// TestScanLog reads a range stored as batches from every offset, and
// refuses batches that overlap, which neither the writer nor a cut leaves.
func TestScanLog(t *testing.T) {
	db, err := badger.Open(badger.DefaultOptions(t.TempDir()).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	put := func(base uint64, n int) {
		t.Helper()
		vals := make([][]byte, n)
		for i := range vals {
			vals[i] = []byte{byte(base) + byte(i)}
		}
		if err := db.Update(func(txn *badger.Txn) error { return txn.Set(logKey("r1", base), sealedBatch("r1", base, 1, vals...)) }); err != nil {
			t.Fatal(err)
		}
	}
	scan := func(from uint64) (got []uint64, next uint64, gap string, err error) {
		err = db.View(func(txn *badger.Txn) error {
			var err error
			next, gap, err = (&Store{}).scanLog(txn, "r1", from, func(r storedRecord) (bool, error) {
				if r.value[0] != byte(r.offset) {
					t.Errorf("record %d holds %d", r.offset, r.value[0])
				}
				got = append(got, r.offset)
				return true, nil
			})
			return err
		})
		return got, next, gap, err
	}
	put(0, 3) // 0-2
	put(3, 4) // 3-6
	for from := uint64(0); from <= 7; from++ {
		got, next, gap, err := scan(from)
		if err != nil || gap != "" || next != 7 || uint64(len(got)) != 7-from {
			t.Errorf("scan(%d) = %v, next %d, gap %q, %v; want %d records to 7", from, got, next, gap, err, 7-from)
		}
	}
	put(9, 1) // a gap at 7-8
	if _, next, gap, err := scan(2); err != nil || next != 7 || gap == "" {
		t.Errorf("scan(2) over a gap = next %d, gap %q, %v; want next 7 and a gap", next, gap, err)
	}
	put(5, 2) // 5-6 again, overlapping 3-6
	if _, _, _, err := scan(0); !errors.Is(err, ErrCorrupt) {
		t.Errorf("scan(0) over overlapping batches = %v, want ErrCorrupt", err)
	}
}
