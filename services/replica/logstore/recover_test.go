package logstore_test

import (
	"errors"
	"os"
	"testing"

	"github.com/dgraph-io/badger/v4"

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

func TestOpenCutsUnsyncedTailAtFirstHole(t *testing.T) {
	o := closedThreeEpochs(t)
	// What a power loss can leave: the marker says records below 12 were
	// synced; record 15 was lost while later ones survived. The HWM had been
	// persisted at 25, counting records this replica no longer holds.
	o.editDB(func(txn *badger.Txn) error {
		if err := txn.Set([]byte("d/r1"), u64Value("d/r1", 12)); err != nil {
			return err
		}
		if err := txn.Set([]byte("h/r1"), u64Value("h/r1", 25)); err != nil {
			return err
		}
		return txn.Delete(logKey("r1", 15))
	})
	s := o.open()
	r, _ := s.Range("r1")
	if r.LogEnd() != 15 || r.DurableEnd() != 15 || r.LastEpoch() != 2 {
		t.Fatalf("LogEnd, DurableEnd, LastEpoch = %d, %d, %d; want 15, 15, 2", r.LogEnd(), r.DurableEnd(), r.LastEpoch())
	}
	if r.HWM() != 15 {
		t.Fatalf("HWM() = %d, want it lowered to the log end 15", r.HWM())
	}
	// Epoch 3 started at 20, beyond the recovered end: its entry goes.
	checkHistory(t, r, es(1, 0, 2, 10))
	checkConsistent(t, r)
	closeStore(t, s)

	// The cut is durable: the records above the hole do not come back.
	o.editDB(func(txn *badger.Txn) error {
		_, err := txn.Get(logKey("r1", 16))
		if !errors.Is(err, badger.ErrKeyNotFound) {
			t.Errorf("record 16 above the hole still stored: %v", err)
		}
		return nil
	})
	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	if r.LogEnd() != 15 || r.HWM() != 15 {
		t.Fatalf("second reopen: LogEnd, HWM = %d, %d; want 15, 15", r.LogEnd(), r.HWM())
	}
}

func TestOpenCutsTornRecordAboveSyncedMarker(t *testing.T) {
	o := closedThreeEpochs(t)
	o.editDB(func(txn *badger.Txn) error {
		if err := txn.Set([]byte("d/r1"), u64Value("d/r1", 12)); err != nil {
			return err
		}
		return flipValueByte(txn, logKey("r1", 17))
	})
	s := o.open()
	defer closeStore(t, s)
	r, _ := s.Range("r1")
	if r.LogEnd() != 17 {
		t.Fatalf("LogEnd() = %d, want 17 (cut at the torn record)", r.LogEnd())
	}
	checkConsistent(t, r)
}

func TestReadVerifiesChecksums(t *testing.T) {
	o := closedThreeEpochs(t)
	o.editDB(func(txn *badger.Txn) error {
		// Below the synced marker: damage, not a torn tail.
		if err := txn.Set([]byte("d/r1"), u64Value("d/r1", 30)); err != nil {
			return err
		}
		return flipValueByte(txn, logKey("r1", 5))
	})
	s := o.open()
	defer closeStore(t, s)
	r, _ := s.Range("r1")
	if _, err := r.Read(0, 0, 0); !errors.Is(err, logstore.ErrCorrupt) {
		t.Fatalf("Read over a flipped byte = %v, want ErrCorrupt", err)
	}
	if _, err := r.Read(3, 2, 0); err != nil {
		t.Fatalf("Read(3, 2) below the damage = %v", err)
	}
	if _, err := r.EpochAt(5); !errors.Is(err, logstore.ErrCorrupt) {
		t.Fatalf("EpochAt(5) = %v, want ErrCorrupt", err)
	}
}

func TestRecordUnderAnotherKeyFailsChecksum(t *testing.T) {
	o := closedThreeEpochs(t)
	// A record moved to another offset (same epoch, same shape) is caught:
	// the checksum covers the key.
	o.editDB(func(txn *badger.Txn) error {
		item, err := txn.Get(logKey("r1", 3))
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
}

func TestOpenRefusesCorruptState(t *testing.T) {
	o := closedThreeEpochs(t)
	o.editDB(func(txn *badger.Txn) error { return flipValueByte(txn, []byte("s/r1")) })
	s, err := logstore.Open(o.dir, o.opts)
	if !errors.Is(err, logstore.ErrCorrupt) {
		if err == nil {
			s.Close()
		}
		t.Fatalf("Open with a corrupt state = %v, want ErrCorrupt: a fence that cannot be read cannot be kept", err)
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
