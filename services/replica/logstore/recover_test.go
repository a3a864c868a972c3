package logstore_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"log/slog"
	"os"
	"testing"

	"github.com/dgraph-io/badger/v4"

	"github.com/tenurelog/tenure/internal/testlog"
	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/pkg/journal/journaltest"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// closedThreeEpochs leaves a closed store whose range r1 has history (1,0),
// (2,10), (3,20) and log end 30.
func closedThreeEpochs(t *testing.T) *opener {
	o := newOpener(t)
	s := o.open()
	threeEpochs(t, mustRange(t, s, "r1"))
	closeStore(t, s)
	return o
}

// editDB changes the closed store's Badger database directly.
func (o *opener) editDB(fn func(txn *badger.Txn) error) {
	o.t.Helper()
	db := o.rawDB()
	defer db.Close()
	if err := db.Update(fn); err != nil {
		o.t.Fatalf("edit badger: %v", err)
	}
}

// flipValueByte corrupts the last byte of key's value.
func flipValueByte(txn *badger.Txn, key []byte) error {
	item, err := txn.Get(key)
	if err != nil {
		return err
	}
	v, err := item.ValueCopy(nil)
	if err != nil {
		return err
	}
	v[len(v)-1] ^= 0x40
	return txn.Set(key, v)
}

func TestOpenRebuildsJournalFromLog(t *testing.T) {
	for name, damage := range map[string]func(t *testing.T, path string){
		"missing": func(t *testing.T, path string) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		},
		"corrupt": func(t *testing.T, path string) {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)/2] ^= 0xff // inside a middle entry: not a torn tail
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
		},
		"empty": func(t *testing.T, path string) {
			if err := os.Truncate(path, 0); err != nil {
				t.Fatal(err)
			}
		},
		"wrong start": func(t *testing.T, path string) {
			j, err := journal.Create(path, es(1, 0, 2, 7, 3, 20))
			if err != nil {
				t.Fatal(err)
			}
			j.Close()
		},
		"missing epoch": func(t *testing.T, path string) {
			j, err := journal.Create(path, es(1, 0, 3, 20))
			if err != nil {
				t.Fatal(err)
			}
			j.Close()
		},
	} {
		t.Run(name, func(t *testing.T) {
			o := closedThreeEpochs(t)
			damage(t, o.journalPath("r1"))
			s := o.open()
			defer closeStore(t, s)
			r, _ := s.Range("r1")
			checkHistory(t, r, es(1, 0, 2, 10, 3, 20))
			checkConsistent(t, r)
			// The rebuilt journal is a real one: it takes the next epoch.
			lead(t, r, 4)
			checkHistory(t, r, es(1, 0, 2, 10, 3, 20, 4, 30))
		})
	}
}

func TestOpenRemovesJournalEntriesBeyondLogEnd(t *testing.T) {
	o := closedThreeEpochs(t)
	j, err := journal.Open(o.journalPath("r1"))
	if err != nil {
		t.Fatal(err)
	}
	// Epoch 5 journaled at the log end (a leader before its start record)
	// is legal; epoch 6 starting beyond it describes records that are gone.
	for _, e := range es(5, 30, 6, 34) {
		if err := j.Record(e.Epoch, e.Start); err != nil {
			t.Fatal(err)
		}
	}
	j.Close()

	s := o.open()
	defer closeStore(t, s)
	r, _ := s.Range("r1")
	checkHistory(t, r, es(1, 0, 2, 10, 3, 20, 5, 30))
	checkConsistent(t, r)
}

// threeEpochs stores each epoch as its epoch-start record and one batch of
// nine: r1's keys are 0, 1 (records 1-9), 10, 11 (11-19), 20 and 21
// (21-29). A power loss or a bad disk loses or damages a stored batch
// whole.

func TestOpenCutsUnsyncedTailAtFirstHole(t *testing.T) {
	o := closedThreeEpochs(t)
	// What a power loss can leave: the marker says records below 11 were
	// synced; the batch of records 11-19 was lost while later ones survived.
	// The HWM had been persisted at 25, counting records this replica no
	// longer holds.
	o.editDB(func(txn *badger.Txn) error {
		if err := txn.Set([]byte("d/r1"), u64Value("d/r1", 11)); err != nil {
			return err
		}
		if err := txn.Set([]byte("h/r1"), u64Value("h/r1", 25)); err != nil {
			return err
		}
		return txn.Delete(logKey("r1", 11))
	})
	s := o.open()
	r, _ := s.Range("r1")
	if r.LogEnd() != 11 || r.DurableEnd() != 11 || r.LastEpoch() != 2 {
		t.Fatalf("LogEnd, DurableEnd, LastEpoch = %d, %d, %d; want 11, 11, 2", r.LogEnd(), r.DurableEnd(), r.LastEpoch())
	}
	if r.HWM() != 11 {
		t.Fatalf("HWM() = %d, want it lowered to the log end 11", r.HWM())
	}
	// Epoch 3 started at 20, beyond the recovered end: its entry goes.
	checkHistory(t, r, es(1, 0, 2, 10))
	checkConsistent(t, r)
	closeStore(t, s)

	// The cut is durable: the records above the hole do not come back.
	o.editDB(func(txn *badger.Txn) error {
		for _, off := range []uint64{20, 21} {
			if _, err := txn.Get(logKey("r1", off)); !errors.Is(err, badger.ErrKeyNotFound) {
				t.Errorf("batch %d above the hole still stored: %v", off, err)
			}
		}
		return nil
	})
	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	if r.LogEnd() != 11 || r.HWM() != 11 {
		t.Fatalf("second reopen: LogEnd, HWM = %d, %d; want 11, 11", r.LogEnd(), r.HWM())
	}
}

func TestOpenCutsTornRecordAboveSyncedMarker(t *testing.T) {
	o := closedThreeEpochs(t)
	o.editDB(func(txn *badger.Txn) error {
		if err := txn.Set([]byte("d/r1"), u64Value("d/r1", 11)); err != nil {
			return err
		}
		return flipValueByte(txn, logKey("r1", 11)) // record 19's last byte
	})
	s := o.open()
	defer closeStore(t, s)
	r, _ := s.Range("r1")
	if r.LogEnd() != 11 {
		t.Fatalf("LogEnd() = %d, want 11 (cut at the torn batch)", r.LogEnd())
	}
	checkConsistent(t, r)
}

// closedSmallBatches is a closed store whose range r1 holds epoch 1 only,
// as the epoch-start record and then batches of records 1-3, 4-6 and 7-9:
// damage to the batch at 1 or 4 is below the synced marker (10, from the
// clean close) yet not read when the store opens (which reads records 0
// and 9).
func closedSmallBatches(t *testing.T) *opener {
	o := newOpener(t)
	s := o.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	for range 3 {
		appendN(t, r, 1, 3)
	}
	waitDurable(t, r, 10)
	closeStore(t, s)
	return o
}

func TestReadVerifiesChecksums(t *testing.T) {
	o := closedSmallBatches(t)
	o.editDB(func(txn *badger.Txn) error {
		// Below the synced marker: damage, not a torn tail.
		return flipValueByte(txn, logKey("r1", 4)) // record 6's last byte
	})
	s := o.open()
	defer closeStore(t, s)
	r, _ := s.Range("r1")
	if _, err := r.Read(0, 0, 0); !errors.Is(err, logstore.ErrCorrupt) {
		t.Fatalf("Read over a flipped byte = %v, want ErrCorrupt", err)
	}
	if _, err := r.Read(2, 2, 0); err != nil {
		t.Fatalf("Read(2, 2) below the damage = %v", err)
	}
	if _, err := r.Read(7, 3, 0); err != nil {
		t.Fatalf("Read(7, 3) above the damage = %v", err)
	}
	if _, err := r.EpochAt(5); !errors.Is(err, logstore.ErrCorrupt) {
		t.Fatalf("EpochAt(5) = %v, want ErrCorrupt", err)
	}
}

func TestRecordUnderAnotherKeyFailsChecksum(t *testing.T) {
	o := closedSmallBatches(t)
	// Records moved to other offsets (same epoch, same shape: the batch of
	// 1-3 stored as the batch of 4-6) are caught: each checksum covers its
	// record's own key.
	o.editDB(func(txn *badger.Txn) error {
		item, err := txn.Get(logKey("r1", 1))
		if err != nil {
			return err
		}
		v, err := item.ValueCopy(nil)
		if err != nil {
			return err
		}
		return txn.Set(logKey("r1", 4), v)
	})
	s := o.open()
	defer closeStore(t, s)
	r, _ := s.Range("r1")
	if _, err := r.Read(4, 1, 0); !errors.Is(err, logstore.ErrCorrupt) {
		t.Fatalf("Read of a record stored under the wrong offset = %v, want ErrCorrupt", err)
	}
	if _, err := r.Read(1, 3, 0); err != nil {
		t.Fatalf("Read(1, 3) of the batch that was copied = %v", err)
	}
}

func TestOpenQuarantinesCorruptState(t *testing.T) {
	o := closedThreeEpochs(t)
	o.editDB(func(txn *badger.Txn) error { return flipValueByte(txn, []byte("s/r1")) })
	s, err := logstore.Open(o.dir, o.opts)
	if err != nil {
		t.Fatalf("Open with a corrupt state = %v, want the range quarantined", err)
	}
	defer closeStore(t, s)
	// A fence that cannot be read cannot be kept: the range takes nothing.
	r, _ := s.Range("r1")
	if !errors.Is(r.Quarantined(), logstore.ErrCorrupt) {
		t.Fatalf("Quarantined() = %v, want ErrCorrupt", r.Quarantined())
	}
	if err := r.SetState(logstore.State{FencedEpoch: 1}); !errors.Is(err, logstore.ErrQuarantined) {
		t.Fatalf("SetState on a range with a corrupt state = %v, want ErrQuarantined", err)
	}
}

func TestJournalFailureFailsStore(t *testing.T) {
	o := newOpener(t)
	ffs := journaltest.NewFaultFS(journal.OSFS{})
	o.opts.JournalFS = ffs
	s := o.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	appendN(t, r, 1, 3)

	ffs.SetInjector(journaltest.FailOp(journaltest.OpSync, journaltest.ErrInjected))
	if err := r.RecordEpoch(2, 4); !errors.Is(err, logstore.ErrFailed) || !errors.Is(err, journal.ErrPoisoned) {
		t.Fatalf("RecordEpoch with a failing fsync = %v, want ErrFailed wrapping journal.ErrPoisoned", err)
	}
	// A poisoned journal reads empty (unknown), never partial.
	if h := r.History(); len(h) != 0 {
		t.Fatalf("History() of a poisoned journal = %v, want empty", h)
	}
	if _, err := r.Append(1, false, [][]byte{[]byte("x")}); !errors.Is(err, logstore.ErrFailed) {
		t.Fatalf("Append after a journal failure = %v, want ErrFailed", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	ffs.SetInjector(nil)
	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	if h := r.History(); len(h) == 0 || h[0] != (journal.EpochStart{Epoch: 1, Start: 0}) {
		t.Fatalf("History() after reopen = %v, want it to start with (1, 0)", h)
	}
	checkConsistent(t, r)
}

// TestStoreBeforeBatchesReadsUnchanged opens a store as tenure wrote it
// before stored batches, one key per record with the record itself as the
// value, and checks that it reads, grows, truncates and reopens as one
// log, batches after bare records.
func TestStoreBeforeBatchesReadsUnchanged(t *testing.T) {
	o := closedThreeEpochs(t)
	o.editDB(func(txn *badger.Txn) error {
		type kv struct{ k, v []byte }
		var batches []kv
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte("l/r1/")})
		for it.Rewind(); it.Valid(); it.Next() {
			v, err := it.Item().ValueCopy(nil)
			if err == nil {
				v, err = logstore.StoredBatchForTest(o.dir, it.Item().Key(), v)
			}
			if err != nil {
				it.Close()
				return err
			}
			batches = append(batches, kv{it.Item().KeyCopy(nil), v})
		}
		it.Close()
		if len(batches) != 6 {
			t.Fatalf("r1 is stored as %d batches, want 6", len(batches))
		}
		// batch: 0xB7 | count u32 | (length u32 | record) per record.
		for _, b := range batches {
			base := binary.BigEndian.Uint64(b.k[len(b.k)-8:])
			if b.v[0] != 0xB7 {
				t.Fatalf("batch %d starts with %#x", base, b.v[0])
			}
			if err := txn.Delete(b.k); err != nil {
				return err
			}
			count, rest := binary.BigEndian.Uint32(b.v[1:5]), b.v[5:]
			for i := range uint64(count) {
				n := binary.BigEndian.Uint32(rest)
				if err := txn.Set(logKey("r1", base+i), rest[4:4+n]); err != nil {
					return err
				}
				rest = rest[4+n:]
			}
		}
		return nil
	})

	s := o.open()
	r, _ := s.Range("r1")
	if r.LogEnd() != 30 || r.LastEpoch() != 3 {
		t.Fatalf("LogEnd, LastEpoch = %d, %d; want 30, 3", r.LogEnd(), r.LastEpoch())
	}
	checkHistory(t, r, es(1, 0, 2, 10, 3, 20))
	checkConsistent(t, r)
	appendN(t, r, 3, 5) // a batch after the bare records
	waitDurable(t, r, 35)
	recs, err := r.Read(28, 0, 0)
	if err != nil || len(recs) != 7 {
		t.Fatalf("Read(28) across bare records and a batch = %d records, %v; want 7", len(recs), err)
	}
	for _, rec := range recs {
		if want := value("r1", rec.GetOffset()); !bytes.Equal(rec.GetValue(), want) {
			t.Errorf("record %d = %q, want %q", rec.GetOffset(), rec.GetValue(), want)
		}
	}
	if removed, err := r.Truncate(25); err != nil || removed != 10 {
		t.Fatalf("Truncate(25) = %d, %v; want 10", removed, err)
	}
	checkConsistent(t, r)
	closeStore(t, s)

	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	if r.LogEnd() != 25 {
		t.Fatalf("reopened: LogEnd() = %d, want 25", r.LogEnd())
	}
	checkConsistent(t, r)
}

// TestCleanReopenWarnsOfNothing reopens a cleanly closed store, whose
// synced-end marker is its log end and whose last stored batch ends there:
// nothing is cut or rebuilt, so nothing is logged above info.
func TestCleanReopenWarnsOfNothing(t *testing.T) {
	o := closedThreeEpochs(t)
	var logs testlog.Buffer
	o.opts.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	s := o.open()
	defer closeStore(t, s)
	r, _ := s.Range("r1")
	if r.LogEnd() != 30 || r.DurableEnd() != 30 {
		t.Fatalf("LogEnd, DurableEnd = %d, %d; want 30, 30", r.LogEnd(), r.DurableEnd())
	}
	if got := logs.String(); got != "" {
		t.Errorf("a clean reopen logged:\n%s", got)
	}
}
