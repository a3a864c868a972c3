package logstore_test

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"

	"github.com/dgraph-io/badger/v4"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// testdata/a8330f8-r1 is replica r1's data directory as tenure a8330f8
// (2026-11-30) left it after 'tenure dev --records 3' (the story, then a
// clean stop): range demo, offsets 0-7, epoch 1 from 0 (r1 led it) and
// epoch 2 from 4 (r3 led it after r1 was killed; r1's unacknowledged
// "in-doubt" record at 4 was cut when it came back and fetched). That
// version stored one Badger key per record, no segments, a version 1
// state, and its own WAL (wal.0, wal.1; their zero tails, which no reader
// passes, cut off to keep the fixture small; Badger's DISCARD file, which
// Badger makes again, left out). No test wrote a store in that format
// except by editing a new one, which would not catch a layout or encoding
// the new code only assumes the old one had.

// a8330f8Records are the fixture's records, as its story printed them.
var a8330f8Records = []struct {
	epoch      uint64
	epochStart bool
	value      string
}{
	{1, true, ""}, {1, false, "before-failover-1"}, {1, false, "before-failover-2"}, {1, false, "before-failover-3"},
	{2, true, ""}, {2, false, "after-failover-1"}, {2, false, "after-failover-2"}, {2, false, "after-failover-3"},
}

// copyFixture copies testdata/name into a new temp dir: Open recovers and
// writes, and the fixture must stay as the old version left it.
func copyFixture(t *testing.T, name string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "r1")
	if err := os.CopyFS(dir, os.DirFS(filepath.Join("testdata", name))); err != nil {
		t.Fatal(err)
	}
	return dir
}

// checkA8330f8 checks that range demo of a store opened from the fixture
// holds every record at its offset with its epoch and value, and the
// state, HWM and history the old version left.
func checkA8330f8(t *testing.T, s *logstore.Store) *logstore.Range {
	t.Helper()
	r := mustRange(t, s, "demo")
	if r.Quarantined() != nil {
		t.Fatalf("range demo quarantined: %v", r.Quarantined())
	}
	if r.LogStart() != 0 || r.LogEnd() != 8 || r.HWM() != 8 || r.LastEpoch() != 2 {
		t.Fatalf("log start, end, HWM, last epoch = %d, %d, %d, %d; want 0, 8, 8, 2", r.LogStart(), r.LogEnd(), r.HWM(), r.LastEpoch())
	}
	checkHistory(t, r, es(1, 0, 2, 4))
	recs := readAll(t, r)
	if len(recs) != len(a8330f8Records) {
		t.Fatalf("read %d records, want %d", len(recs), len(a8330f8Records))
	}
	for i, want := range a8330f8Records {
		rec := recs[i]
		if rec.GetOffset() != uint64(i) || rec.GetEpoch() != want.epoch || rec.GetEpochStart() != want.epochStart || string(rec.GetValue()) != want.value {
			t.Errorf("record %d = offset %d epoch %d start %v %q; want epoch %d start %v %q",
				i, rec.GetOffset(), rec.GetEpoch(), rec.GetEpochStart(), rec.GetValue(), want.epoch, want.epochStart, want.value)
		}
	}
	st := r.State()
	if st.FencedEpoch != 2 || st.Epoch != 2 || st.Role != tenurev1.Role_ROLE_FOLLOWER || st.LeaderID != "r3" || len(st.Replicas) != 3 {
		t.Errorf("state = %+v; want fenced at and following r3 at epoch 2, three replicas", st)
	}
	checkConsistent(t, r)
	return r
}

// A store tenure a8330f8 wrote opens, reads every record as written, takes
// appends after them, and reopens with both.
func TestStoreOfA8330f8Opens(t *testing.T) {
	dir := copyFixture(t, "a8330f8-r1")
	s, err := logstore.Open(dir, logstore.Options{Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("Open(a8330f8's store) = %v", err)
	}
	r := checkA8330f8(t, s)
	appendN(t, r, 2, 3)
	waitDurable(t, r, 11)
	closeStore(t, s)

	s, err = logstore.Open(dir, logstore.Options{Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("reopen = %v", err)
	}
	defer closeStore(t, s)
	r = mustRange(t, s, "demo")
	if r.LogEnd() != 11 {
		t.Fatalf("reopened: LogEnd() = %d, want 11", r.LogEnd())
	}
	recs := readAll(t, r)
	for _, rec := range recs[8:] {
		if want := value("demo", rec.GetOffset()); !bytes.Equal(rec.GetValue(), want) {
			t.Errorf("appended record %d = %q, want %q", rec.GetOffset(), rec.GetValue(), want)
		}
	}
	checkConsistent(t, r)
}

// A machine that lost power under tenure a8330f8 and comes back with the
// new binary: Badger lost what it had not synced, and only a8330f8's own
// WAL holds those records, acknowledged ones included. Its WAL generation
// 3 (wal.1) holds what r1 fetched after its restart, offsets 4-7, and the
// HWM that made them committed; here Badger forgets them and w/gen goes
// back to 3, as if the clean stop's checkpoint had never run, and Open
// must replay them from the old WAL (into the segments this version keeps
// records in).
func TestStoreOfA8330f8ReplaysItsWAL(t *testing.T) {
	dir := copyFixture(t, "a8330f8-r1")
	db, err := badger.Open(badger.DefaultOptions(filepath.Join(dir, "badger")).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(txn *badger.Txn) error {
		for off := uint64(4); off < 8; off++ {
			if err := txn.Delete(logKey("demo", off)); err != nil {
				return err
			}
		}
		for _, k := range []string{"h/demo", "d/demo"} {
			if err := txn.Delete([]byte(k)); err != nil {
				return err
			}
		}
		// w/gen: u64 | crc32c over key then value.
		key := []byte("w/gen")
		v := binary.BigEndian.AppendUint64(nil, 3)
		v = binary.BigEndian.AppendUint32(v, crc32.Update(crc32.Checksum(key, castagnoli), castagnoli, v))
		return txn.Set(key, v)
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}

	s, err := logstore.Open(dir, logstore.Options{Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("Open(a8330f8's store after a power loss) = %v", err)
	}
	defer closeStore(t, s)
	checkA8330f8(t, s)
}
