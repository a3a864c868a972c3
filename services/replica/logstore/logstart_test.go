package logstore_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/dgraph-io/badger/v4"

	"github.com/tenurelog/tenure/pkg/journal"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// storedBases lists the offsets of range id's l/ keys (one per stored
// batch), read from Badger directly; the store must be closed.
func storedBases(t testing.TB, o *opener, id string) []uint64 {
	t.Helper()
	db := o.rawDB()
	defer db.Close()
	prefix := []byte("l/" + id + "/")
	var bases []uint64
	err := db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			bases = append(bases, binary.BigEndian.Uint64(it.Item().Key()[len(prefix):]))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return bases
}

// wantBelowStart checks that err is a refused read below log start start.
func wantBelowStart(t testing.TB, what string, err error, start uint64) {
	t.Helper()
	if !errors.Is(err, logstore.ErrBelowLogStart) || !errors.Is(err, logstore.ErrOutOfRange) ||
		!strings.Contains(err.Error(), fmt.Sprintf("log starts at %d", start)) {
		t.Fatalf("%s = %v, want ErrBelowLogStart (an ErrOutOfRange) naming the log start %d", what, err, start)
	}
}

// The log start rises to at most the HWM, never falls, refuses reads below
// it naming it, survives a reopen, and the batches wholly below it are
// deleted while the one straddling it stays.
func TestAdvanceLogStart(t *testing.T) {
	o := newOpener(t)
	s := o.open()
	r := mustRange(t, s, "r1")
	// Batches [0,1) [1,10) [10,11) [11,20) [20,21) [21,30).
	threeEpochs(t, r)
	if r.LogStart() != 0 {
		t.Fatalf("LogStart() of a new range = %d, want 0", r.LogStart())
	}
	if err := r.SetHWM(15); err != nil {
		t.Fatal(err)
	}
	// Only committed records go: clamped to the HWM.
	if got, err := r.AdvanceLogStart(25); err != nil || got != 15 {
		t.Fatalf("AdvanceLogStart(25) with HWM 15 = %d, %v; want 15", got, err)
	}
	if got, err := r.AdvanceLogStart(3); err != nil || got != 15 || r.LogStart() != 15 {
		t.Fatalf("AdvanceLogStart(3) after 15 = %d, %v (LogStart %d); want 15, never lowered", got, err, r.LogStart())
	}
	check := func(r *logstore.Range) {
		t.Helper()
		_, err := r.Read(14, 0, 0)
		wantBelowStart(t, "Read(14)", err, 15)
		_, err = r.Read(0, 0, 0)
		wantBelowStart(t, "Read(0)", err, 15)
		_, err = r.ReadTail(10, 0, 0)
		wantBelowStart(t, "ReadTail(10)", err, 15)
		_, err = r.EpochAt(14)
		wantBelowStart(t, "EpochAt(14)", err, 15)
		recs, err := r.Read(15, 0, 0)
		if err != nil || len(recs) != 15 || recs[0].GetOffset() != 15 || !bytes.Equal(recs[0].GetValue(), value("r1", 15)) {
			t.Fatalf("Read(15) = %d records, %v; want 15 from offset 15", len(recs), err)
		}
		if r.LogStart() != 15 || r.LogEnd() != 30 || r.HWM() != 15 || r.LastEpoch() != 3 {
			t.Fatalf("LogStart, LogEnd, HWM, LastEpoch = %d, %d, %d, %d; want 15, 30, 15, 3", r.LogStart(), r.LogEnd(), r.HWM(), r.LastEpoch())
		}
		// The entry in force at 14 (epoch 2 from 10) and every later one.
		checkHistory(t, r, es(2, 10, 3, 20))
		checkConsistent(t, r)
	}
	check(r)
	closeStore(t, s)
	// The batch [11,20) straddles 15 and stays; those below it are gone.
	if got, want := storedBases(t, o, "r1"), []uint64{11, 20, 21}; !slices.Equal(got, want) {
		t.Fatalf("stored batches after the advance = %v, want %v", got, want)
	}
	s = o.open()
	defer func() { closeStore(t, s) }()
	r, _ = s.Range("r1")
	check(r)
	// The log goes on; the next advance past the straddling batch removes it.
	appendN(t, r, 3, 5)
	if err := r.SetHWM(35); err != nil {
		t.Fatal(err)
	}
	waitDurable(t, r, 35)
	if got, err := r.AdvanceLogStart(math.MaxUint64); err != nil || got != 35 {
		t.Fatalf("AdvanceLogStart(max) = %d, %v; want the HWM 35", got, err)
	}
	// Emptied by retention: the last epoch is still known, after a
	// reopen too, and a new leadership starts at the log end.
	emptied := func(r *logstore.Range) {
		t.Helper()
		if r.LogStart() != 35 || r.LogEnd() != 35 || r.LastEpoch() != 3 {
			t.Fatalf("LogStart, LogEnd, LastEpoch = %d, %d, %d; want 35, 35, 3", r.LogStart(), r.LogEnd(), r.LastEpoch())
		}
		checkHistory(t, r, es(3, 20))
	}
	emptied(r)
	closeStore(t, s)
	s = o.open()
	r, _ = s.Range("r1")
	emptied(r)
	lead(t, r, 4)
	checkHistory(t, r, es(3, 20, 4, 35))
	checkConsistent(t, r)
}

// The start never passes what is durable here: a power loss must not take
// records at or above a persisted start.
func TestAdvanceLogStartStopsAtDurableEnd(t *testing.T) {
	o := newOpener(t)
	s := o.open()
	defer closeStore(t, s)
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	appendN(t, r, 1, 9)
	waitDurable(t, r, 10)
	if err := r.SetHWM(10); err != nil {
		t.Fatal(err)
	}
	if got, err := r.AdvanceLogStart(100); err != nil || got != min(10, r.DurableEnd()) {
		t.Fatalf("AdvanceLogStart(100) = %d, %v; want min(HWM, DurableEnd) = 10", got, err)
	}
}

// A crash at each step of an advance, then Open: the start persisted first
// holds, the journal is trimmed and the batches below the start deleted,
// and the range serves and takes records.
func TestAdvanceLogStartCrashIsFinishedOnOpen(t *testing.T) {
	defer logstore.SetDeleteChunk(1)() // a crash between two deletions
	for _, point := range []string{logstore.CrashAdvanceStart, logstore.CrashAdvanceJournal, logstore.CrashAdvanceLog} {
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
			if err := r.SetHWM(25); err != nil {
				t.Fatal(err)
			}
			if _, err := r.AdvanceLogStart(25); !errors.Is(err, crash) || !errors.Is(err, logstore.ErrFailed) {
				t.Fatalf("AdvanceLogStart(25) with a crash at %s = %v, want the crash, ErrFailed", point, err)
			}
			losePower(t, s)

			o.opts.CrashAt = nil
			s = o.open()
			r, _ = s.Range("r1")
			if r.LogStart() != 25 || r.LogEnd() != 30 || r.HWM() < 25 || r.LastEpoch() != 3 {
				t.Fatalf("after the crash: LogStart, LogEnd, HWM, LastEpoch = %d, %d, %d, %d; want 25, 30, >= 25, 3", r.LogStart(), r.LogEnd(), r.HWM(), r.LastEpoch())
			}
			checkHistory(t, r, es(3, 20))
			checkConsistent(t, r)
			_, err := r.Read(24, 0, 0)
			wantBelowStart(t, "Read(24)", err, 25)
			appendN(t, r, 3, 2)
			closeStore(t, s)
			// [21,30) straddles 25; everything below it is gone.
			if got, want := storedBases(t, o, "r1"), []uint64{21, 30}; !slices.Equal(got, want) {
				t.Fatalf("stored batches after the redo = %v, want %v", got, want)
			}
		})
	}
}

// Batches still waiting for the index when the start passes them are
// indexed first and then deleted (no later index commit writes them back),
// and a WAL replay after a power loss does not bring them back either.
func TestAdvanceLogStartOverUnindexedBatches(t *testing.T) {
	defer logstore.HoldIndex()()
	for _, powerLoss := range []bool{false, true} {
		t.Run(fmt.Sprintf("power loss %v", powerLoss), func(t *testing.T) {
			o := newOpener(t)
			s := o.open()
			r := mustRange(t, s, "r1")
			threeEpochs(t, r) // held unindexed, in the WAL only
			if err := r.SetHWM(30); err != nil {
				t.Fatal(err)
			}
			if got, err := r.AdvanceLogStart(21); err != nil || got != 21 {
				t.Fatalf("AdvanceLogStart(21) = %d, %v", got, err)
			}
			appendN(t, r, 3, 3)
			waitDurable(t, r, 33)
			if powerLoss {
				losePower(t, s)
				s = o.open()
				r, _ = s.Range("r1")
				if r.LogStart() != 21 || r.LogEnd() != 33 {
					t.Fatalf("after the power loss: LogStart, LogEnd = %d, %d; want 21, 33", r.LogStart(), r.LogEnd())
				}
				checkConsistent(t, r)
			} else if err := s.IndexNow(); err != nil {
				t.Fatal(err)
			}
			closeStore(t, s)
			if got, want := storedBases(t, o, "r1"), []uint64{21, 30}; !slices.Equal(got, want) {
				t.Fatalf("stored batches = %v, want %v", got, want)
			}
		})
	}
}

// Appends, reads and advances at once: a read either succeeds or is
// refused below the log start, never reports a missing record.
func TestAdvanceLogStartConcurrentWithReadsAndAppends(t *testing.T) {
	o := newOpener(t)
	s := o.open()
	defer closeStore(t, s)
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	const batches = 100
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errc := make(chan error, 2)
	wg.Go(func() {
		for range 2000 {
			select {
			case <-stop:
				return
			default:
			}
			from := r.LogStart()
			if _, err := r.Read(from, 0, 0); err != nil && !errors.Is(err, logstore.ErrBelowLogStart) {
				errc <- fmt.Errorf("Read(%d) = %w", from, err)
				return
			}
		}
	})
	wg.Go(func() {
		for range 2000 {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := r.AdvanceLogStart(r.HWM()); err != nil {
				errc <- fmt.Errorf("AdvanceLogStart = %w", err)
				return
			}
		}
	})
	for range batches {
		appendN(t, r, 1, 3)
		if err := r.SetHWM(r.DurableEnd()); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-errc:
		t.Fatal(err)
	default:
	}
	waitDurable(t, r, r.LogEnd())
	if err := r.SetHWM(r.LogEnd()); err != nil {
		t.Fatal(err)
	}
	if _, err := r.AdvanceLogStart(r.LogEnd() - 1); err != nil {
		t.Fatal(err)
	}
	checkConsistent(t, r)
}

// Truncate after an advance never cuts below the log start, and a cut
// exactly at it leaves an empty log whose last epoch the journal keeps.
func TestTruncateAfterAdvanceLogStart(t *testing.T) {
	o := newOpener(t)
	s := o.open()
	r := mustRange(t, s, "r1")
	threeEpochs(t, r)
	if err := r.SetHWM(15); err != nil {
		t.Fatal(err)
	}
	if _, err := r.AdvanceLogStart(15); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Truncate(14); !errors.Is(err, logstore.ErrBelowHWM) {
		t.Fatalf("Truncate(14) below the log start 15 = %v, want ErrBelowHWM", err)
	}
	if n, err := r.Truncate(15); err != nil || n != 15 {
		t.Fatalf("Truncate(15) = %d, %v; want 15 removed", n, err)
	}
	want := func(r *logstore.Range) {
		t.Helper()
		if r.LogStart() != 15 || r.LogEnd() != 15 || r.LastEpoch() != 2 {
			t.Fatalf("LogStart, LogEnd, LastEpoch = %d, %d, %d; want 15, 15, 2", r.LogStart(), r.LogEnd(), r.LastEpoch())
		}
		checkHistory(t, r, es(2, 10))
	}
	want(r)
	closeStore(t, s)
	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	want(r)
	if err := r.AppendRecords([]*tenurev1.Record{rec(15, 4, true, ""), rec(16, 4, false, "x")}); err != nil {
		t.Fatalf("AppendRecords at the log start = %v", err)
	}
	checkHistory(t, r, es(2, 10, 4, 15))
	checkConsistent(t, r)
}

// DropRange after an advance removes the start too: the id created again
// starts at 0.
func TestDropRangeAfterAdvanceLogStart(t *testing.T) {
	o := newOpener(t)
	s := o.open()
	r := mustRange(t, s, "r1")
	threeEpochs(t, r)
	if err := r.SetHWM(20); err != nil {
		t.Fatal(err)
	}
	if _, err := r.AdvanceLogStart(20); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.DropRange("r1"); !ok || err != nil {
		t.Fatalf("DropRange = %v, %v", ok, err)
	}
	if _, err := r.AdvanceLogStart(25); !errors.Is(err, logstore.ErrDropped) {
		t.Fatalf("AdvanceLogStart on a dropped range = %v, want ErrDropped", err)
	}
	r = mustRange(t, s, "r1")
	if r.LogStart() != 0 || r.LogEnd() != 0 {
		t.Fatalf("recreated range: LogStart, LogEnd = %d, %d; want 0, 0", r.LogStart(), r.LogEnd())
	}
	closeStore(t, s)
	if got := storedBases(t, o, "r1"); len(got) != 0 {
		t.Fatalf("stored batches after the drop = %v, want none", got)
	}
	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	if r.LogStart() != 0 {
		t.Fatalf("recreated range after reopen: LogStart = %d, want 0", r.LogStart())
	}
	lead(t, r, 1)
	checkConsistent(t, r)
}

// follower10 is a follower's log of 10 records, epochs 1 then 2 from 6,
// with HWM 5.
func follower10(t testing.TB, r *logstore.Range) {
	t.Helper()
	var recs []*tenurev1.Record
	for i := range uint64(10) {
		e := uint64(1)
		if i >= 6 {
			e = 2
		}
		if i == 0 || i == 6 {
			recs = append(recs, rec(i, e, true, ""))
		} else {
			recs = append(recs, rec(i, e, false, "v"))
		}
	}
	if err := r.AppendRecords(recs); err != nil {
		t.Fatal(err)
	}
	waitDurable(t, r, 10)
	if err := r.SetHWM(5); err != nil {
		t.Fatal(err)
	}
}

// ResetTo discards a follower's log wholly below the leader's log start:
// after it the log is empty at the start, appends resume there, and a
// reopen finds the same.
func TestResetTo(t *testing.T) {
	o := newOpener(t)
	s := o.open()
	r := mustRange(t, s, "r1")
	follower10(t, r)
	if err := r.ResetTo(8); !errors.Is(err, logstore.ErrInvalid) {
		t.Fatalf("ResetTo(8) with log end 10 = %v, want ErrInvalid", err)
	}
	if err := r.SetHWM(10); err != nil {
		t.Fatal(err)
	}
	if err := r.ResetTo(10); err != nil {
		t.Fatalf("ResetTo(10) at the log end = %v", err)
	}
	// (A HWM above the start is refused too; with HWM <= LogEnd that is
	// covered by the log-end check.)
	if err := r.ResetTo(40); err != nil {
		t.Fatalf("ResetTo(40) = %v", err)
	}
	empty := func(r *logstore.Range) {
		t.Helper()
		if r.LogStart() != 40 || r.LogEnd() != 40 || r.HWM() != 40 || r.DurableEnd() != 40 || r.LastEpoch() != 0 {
			t.Fatalf("after ResetTo(40): LogStart, LogEnd, HWM, DurableEnd, LastEpoch = %d, %d, %d, %d, %d; want 40, 40, 40, 40, 0",
				r.LogStart(), r.LogEnd(), r.HWM(), r.DurableEnd(), r.LastEpoch())
		}
		checkHistory(t, r, nil)
		_, err := r.Read(39, 0, 0)
		wantBelowStart(t, "Read(39)", err, 40)
		if recs, err := r.Read(40, 0, 0); err != nil || len(recs) != 0 {
			t.Fatalf("Read(40) of the empty log = %v, %v", recs, err)
		}
	}
	empty(r)
	closeStore(t, s)
	if got := storedBases(t, o, "r1"); len(got) != 0 {
		t.Fatalf("stored batches after ResetTo = %v, want none", got)
	}
	s = o.open()
	r, _ = s.Range("r1")
	empty(r)
	// The leader's next records, at its log start, under its epoch.
	if err := r.AppendRecords([]*tenurev1.Record{rec(40, 3, false, "a"), rec(41, 3, false, "b")}); err != nil {
		t.Fatalf("AppendRecords at the reset start = %v", err)
	}
	checkHistory(t, r, es(3, 40))
	waitDurable(t, r, 42)
	checkConsistent(t, r)
	// A second reset must not discard what it holds.
	if err := r.ResetTo(41); !errors.Is(err, logstore.ErrInvalid) {
		t.Fatalf("ResetTo(41) with log end 42 = %v, want ErrInvalid", err)
	}
	losePower(t, s)
	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	if r.LogStart() != 40 || r.LogEnd() != 42 || r.LastEpoch() != 3 {
		t.Fatalf("after reopen: LogStart, LogEnd, LastEpoch = %d, %d, %d; want 40, 42, 3", r.LogStart(), r.LogEnd(), r.LastEpoch())
	}
	checkHistory(t, r, es(3, 40))
	checkConsistent(t, r)
}

// A crash at each step of ResetTo, then Open: the old log whole (before
// the start is persisted) or the empty log at the start (after), never a
// mix; either way the range takes records.
func TestResetToCrashIsConsistent(t *testing.T) {
	for _, point := range []string{logstore.CrashResetJournal, logstore.CrashResetStart, logstore.CrashResetLog} {
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
			follower10(t, r)
			if err := r.ResetTo(40); !errors.Is(err, crash) {
				t.Fatalf("ResetTo(40) with a crash at %s = %v, want the crash", point, err)
			}
			losePower(t, s)
			o.opts.CrashAt = nil
			s = o.open()
			defer closeStore(t, s)
			r, _ = s.Range("r1")
			checkConsistent(t, r)
			if point == logstore.CrashResetJournal {
				// Not reset: the old log, its journal rebuilt from it.
				if r.LogStart() != 0 || r.LogEnd() != 10 {
					t.Fatalf("LogStart, LogEnd = %d, %d; want the old 0, 10", r.LogStart(), r.LogEnd())
				}
				checkHistory(t, r, es(1, 0, 2, 6))
				if err := r.ResetTo(40); err != nil {
					t.Fatalf("ResetTo(40) again = %v", err)
				}
			}
			if r.LogStart() != 40 || r.LogEnd() != 40 || r.HWM() != 40 || r.LastEpoch() != 0 {
				t.Fatalf("LogStart, LogEnd, HWM, LastEpoch = %d, %d, %d, %d; want 40, 40, 40, 0", r.LogStart(), r.LogEnd(), r.HWM(), r.LastEpoch())
			}
			checkHistory(t, r, nil)
			if err := r.AppendRecords([]*tenurev1.Record{rec(40, 3, false, "a")}); err != nil {
				t.Fatalf("AppendRecords at the reset start = %v", err)
			}
			checkHistory(t, r, es(3, 40))
		})
	}
}

// Two replicas holding the same log from different log starts agree on
// their divergence, before and after one rebuilds its journal from the
// records it has left, and find the point where their tails part.
func TestDivergenceWithDifferentLogStarts(t *testing.T) {
	// The leader's log: epoch 1 [0,10), epoch 2 [10,20), epoch 3 [20,30),
	// fetched by both in batches of 5.
	var log []*tenurev1.Record
	for i := range uint64(30) {
		e := 1 + i/10
		if i%10 == 0 {
			log = append(log, rec(i, e, true, ""))
		} else {
			log = append(log, rec(i, e, false, fmt.Sprint(i)))
		}
	}
	replica := func(start uint64) (*opener, *logstore.Store, *logstore.Range) {
		o := newOpener(t)
		s := o.open()
		r := mustRange(t, s, "r1")
		for i := 0; i < len(log); i += 5 {
			if err := r.AppendRecords(log[i : i+5]); err != nil {
				t.Fatal(err)
			}
		}
		waitDurable(t, r, 30)
		if err := r.SetHWM(30); err != nil {
			t.Fatal(err)
		}
		if got, err := r.AdvanceLogStart(start); err != nil || got != start {
			t.Fatalf("AdvanceLogStart(%d) = %d, %v", start, got, err)
		}
		return o, s, r
	}
	_, sa, a := replica(12)
	defer func() { closeStore(t, sa) }()
	ob, sb, b := replica(25)
	_, sc, c := replica(0) // never trimmed
	defer closeStore(t, sc)
	checkHistory(t, a, es(2, 10, 3, 20))
	checkHistory(t, b, es(3, 20))
	checkHistory(t, c, es(1, 0, 2, 10, 3, 20))

	agree := func(what string) {
		t.Helper()
		for _, pair := range [][2]*logstore.Range{{a, b}, {b, a}, {a, c}, {c, b}} {
			if p, ok := journal.DivergencePoint(pair[0].History(), pair[1].History()); !ok || p != math.MaxUint64 {
				t.Fatalf("%s: DivergencePoint(%v, %v) = %d, %v; want none", what, pair[0].History(), pair[1].History(), p, ok)
			}
		}
		// A follower at 30 with epoch 3, checked against each as leader.
		for _, r := range []*logstore.Range{a, b, c} {
			if e, end, ok := journal.EndOffsetFor(r.History(), 3, r.LogEnd()); !ok || e != 3 || end != 30 {
				t.Fatalf("%s: EndOffsetFor(%v, 3) = %d, %d, %v; want 3, 30", what, r.History(), e, end, ok)
			}
		}
		// A follower at b's log start sends the epoch of record 24.
		if e, end, ok := journal.EndOffsetFor(b.History(), 3, b.LogEnd()); !ok || e != 3 || end < 25 {
			t.Fatalf("%s: EndOffsetFor(b, 3) = %d, %d, %v", what, e, end, ok)
		}
	}
	agree("trimmed")

	// b loses its journal; Open rebuilds it from the records from 25.
	closeStore(t, sb)
	if err := os.Remove(ob.journalPath("r1")); err != nil {
		t.Fatal(err)
	}
	sb = ob.open()
	defer func() { closeStore(t, sb) }()
	b, _ = sb.Range("r1")
	if h := b.History(); len(h) != 1 || h[0].Epoch != 3 || h[0].Start < 20 || h[0].Start > 25 {
		t.Fatalf("rebuilt history = %v, want epoch 3 from the records left", h)
	}
	checkConsistent(t, b)
	agree("rebuilt")

	// Their tails part: a takes epoch 4 at 30, b epoch 5 at 30.
	if err := a.AppendRecords([]*tenurev1.Record{rec(30, 4, true, ""), rec(31, 4, false, "a")}); err != nil {
		t.Fatal(err)
	}
	if err := b.AppendRecords([]*tenurev1.Record{rec(30, 5, true, ""), rec(31, 5, false, "b")}); err != nil {
		t.Fatal(err)
	}
	for _, pair := range [][2]*logstore.Range{{a, b}, {b, a}} {
		if p, ok := journal.DivergencePoint(pair[0].History(), pair[1].History()); !ok || p != 30 {
			t.Fatalf("DivergencePoint(%v, %v) = %d, %v; want 30", pair[0].History(), pair[1].History(), p, ok)
		}
	}
}

// A truncation that crashed above an advanced log start is redone at Open
// without touching the start.
func TestTruncateCrashAfterAdvanceLogStart(t *testing.T) {
	o := newOpener(t)
	crash := errors.New("power cut")
	o.opts.CrashAt = func(p string) error {
		if p == logstore.CrashTruncateLog {
			return crash
		}
		return nil
	}
	s := o.open()
	r := mustRange(t, s, "r1")
	threeEpochs(t, r)
	if err := r.SetHWM(12); err != nil {
		t.Fatal(err)
	}
	if _, err := r.AdvanceLogStart(12); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Truncate(15); !errors.Is(err, crash) {
		t.Fatalf("Truncate(15) with a crash = %v, want the crash", err)
	}
	losePower(t, s)
	o.opts.CrashAt = nil
	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	if r.LogStart() != 12 || r.LogEnd() != 15 || r.LastEpoch() != 2 {
		t.Fatalf("LogStart, LogEnd, LastEpoch = %d, %d, %d; want 12, 15, 2", r.LogStart(), r.LogEnd(), r.LastEpoch())
	}
	checkHistory(t, r, es(2, 10))
	checkConsistent(t, r)
}
