package logstore_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/tenurelog/tenure/services/replica/logstore"
)

// pointer is a log key's value as segment.go writes it.
type pointer struct {
	segment  uint32
	position int64
	length   uint32
}

// storedValues returns range id's log keys and their Badger values in the
// closed store.
func (o *opener) storedValues(id string) (keys, vals [][]byte) {
	o.t.Helper()
	db := o.rawDB()
	defer db.Close()
	err := db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte("l/" + id + "/")})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			keys, vals = append(keys, it.Item().KeyCopy(nil)), append(vals, v)
		}
		return nil
	})
	if err != nil {
		o.t.Fatal(err)
	}
	return keys, vals
}

// pointers decodes range id's stored values, each of which must be a
// segment pointer: 0xB8 | count u32 | segment u32 | position u64 |
// length u32 | crc u32.
func (o *opener) pointers(id string) []pointer {
	o.t.Helper()
	keys, vals := o.storedValues(id)
	var out []pointer
	for i, v := range vals {
		if len(v) != 25 || v[0] != 0xB8 {
			o.t.Fatalf("%q holds %d bytes starting %#x, want a 25-byte segment pointer", keys[i], len(v), v[0])
		}
		out = append(out, pointer{binary.BigEndian.Uint32(v[5:9]), int64(binary.BigEndian.Uint64(v[9:17])), binary.BigEndian.Uint32(v[17:21])})
	}
	return out
}

func (o *opener) segmentFiles() []string {
	o.t.Helper()
	names, err := filepath.Glob(filepath.Join(o.dir, "segments", "*.seg"))
	if err != nil {
		o.t.Fatal(err)
	}
	slices.Sort(names)
	return names
}

func segmentFile(o *opener, n uint32) string {
	return filepath.Join(o.dir, "segments", fmt.Sprintf("%08d.seg", n))
}

// Stored batches live in segment files, Badger holding a pointer to each,
// and read back the same after a reopen; a store opened again writes to a
// new file, so nothing is appended after a tail a crash may have torn.
func TestBatchesLiveInSegments(t *testing.T) {
	o := newOpener(t)
	s := o.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	for range 5 {
		appendN(t, r, 1, 4)
	}
	waitDurable(t, r, 21)
	want := readAll(t, r)
	closeStore(t, s)

	ptrs := o.pointers("r1")
	if len(ptrs) != 6 { // the epoch-start record, then 5 batches
		t.Fatalf("r1 is stored as %d batches, want 6", len(ptrs))
	}
	for i, p := range ptrs {
		if p.segment != 1 || (i > 0 && p.position != ptrs[i-1].position+int64(ptrs[i-1].length)) {
			t.Fatalf("pointer %d = %+v, want batches back to back in segment 1 (%+v)", i, p, ptrs)
		}
	}

	s = o.open()
	r, _ = s.Range("r1")
	sameRecords(t, "after reopening", readAll(t, r), want)
	appendN(t, r, 1, 3)
	waitDurable(t, r, 24)
	want = readAll(t, r)
	closeStore(t, s)
	if last := o.pointers("r1")[6]; last.segment != 2 || last.position != 0 {
		t.Fatalf("the first batch after reopening is at %+v, want the start of segment 2", last)
	}
	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	sameRecords(t, "after reopening again", readAll(t, r), want)
}

// A full segment file is followed by the next; batches read back from
// every file, across reopens and a truncation.
func TestSegmentsRollOver(t *testing.T) {
	defer logstore.SetSegmentBytes(4 << 10)()
	o := newOpener(t)
	s := o.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	for range 40 {
		if _, err := r.Append(1, false, [][]byte{make([]byte, 700), make([]byte, 700)}); err != nil {
			t.Fatal(err)
		}
	}
	waitDurable(t, r, 81)
	want := readAll(t, r)
	closeStore(t, s)
	// 40 batches of ~1.4 KiB, two to a 4 KiB file (the epoch-start record
	// shares the first).
	if n := len(o.segmentFiles()); n < 15 {
		t.Fatalf("%d segment files after ~56 KiB of batches in 4 KiB files", n)
	}
	for _, p := range o.pointers("r1") {
		if p.position > 0 && p.position+int64(p.length) > 4<<10 {
			t.Fatalf("batch %+v runs past a full segment", p)
		}
	}

	s = o.open()
	r, _ = s.Range("r1")
	sameRecords(t, "after reopening", readAll(t, r), want)
	if _, err := r.Truncate(50); err != nil {
		t.Fatalf("Truncate(50) = %v", err)
	}
	appendN(t, r, 1, 3)
	waitDurable(t, r, 53)
	want = append(want[:50:50], readAll(t, r)[50:]...)
	closeStore(t, s)
	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	sameRecords(t, "after a truncation and a reopen", readAll(t, r), want)
	checkConsistent(t, r)
}

// A batch whose bytes in its segment changed, or whose segment is gone,
// reads as ErrCorrupt: a pointer's checksum covers the bytes it points to.
func TestDamagedSegmentIsCorrupt(t *testing.T) {
	for name, damage := range map[string]func(t *testing.T, o *opener, p pointer){
		"flipped byte": func(t *testing.T, o *opener, p pointer) {
			f, err := os.OpenFile(segmentFile(o, p.segment), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			b := make([]byte, 1)
			at := p.position + int64(p.length) - 1 // the batch's last value byte
			if _, err := f.ReadAt(b, at); err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt([]byte{b[0] ^ 0x40}, at); err != nil {
				t.Fatal(err)
			}
		},
		"cut segment": func(t *testing.T, o *opener, p pointer) {
			if err := os.Truncate(segmentFile(o, p.segment), p.position+1); err != nil {
				t.Fatal(err)
			}
		},
		"missing segment": func(t *testing.T, o *opener, p pointer) {
			if err := os.Remove(segmentFile(o, p.segment)); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			defer logstore.SetSegmentBytes(1)() // a file per batch
			o := closedSmallBatches(t)          // epoch-start, then 1-3, 4-6, 7-9
			ptrs := o.pointers("r1")
			damage(t, o, ptrs[2]) // records 4-6
			s := o.open()
			defer closeStore(t, s)
			r, _ := s.Range("r1")
			if _, err := r.Read(4, 1, 0); !errors.Is(err, logstore.ErrCorrupt) {
				t.Fatalf("Read(4) of a damaged batch = %v, want ErrCorrupt", err)
			}
			if _, err := r.Read(1, 3, 0); err != nil {
				t.Fatalf("Read(1, 3) of an intact batch = %v", err)
			}
		})
	}
}

// A store written before segments holds each batch in Badger itself; it
// reads, grows, truncates and reopens as one log, batches in Badger
// before batches in segments.
func TestStoreBeforeSegmentsReadsUnchanged(t *testing.T) {
	o := closedThreeEpochs(t)
	keys, vals := o.storedValues("r1")
	for i := range vals {
		b, err := logstore.StoredBatchForTest(o.dir, keys[i], vals[i])
		if err != nil {
			t.Fatal(err)
		}
		vals[i] = b
	}
	o.editDB(func(txn *badger.Txn) error {
		for i := range keys {
			if err := txn.Set(keys[i], vals[i]); err != nil {
				return err
			}
		}
		return nil
	})
	if err := os.RemoveAll(filepath.Join(o.dir, "segments")); err != nil {
		t.Fatal(err)
	}

	s := o.open()
	r, _ := s.Range("r1")
	if r.LogEnd() != 30 || r.LastEpoch() != 3 {
		t.Fatalf("LogEnd, LastEpoch = %d, %d; want 30, 3", r.LogEnd(), r.LastEpoch())
	}
	checkHistory(t, r, es(1, 0, 2, 10, 3, 20))
	appendN(t, r, 3, 5) // a batch in a segment after the ones in Badger
	waitDurable(t, r, 35)
	if _, err := r.Truncate(25); err != nil { // inside a batch in Badger
		t.Fatalf("Truncate(25) = %v", err)
	}
	appendN(t, r, 3, 2)
	waitDurable(t, r, 27)
	want := readAll(t, r)
	closeStore(t, s)
	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	sameRecords(t, "after reopening", readAll(t, r), want)
	checkConsistent(t, r)
}

// Open's replay writes the batches it replays to segments, then stops
// replaying them: those segments must be synced first, so a power loss
// right after the Open keeps every batch.
func TestPowerLossAfterReplayKeepsSegments(t *testing.T) {
	c, want := crashedAfter(t, 20, 5)
	c.loseRecords("r1", 0, 21) // Badger lost them all: only the replay has them
	s := c.open()
	losePower(t, s)
	sameRecords(t, "after a power loss after the replay", readAll(t, c.reopen(21)), want)
}

// Badger may keep pointers it indexed from WAL entries a power loss took,
// to segment bytes it took too: Open reads them as a torn tail and cuts
// it, keeping every record that was durable.
func TestPowerLossCutsDanglingPointers(t *testing.T) {
	defer logstore.SetSyncDemandDelay(time.Hour)()
	o := newOpener(t)
	s := o.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	appendN(t, r, 1, 4)
	waitDurable(t, r, 5)
	want := readAll(t, r)
	r.SetSyncOnDemand(true) // nothing demands a sync: the next writes wait
	appendN(t, r, 1, 3)
	appendN(t, r, 1, 3)
	if err := s.IndexNow(); err != nil { // their pointers reach Badger
		t.Fatal(err)
	}
	if d := r.DurableEnd(); d != 5 {
		t.Fatalf("DurableEnd = %d, want 5: the test needs writes that were never synced", d)
	}
	losePower(t, s)
	// Those of the synced entries are gone (the replay brings them back),
	// the two dangling ones kept.
	if ptrs := o.pointers("r1"); len(ptrs) != 2 {
		t.Fatalf("Badger holds %d batches of r1 after the power loss, want the 2 dangling ones", len(ptrs))
	}
	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	if r.LogEnd() != 5 {
		t.Fatalf("LogEnd after the power loss = %d, want 5", r.LogEnd())
	}
	sameRecords(t, "after the power loss", readAll(t, r), want)
	checkConsistent(t, r)
}
