package logstore_test

import (
	"errors"
	"testing"

	"github.com/tenurelog/tenure/services/replica/logstore"
)

// appendAfterCutThenLosePower writes epoch 2 at the log end of r (cut to
// 5) and 6 records under it, waits for them to be durable, cuts the power
// and reopens: every record and the history must survive, as nothing
// synced Badger after the cut's intent was deleted (no SetState: its sync
// would make that delete durable, which the tests need not to happen).
func appendAfterCutThenLosePower(t *testing.T, o *opener, s *logstore.Store, r *logstore.Range) {
	t.Helper()
	lead(t, r, 2)
	appendN(t, r, 2, 6)
	end := r.AssignedEnd()
	waitDurable(t, r, end)
	want := readAll(t, r)
	wantHistory := r.History()
	losePower(t, s)

	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	if r.LogEnd() != end {
		t.Fatalf("LogEnd after the power loss = %d, want %d: records durable after the cut were cut again", r.LogEnd(), end)
	}
	sameRecords(t, "after the power loss", readAll(t, r), want)
	checkHistory(t, r, wantHistory)
	checkConsistent(t, r)
}

// A Truncate clears its intent, then the range takes new records, which
// are durable once in the WAL, with no Badger sync in between unless
// Truncate made one. A power loss may keep the WAL's new records and lose
// an unsynced delete of the intent (PowerLoss puts such an intent back);
// Open must not redo the finished cut over the records written after it.
func TestLostIntentClearDoesNotCutLaterRecords(t *testing.T) {
	o := newOpener(t)
	s := o.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	appendN(t, r, 1, 9)
	waitDurable(t, r, 10)
	if _, err := r.Truncate(5); err != nil {
		t.Fatalf("Truncate(5) = %v", err)
	}
	appendAfterCutThenLosePower(t, o, s, r)
}

// The same after a truncation Open redid: its delete of the intent must
// be durable before the range takes records that only the WAL makes
// durable.
func TestLostRedoIntentClearDoesNotCutLaterRecords(t *testing.T) {
	o := newOpener(t)
	crash := errors.New("crash")
	o.opts.CrashAt = func(p string) error {
		if p == logstore.CrashTruncateLog {
			return crash
		}
		return nil
	}
	s := o.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	appendN(t, r, 1, 9)
	waitDurable(t, r, 10)
	if _, err := r.Truncate(5); !errors.Is(err, crash) {
		t.Fatalf("Truncate(5) with a crash = %v, want the crash", err)
	}
	_ = s.Close()
	o.opts.CrashAt = nil

	s = o.open() // redoes the cut
	r, _ = s.Range("r1")
	if r.LogEnd() != 5 {
		t.Fatalf("LogEnd after the redo = %d, want 5", r.LogEnd())
	}
	appendAfterCutThenLosePower(t, o, s, r)
}
