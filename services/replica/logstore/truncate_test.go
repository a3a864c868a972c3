package logstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// threeEpochs builds a log with history (1,0), (2,10), (3,20) and log end 30.
func threeEpochs(t testing.TB, r *logstore.Range) {
	t.Helper()
	for _, e := range []uint64{1, 2, 3} {
		lead(t, r, e)
		appendN(t, r, e, 9)
	}
	checkHistory(t, r, es(1, 0, 2, 10, 3, 20))
	waitDurable(t, r, 30)
}

func TestTruncate(t *testing.T) {
	o := newOpener(t)
	s := o.open()
	r := mustRange(t, s, "r1")
	threeEpochs(t, r)
	if err := r.SetHWM(5); err != nil {
		t.Fatal(err)
	}

	removed, err := r.Truncate(25)
	if err != nil || removed != 5 {
		t.Fatalf("Truncate(25) = %d, %v; want 5", removed, err)
	}
	if r.LogEnd() != 25 || r.DurableEnd() != 25 || r.LastEpoch() != 3 {
		t.Fatalf("after Truncate(25): LogEnd, DurableEnd, LastEpoch = %d, %d, %d; want 25, 25, 3", r.LogEnd(), r.DurableEnd(), r.LastEpoch())
	}
	checkHistory(t, r, es(1, 0, 2, 10, 3, 20))

	// Cutting exactly at an epoch's start removes the epoch's entry.
	if removed, err = r.Truncate(20); err != nil || removed != 5 {
		t.Fatalf("Truncate(20) = %d, %v; want 5", removed, err)
	}
	checkHistory(t, r, es(1, 0, 2, 10))
	if r.LastEpoch() != 2 {
		t.Fatalf("LastEpoch() = %d, want 2", r.LastEpoch())
	}
	checkConsistent(t, r)

	// At or beyond the log end nothing is removed.
	if removed, err = r.Truncate(40); err != nil || removed != 0 || r.LogEnd() != 20 {
		t.Fatalf("Truncate(40) = %d, %v, LogEnd %d; want 0, nil, 20", removed, err, r.LogEnd())
	}

	// Below the HWM is refused, naming both offsets.
	_, err = r.Truncate(3)
	if !errors.Is(err, logstore.ErrBelowHWM) || !strings.Contains(err.Error(), "Truncate(3)") || !strings.Contains(err.Error(), "high-water mark is 5") {
		t.Fatalf("Truncate(3) below HWM 5 = %v, want ErrBelowHWM naming 3 and 5", err)
	}
	if r.LogEnd() != 20 {
		t.Fatalf("a refused truncation changed the log: LogEnd() = %d", r.LogEnd())
	}
	// At the HWM is fine.
	if removed, err = r.Truncate(5); err != nil || removed != 15 {
		t.Fatalf("Truncate(5) = %d, %v; want 15", removed, err)
	}
	checkHistory(t, r, es(1, 0))

	// The log continues at the cut under a new epoch, as a follower would.
	if err := r.AppendRecords([]*tenurev1.Record{rec(5, 4, true, ""), rec(6, 4, false, "new")}); err != nil {
		t.Fatalf("AppendRecords after truncation = %v", err)
	}
	checkHistory(t, r, es(1, 0, 4, 5))
	closeStore(t, s)

	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	if r.LogEnd() != 7 || r.HWM() != 5 {
		t.Fatalf("after reopen: LogEnd, HWM = %d, %d; want 7, 5", r.LogEnd(), r.HWM())
	}
	checkHistory(t, r, es(1, 0, 4, 5))
	checkConsistent(t, r)
}

func TestTruncateRemovesEpochThatWroteNothing(t *testing.T) {
	s := newOpener(t).open()
	defer closeStore(t, s)
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	appendN(t, r, 1, 3)
	// Journaled at the log end, then fenced before its start record.
	if err := r.RecordEpoch(2, 4); err != nil {
		t.Fatal(err)
	}
	if removed, err := r.Truncate(4); err != nil || removed != 0 {
		t.Fatalf("Truncate(4) = %d, %v; want 0, nil", removed, err)
	}
	checkHistory(t, r, es(1, 0))
}

func TestWaitDurableSeesTruncation(t *testing.T) {
	s := newOpener(t).open()
	defer closeStore(t, s)
	r := mustRange(t, s, "r1")
	threeEpochs(t, r)
	errc := make(chan error, 1)
	go func() { errc <- r.WaitDurable(context.Background(), 40) }()
	time.Sleep(10 * time.Millisecond) // let it wait; the result is the same if not
	if _, err := r.Truncate(25); err != nil {
		t.Fatal(err)
	}
	// New records now fill offsets up to and past 40; they are not the
	// records the waiter waited for.
	lead(t, r, 4)
	appendN(t, r, 4, 20)
	select {
	case err := <-errc:
		if !errors.Is(err, logstore.ErrTruncated) {
			t.Fatalf("WaitDurable(40) across Truncate(25) = %v, want ErrTruncated", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitDurable did not return")
	}
}

func TestTruncateCrashIsRedoneOnOpen(t *testing.T) {
	for _, point := range []string{logstore.CrashTruncateIntent, logstore.CrashTruncateJournal, logstore.CrashTruncateLog} {
		t.Run(point, func(t *testing.T) {
			o := newOpener(t)
			crash := errors.New("power cut")
			o.opts.CrashAt = func(p string) error {
				if p == point {
					return crash
				}
				return nil
			}
			s := o.open()
			r := mustRange(t, s, "r1")
			threeEpochs(t, r)

			if _, err := r.Truncate(15); !errors.Is(err, crash) || !errors.Is(err, logstore.ErrFailed) {
				t.Fatalf("Truncate(15) with a crash at %s = %v, want the crash, ErrFailed", point, err)
			}
			// A crashed store refuses writes until reopened.
			if _, err := r.Append(3, false, [][]byte{[]byte("x")}); !errors.Is(err, logstore.ErrFailed) {
				t.Fatalf("Append after the crash = %v, want ErrFailed", err)
			}
			if err := r.SetState(logstore.State{FencedEpoch: 9}); !errors.Is(err, logstore.ErrFailed) {
				t.Fatalf("SetState after the crash = %v, want ErrFailed", err)
			}
			if err := s.Close(); err != nil {
				t.Fatalf("Close after the crash = %v", err)
			}

			o.opts.CrashAt = nil
			s = o.open()
			defer closeStore(t, s)
			r, _ = s.Range("r1")
			if r.LogEnd() != 15 || r.LastEpoch() != 2 {
				t.Fatalf("after redo: LogEnd, LastEpoch = %d, %d; want 15, 2", r.LogEnd(), r.LastEpoch())
			}
			checkHistory(t, r, es(1, 0, 2, 10))
			checkConsistent(t, r)
			// The redo finished the job: the range is writable from the cut.
			if err := r.AppendRecords([]*tenurev1.Record{rec(15, 4, true, "")}); err != nil {
				t.Fatalf("AppendRecords at the cut = %v", err)
			}
			checkHistory(t, r, es(1, 0, 2, 10, 4, 15))
		})
	}
}

func TestAppendJournalCrash(t *testing.T) {
	o := newOpener(t)
	crashed := false
	o.opts.CrashAt = func(p string) error {
		if p == logstore.CrashAppendJournal && !crashed {
			crashed = true
			return fmt.Errorf("power cut")
		}
		return nil
	}
	s := o.open()
	r := mustRange(t, s, "r1")
	if err := r.AppendRecords([]*tenurev1.Record{rec(0, 1, true, ""), rec(1, 1, false, "a")}); !errors.Is(err, logstore.ErrFailed) {
		t.Fatalf("AppendRecords with a crash after journaling = %v, want ErrFailed", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	// The entry was fsynced before the records were written: it survives,
	// starting at the log end, and claims no record.
	if r.LogEnd() != 0 {
		t.Fatalf("LogEnd() = %d, want 0", r.LogEnd())
	}
	checkHistory(t, r, es(1, 0))
	// The fetch is retried: the same epoch at the same offset is no change.
	if err := r.AppendRecords([]*tenurev1.Record{rec(0, 1, true, ""), rec(1, 1, false, "a")}); err != nil {
		t.Fatalf("AppendRecords retried = %v", err)
	}
	checkHistory(t, r, es(1, 0))
	checkConsistent(t, r)
}
