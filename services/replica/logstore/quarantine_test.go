package logstore_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/dgraph-io/badger/v4"

	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/pkg/journal/journaltest"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// closedThreeRanges leaves a closed store with ranges r1, r2 and r3, each
// with history (1,0), (2,10), (3,20) and log end 30: log keys at 0, 1, 10,
// 11, 20 and 21 (an epoch-start record, then a batch of 9, per epoch), a
// synced marker of 30 (clean close) and HWM 30.
func closedThreeRanges(t *testing.T) *opener {
	o := newOpener(t)
	s := o.open()
	for _, id := range []string{"r1", "r2", "r3"} {
		r := mustRange(t, s, id)
		threeEpochs(t, r)
		if err := r.SetHWM(30); err != nil {
			t.Fatal(err)
		}
	}
	closeStore(t, s)
	return o
}

// TestOpenQuarantinesOneCorruptRange damages one range of three the way a
// disk does (bytes flipped in Badger or in the journal file, the store
// closed) and checks that Open opens: the damaged range is quarantined with
// its reason and refuses every read and write, the other two serve, and
// dropping the damaged one lets it be created afresh. Before quarantine,
// each of these damages failed Open for every range.
func TestOpenQuarantinesOneCorruptRange(t *testing.T) {
	for name, damage := range map[string]func(o *opener){
		"state": func(o *opener) {
			o.editDB(func(txn *badger.Txn) error { return flipValueByte(txn, []byte("s/r2")) })
		},
		"hwm": func(o *opener) {
			o.editDB(func(txn *badger.Txn) error { return flipValueByte(txn, []byte("h/r2")) })
		},
		"synced marker": func(o *opener) {
			o.editDB(func(txn *badger.Txn) error { return flipValueByte(txn, []byte("d/r2")) })
		},
		// Record 29, just below the synced marker 30, is in the batch
		// stored at 21: fsynced, so its damage is not a torn tail.
		"record below the synced marker": func(o *opener) {
			o.editDB(func(txn *badger.Txn) error { return flipValueByte(txn, logKey("r2", 21)) })
		},
		// A corrupt journal is rebuilt from the log's epochs; with a
		// record in the middle damaged too, the log cannot say what the
		// journal was.
		"journal and log": func(o *opener) {
			path := o.journalPath("r2")
			b, err := os.ReadFile(path)
			if err != nil {
				o.t.Fatal(err)
			}
			b[len(b)/2] ^= 0xff
			if err := os.WriteFile(path, b, 0o644); err != nil {
				o.t.Fatal(err)
			}
			o.editDB(func(txn *badger.Txn) error { return flipValueByte(txn, logKey("r2", 11)) })
		},
	} {
		t.Run(name, func(t *testing.T) {
			o := closedThreeRanges(t)
			damage(o)
			s, err := logstore.Open(o.dir, o.opts)
			if err != nil {
				t.Fatalf("Open with one damaged range = %v, want it to open the others", err)
			}
			// Closed below, then reopened: close whichever is open.
			defer func() { _ = s.Close() }()

			q := s.Quarantined()
			if len(q) != 1 || q["r2"] == nil {
				t.Fatalf("Quarantined() = %v, want r2 only", q)
			}
			if !errors.Is(q["r2"], logstore.ErrCorrupt) || !strings.Contains(q["r2"].Error(), "r2") {
				t.Fatalf("r2's reason = %v, want an ErrCorrupt naming the range", q["r2"])
			}
			if ids := s.RangeIDs(); len(ids) != 3 {
				t.Fatalf("RangeIDs() = %v, want all three (the quarantined one is listed)", ids)
			}

			r2, ok := s.Range("r2")
			if !ok || r2.Quarantined() == nil {
				t.Fatalf("Range(r2) = %v, %v; want the quarantined range", r2, ok)
			}
			// Never served silently: every read and write refuses.
			quarantined := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, logstore.ErrQuarantined) {
					t.Errorf("%s on the quarantined range = %v, want ErrQuarantined", what, err)
				}
			}
			_, err = r2.Read(0, 0, 0)
			quarantined("Read", err)
			_, err = r2.ReadTail(0, 0, 0)
			quarantined("ReadTail", err)
			_, err = r2.EpochAt(0)
			quarantined("EpochAt", err)
			_, err = r2.Append(4, false, [][]byte{[]byte("x")})
			quarantined("Append", err)
			quarantined("RecordEpoch", r2.RecordEpoch(4, 0))
			quarantined("SetHWM", r2.SetHWM(1))
			quarantined("SetState", r2.SetState(logstore.State{FencedEpoch: 9}))
			_, err = r2.Truncate(0)
			quarantined("Truncate", err)
			if h, end := r2.History(), r2.LogEnd(); len(h) != 0 || end != 0 {
				t.Errorf("quarantined range reports history %v, log end %d; want none", h, end)
			}

			for _, id := range []string{"r1", "r3"} {
				r, _ := s.Range(id)
				if r.Quarantined() != nil {
					t.Fatalf("%s quarantined: %v", id, r.Quarantined())
				}
				if r.LogEnd() != 30 || r.HWM() != 30 {
					t.Fatalf("%s: LogEnd, HWM = %d, %d; want 30, 30", id, r.LogEnd(), r.HWM())
				}
				checkHistory(t, r, es(1, 0, 2, 10, 3, 20))
				checkConsistent(t, r)
				lead(t, r, 4) // and it takes writes
				appendN(t, r, 4, 3)
			}

			// The way out: drop it; it is created afresh, empty.
			if existed, err := s.DropRange("r2"); err != nil || !existed {
				t.Fatalf("DropRange(r2) = %v, %v", existed, err)
			}
			r2 = mustRange(t, s, "r2")
			if r2.Quarantined() != nil || r2.LogEnd() != 0 {
				t.Fatalf("r2 created again: quarantined %v, log end %d", r2.Quarantined(), r2.LogEnd())
			}
			lead(t, r2, 5)
			waitDurable(t, r2, 1)
			closeStore(t, s)

			s = o.open()
			if q := s.Quarantined(); len(q) != 0 {
				t.Fatalf("after the drop and a reopen, Quarantined() = %v, want none", q)
			}
			r2, _ = s.Range("r2")
			checkHistory(t, r2, es(5, 0))
		})
	}
}

// TestQuarantinedRangeSurvivesReopen: a quarantined range stays as it was
// on disk across Open and Close (nothing writes its keys: no synced marker
// at Close, no HWM), so it is quarantined again, with the same reason,
// until it is dropped.
func TestQuarantinedRangeSurvivesReopen(t *testing.T) {
	o := closedThreeRanges(t)
	o.editDB(func(txn *badger.Txn) error { return flipValueByte(txn, logKey("r2", 21)) })
	s := o.open()
	first := s.Quarantined()["r2"]
	closeStore(t, s)
	s = o.open()
	defer closeStore(t, s)
	if got := s.Quarantined()["r2"]; got == nil || got.Error() != first.Error() {
		t.Fatalf("after reopen r2 is quarantined with %v, want %v", got, first)
	}
}

// TestOpenStillFailsOnIOErrors: an I/O error while a range loads is the
// disk failing, not that range's bytes: Open fails rather than quarantine
// ranges whose data may be fine.
func TestOpenStillFailsOnIOErrors(t *testing.T) {
	o := closedThreeRanges(t)
	ffs := journaltest.NewFaultFS(journal.OSFS{})
	ffs.SetInjector(func(op journaltest.Op, name string) error {
		if op == journaltest.OpRead && strings.HasSuffix(name, "r2.journal") {
			return journaltest.ErrInjected
		}
		return nil
	})
	o.opts.JournalFS = ffs
	s, err := logstore.Open(o.dir, o.opts)
	if err == nil {
		s.Close()
		t.Fatal("Open with a journal that cannot be read succeeded, want the I/O error")
	}
	if !errors.Is(err, journaltest.ErrInjected) {
		t.Fatalf("Open = %v, want the injected I/O error", err)
	}
}
