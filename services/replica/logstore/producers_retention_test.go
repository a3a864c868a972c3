package logstore_test

import (
	"errors"
	"testing"

	"github.com/tenurelog/tenure/services/replica/logstore"
)

// TestDedupeStateEndsAtTheLogStart: producers that come and go on a range
// with retention. The table kept every producer of the last ProducerWindow
// (a million) offsets however little the range kept, so a range keeping a
// few MiB held hundreds of thousands of producers that no record names any
// more; and it still knew them, where the table a restart rebuilds from the
// log (which starts at the log start) does not: two replicas of one range
// could decide the same append two ways.
// Now the table forgets the producers retention removed, holds at most one
// per record kept, and decides as the rebuilt one does.
func TestDedupeStateEndsAtTheLogStart(t *testing.T) {
	const producers, kept = 3000, 100
	o := newOpener(t)
	s := o.open()
	r := mustRange(t, s, "p")
	lead(t, r, 1)
	id := func(i int) logstore.ProducerID { return logstore.ProducerID{byte(i >> 8), byte(i), 1} }
	for i := range producers {
		if _, dup, err := produce(t, r, 1, logstore.ProducerAppend{ID: id(i)}, "v"); err != nil || dup {
			t.Fatalf("producer %d: first append = %v, %v", i, dup, err)
		}
	}
	end := r.LogEnd()
	waitDurable(t, r, end)
	if err := r.SetHWM(end); err != nil {
		t.Fatal(err)
	}
	if got, err := r.AdvanceLogStart(end - kept); err != nil || got != end-kept {
		t.Fatalf("AdvanceLogStart(%d) = %d, %v", end-kept, got, err)
	}
	if n := r.ProducerCount(); n > kept {
		t.Fatalf("dedupe table holds %d producers after retention kept %d records, want at most %d", n, kept, kept)
	}
	// A producer whose only record retention removed: unknown, as to the
	// table a reopen builds from the log.
	live := decide(t, r, id(0))
	kept0 := decide(t, r, id(producers-1))
	closeStore(t, s)
	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("p")
	if got := decide(t, r, id(0)); got != live {
		t.Fatalf("producer of a removed record: %q to the live table, %q after a reopen; want the same", live, got)
	}
	if got := decide(t, r, id(producers-1)); got != kept0 || got != "known" {
		t.Fatalf("producer of a kept record: %q by the live table, %q after a reopen; want known to both", kept0, got)
	}
}

// decide sends producer p's append at sequence 5, a gap after its one
// record, and says what the range made of it: refused as a gap by a range
// that knows p, refused as outside the window by one that does not. Both
// refuse, so the range is left as it was.
func decide(t *testing.T, r *logstore.Range, p logstore.ProducerID) string {
	t.Helper()
	_, _, err := produce(t, r, r.LastEpoch(), logstore.ProducerAppend{ID: p, FirstSeq: 5}, "v")
	switch {
	case errors.Is(err, logstore.ErrSequence):
		return "known"
	case errors.Is(err, logstore.ErrProducerWindow):
		return "unknown"
	}
	t.Fatalf("append at a gap = %v, want ErrSequence or ErrProducerWindow", err)
	return ""
}
