package logstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// sealedBatch encodes values as the stored batch of range id starting at
// base, as Append does: epoch e for every record.
func sealedBatch(id string, base, epoch uint64, values ...[]byte) []byte {
	p := prepare(len(values), func(i int) []byte { return values[i] })
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
