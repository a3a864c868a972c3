package logstore_test

import (
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/tenurelog/tenure/services/replica/logstore"
)

// twoRanges makes r1 and r2 with 9 records each after their epoch-start
// records, durable.
func twoRanges(t *testing.T, s *logstore.Store) (r1, r2 *logstore.Range) {
	t.Helper()
	r1, r2 = mustRange(t, s, "r1"), mustRange(t, s, "r2")
	for _, r := range []*logstore.Range{r1, r2} {
		lead(t, r, 1)
		appendN(t, r, 1, 9)
		waitDurable(t, r, 10)
		if err := r.SetHWM(10); err != nil {
			t.Fatal(err)
		}
	}
	return r1, r2
}

// checkDropped checks that o's closed store holds no key of range id and
// no journal of it, and that r2 is whole: 10 records, HWM and history.
func checkDropped(t *testing.T, o *opener, id string) {
	t.Helper()
	db := o.rawDB()
	err := db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.DefaultIteratorOptions)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := string(it.Item().Key())
			if strings.HasSuffix(k, "/"+id) || strings.Contains(k, "/"+id+"/") {
				t.Errorf("key %q of the dropped range %s is still stored", k, id)
			}
		}
		return nil
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(o.journalPath(id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("journal of the dropped range %s: stat = %v, want it gone", id, err)
	}
}

// reopenAfterDrop reopens o's store and checks that r1 is gone, r2 whole,
// and r1 created again is empty. After a crash r2's HWM may lag (it is
// persisted lazily); after a clean close it may not.
func reopenAfterDrop(t *testing.T, o *opener, clean bool) {
	t.Helper()
	s := o.open()
	defer closeStore(t, s)
	if ids := s.RangeIDs(); len(ids) != 1 || ids[0] != "r2" {
		t.Fatalf("RangeIDs after the drop = %v, want [r2]", ids)
	}
	r2, _ := s.Range("r2")
	if r2.LogEnd() != 10 || clean && r2.HWM() != 10 || len(readAll(t, r2)) != 10 {
		t.Fatalf("r2 after r1's drop: log end %d, HWM %d; want 10 and 10", r2.LogEnd(), r2.HWM())
	}
	checkConsistent(t, r2)
	r1 := mustRange(t, s, "r1")
	if r1.LogEnd() != 0 || r1.HWM() != 0 || len(r1.History()) != 0 || r1.State().FencedEpoch != 0 {
		t.Fatalf("r1 created again: log end %d, HWM %d, history %v, state %+v; want empty", r1.LogEnd(), r1.HWM(), r1.History(), r1.State())
	}
	lead(t, r1, 3)
	appendN(t, r1, 3, 2)
	waitDurable(t, r1, 3)
	checkConsistent(t, r1)
}

func TestDropRange(t *testing.T) {
	o := newOpener(t)
	s := o.open()
	r1, _ := twoRanges(t, s)
	if existed, err := s.DropRange("r1"); err != nil || !existed {
		t.Fatalf("DropRange(r1) = %v, %v; want true, nil", existed, err)
	}
	if _, ok := s.Range("r1"); ok {
		t.Fatalf("Range(r1) after the drop: still there")
	}
	if existed, err := s.DropRange("r1"); err != nil || existed {
		t.Fatalf("DropRange(r1) again = %v, %v; want false, nil (idempotent)", existed, err)
	}
	// The old value refuses writes and waits.
	if _, err := r1.Append(1, false, [][]byte{[]byte("late")}); err == nil {
		t.Fatalf("Append on a dropped range succeeded")
	}
	if err := r1.WaitDurable(t.Context(), 11); !errors.Is(err, logstore.ErrDropped) {
		t.Fatalf("WaitDurable on a dropped range = %v, want ErrDropped", err)
	}
	closeStore(t, s)
	checkDropped(t, o, "r1")
	reopenAfterDrop(t, o, true)
}

// A crash at any step after the drop's intent is persisted leaves a store
// whose next Open finishes the drop before it lists the ranges: never a
// range that looks hosted over part of its log (at "drop:log" its log keys
// are gone and its state is not: without the redo, Open loads that state
// and finds its records missing below the synced-end marker).
func TestCrashDuringDropFinishesAtOpen(t *testing.T) {
	for _, point := range []string{logstore.CrashDropIntent, logstore.CrashDropLog} {
		t.Run(point, func(t *testing.T) {
			o := newOpener(t)
			crash := errors.New("crash")
			o.opts.CrashAt = func(p string) error {
				if p == point {
					return crash
				}
				return nil
			}
			s := o.open()
			twoRanges(t, s)
			if _, err := s.DropRange("r1"); !errors.Is(err, crash) {
				t.Fatalf("DropRange(r1) with a crash at %s = %v, want the crash", point, err)
			}
			_ = s.Close()
			o.opts.CrashAt = nil
			s = o.open() // finishes the drop
			closeStore(t, s)
			checkDropped(t, o, "r1")
			reopenAfterDrop(t, o, false)
		})
	}
}

// A power loss right after a drop returned keeps it dropped: every step
// was synced before DropRange returned.
func TestDropSurvivesPowerLoss(t *testing.T) {
	o := newOpener(t)
	s := o.open()
	twoRanges(t, s)
	if _, err := s.DropRange("r1"); err != nil {
		t.Fatal(err)
	}
	losePower(t, s)
	checkDropped(t, o, "r1")
	reopenAfterDrop(t, o, false)
}

// A drop waits only for the commit in progress, not for the writer to be
// idle: another range appending and raising its HWM all along neither
// starves it nor loses a record, and the dropped range's HWM, dirty when
// the drop began, is not written back after its keys went.
func TestDropWhileAnotherRangeAppends(t *testing.T) {
	o := newOpener(t)
	s := o.open()
	r1, r2 := twoRanges(t, s)
	if err := r1.SetHWM(r1.LogEnd()); err != nil {
		t.Fatal(err)
	}
	appendN(t, r1, 1, 3) // written, and its HWM dirty, as the drop begins
	stop := make(chan struct{})
	done := make(chan int)
	go func() {
		n := 0
		for ; n < 5000; n++ {
			select {
			case <-stop:
				done <- n
				return
			default:
			}
			if _, err := r2.Append(1, false, [][]byte{value("r2", r2.AssignedEnd())}); err != nil {
				t.Errorf("Append on r2 = %v", err)
				break
			}
			_ = r2.SetHWM(r2.DurableEnd())
		}
		done <- n
	}()
	if _, err := s.DropRange("r1"); err != nil {
		t.Fatalf("DropRange(r1) under r2's appends = %v", err)
	}
	close(stop)
	n := <-done
	waitDurable(t, r2, r2.AssignedEnd())
	closeStore(t, s)
	checkDropped(t, o, "r1")
	s = o.open()
	defer closeStore(t, s)
	r2, _ = s.Range("r2")
	if got := r2.LogEnd(); got != 10+uint64(n) {
		t.Fatalf("r2 log end after the drop = %d, want %d", got, 10+n)
	}
	checkConsistent(t, r2)
}

// The commit in progress when a drop begins may carry the dropped range's
// dirty HWM: the drop waits for it, or the HWM key would be written after
// the drop deleted it, and a range created again under the id would load
// the deleted one's HWM.
func TestDropWaitsForTheCommitCarryingItsHWM(t *testing.T) {
	o := newOpener(t)
	var holding atomic.Bool
	held, release := make(chan struct{}), make(chan struct{})
	o.opts.CrashAt = func(p string) error {
		if p == logstore.CrashCommitWrite && holding.CompareAndSwap(true, false) {
			close(held)
			<-release
		}
		return nil
	}
	s := o.open()
	r1, r2 := twoRanges(t, s)
	appendN(t, r1, 1, 3)
	waitDurable(t, r1, 13)
	holding.Store(true)
	if err := r1.SetHWM(13); err != nil {
		t.Fatal(err)
	}
	// r2's next write takes r1's dirty HWM into the commit held here.
	appended := make(chan error, 1)
	go func() {
		_, err := r2.Append(1, false, [][]byte{[]byte("held")})
		appended <- err
	}()
	<-held
	dropped := make(chan error, 1)
	go func() {
		_, err := s.DropRange("r1")
		dropped <- err
	}()
	select {
	case err := <-dropped:
		t.Fatalf("DropRange returned (%v) while the commit carrying r1's HWM was held", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	if err := <-appended; err != nil {
		t.Fatal(err)
	}
	if err := <-dropped; err != nil {
		t.Fatal(err)
	}
	closeStore(t, s)
	checkDropped(t, o, "r1")
}
