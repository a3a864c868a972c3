package logstore_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenurelog/tenure/services/replica/logstore"
)

// pinnedStore leaves, in 4 KiB segment files, a range "keep" with one small
// batch in each file beside two big batches of a range "busy" that then
// advanced its log start past all but its last batch: every file but the
// last few is almost free, yet named by keep.
func pinnedStore(t *testing.T) (o *opener, s *logstore.Store, keep, busy *logstore.Range) {
	t.Helper()
	o = newOpener(t)
	s = o.open()
	keep, busy = mustRange(t, s, "keep"), mustRange(t, s, "busy")
	lead(t, keep, 1)
	lead(t, busy, 1)
	for range 30 {
		appendN(t, keep, 1, 1)
		waitDurable(t, keep, keep.LogEnd())
		appendBig(t, s, busy, 1)
	}
	if err := busy.SetHWM(busy.LogEnd()); err != nil {
		t.Fatal(err)
	}
	if _, err := busy.AdvanceLogStart(busy.LogEnd() - 2); err != nil {
		t.Fatal(err)
	}
	reclaimNow(t, s)
	return o, s, keep, busy
}

// Files that one range's small batches keep while everything else in them
// was released are emptied by relocating those batches into the file being
// written, and then deleted; every record reads the same, before and after
// a reopen, and the accounting agrees with Badger. (Before, they stayed as
// long as keep kept its records: for ever, without retention.)
func TestRelocationFreesFilesASmallRangePins(t *testing.T) {
	defer logstore.SetSegmentBytes(4 << 10)()
	o, s, keep, busy := pinnedStore(t)
	wantKeep, wantBusy := readAll(t, keep), readAll(t, busy)
	pinned := len(o.segmentFiles())
	if pinned < 8 {
		t.Fatalf("%d segment files before relocating: the test does not pin any", pinned)
	}

	emptied, err := s.RelocateNow()
	if err != nil {
		t.Fatalf("RelocateNow() = %v", err)
	}
	left := len(o.segmentFiles())
	if emptied < pinned-4 || left > 4 {
		t.Fatalf("relocation emptied %d files, %d of %d left; want all but the few holding busy's live batches", emptied, left, pinned)
	}
	checkFilesLive(t, o, s)
	sameRecords(t, "keep after relocating", readAll(t, keep), wantKeep)
	sameRecords(t, "busy after relocating", readAll(t, busy), wantBusy)
	checkStoredBytes(t, s, keep)
	checkStoredBytes(t, s, busy)
	checkConsistent(t, keep)
	// Nothing more to do: the files left are the live ones.
	if n, err := s.RelocateNow(); err != nil || n != 0 {
		t.Fatalf("a second RelocateNow() = %d, %v; want 0, nil", n, err)
	}
	uses := s.SegmentUses()
	closeStore(t, s)

	s = o.open()
	defer closeStore(t, s)
	if got := s.SegmentUses(); len(got) != len(uses) {
		t.Fatalf("accounting rebuilt at Open %+v, running one was %+v", got, uses)
	}
	keep, _ = s.Range("keep")
	busy, _ = s.Range("busy")
	sameRecords(t, "keep after a reopen", readAll(t, keep), wantKeep)
	sameRecords(t, "busy after a reopen", readAll(t, busy), wantBusy)
	appendN(t, keep, 1, 1)
	waitDurable(t, keep, keep.LogEnd())
}

// A power loss right after a relocation loses nothing: the copies were
// synced before any pointer named them, and the old files are deleted only
// after Badger synced the new pointers. The batches are checkpointed
// first, so that Badger alone holds them (no WAL replay restores them).
func TestPowerLossAfterRelocation(t *testing.T) {
	defer logstore.SetSegmentBytes(4 << 10)()
	o, s, keep, busy := pinnedStore(t)
	wantKeep, wantBusy := readAll(t, keep), readAll(t, busy)
	if err := s.CheckpointNow(); err != nil {
		t.Fatal(err)
	}
	if n, err := s.RelocateNow(); err != nil || n == 0 {
		t.Fatalf("RelocateNow() = %d, %v; want files emptied", n, err)
	}
	losePower(t, s)
	s = o.open()
	defer closeStore(t, s)
	keep, _ = s.Range("keep")
	busy, _ = s.Range("busy")
	sameRecords(t, "keep after a power loss", readAll(t, keep), wantKeep)
	sameRecords(t, "busy after a power loss", readAll(t, busy), wantBusy)
	checkStoredBytes(t, s, keep)
	reclaimNow(t, s) // Open's own pass runs in the background
	checkFilesLive(t, o, s)
}

// Relocation running beside reads, appends, log start advances and
// truncations of the ranges whose batches it moves: no read fails or
// returns other records, a batch cut or released meanwhile is not brought
// back, and the accounting agrees with Badger at the end.
func TestRelocationBesideReadsAndCuts(t *testing.T) {
	defer logstore.SetSegmentBytes(4 << 10)()
	defer logstore.SetRelocateMaxBytes(8 << 10)() // many small passes
	_, s, keep, busy := pinnedStore(t)
	defer closeStore(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	report := func(err error) {
		select {
		case errs <- err:
		default:
		}
		cancel()
	}
	var emptied atomic.Int64
	wg.Go(func() { // the relocator, as fast as it goes
		for ctx.Err() == nil {
			n, err := s.RelocateNow()
			if err != nil {
				report(err)
				return
			}
			emptied.Add(int64(n))
		}
	})
	wg.Go(func() { // a reader of keep, whose batches move
		for ctx.Err() == nil {
			recs, err := keep.Read(1, 0, 0)
			if err != nil {
				report(fmt.Errorf("keep.Read(1) = %w", err))
				return
			}
			for i, rec := range recs {
				if off := rec.GetOffset(); off != uint64(1+i) || !bytes.Equal(rec.GetValue(), value("keep", off)) {
					report(fmt.Errorf("keep.Read(1) record %d: offset %d, value %q", i, off, rec.GetValue()))
					return
				}
			}
		}
	})
	wg.Go(func() { // busy: appends, then releases all but its last batches
		for ctx.Err() == nil {
			appendBig(t, s, busy, 2)
			if err := busy.SetHWM(busy.LogEnd()); err != nil {
				report(err)
				return
			}
			if _, err := busy.AdvanceLogStart(busy.LogEnd() - 2); err != nil {
				report(err)
				return
			}
		}
	})
	// keep: appends one at a time, and now and then cuts its last one.
	rounds := 0
	for ; ctx.Err() == nil && rounds < 400; rounds++ {
		appendN(t, keep, 1, 1)
		waitDurable(t, keep, keep.LogEnd())
		indexNow(t, s)
		if rounds%5 == 4 {
			if _, err := keep.Truncate(keep.LogEnd() - 1); err != nil {
				t.Fatalf("Truncate = %v", err)
			}
		}
	}
	cancel()
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	checkConsistent(t, keep)
	checkConsistent(t, busy)
	checkStoredBytes(t, s, keep)
	checkStoredBytes(t, s, busy)
	if got, want := uint64(len(readAll(t, keep))), keep.LogEnd()-keep.LogStart(); got != want {
		t.Fatalf("keep reads %d records, its log holds %d", got, want)
	}
	if emptied.Load() == 0 {
		t.Fatal("no relocation pass emptied a file: the test exercised nothing")
	}
	t.Logf("%d rounds of keep beside relocation, %d files emptied", rounds, emptied.Load())
}

// A batch cut, released below a log start or dropped after the relocator
// copied it and before it swaps the pointer stays gone: the swap sets a
// key only where it still holds the very pointer copied (and under the
// range's cutMu), so nothing cut comes back, at once or after a reopen,
// and the copies are released.
func TestRelocationNeverBringsBackWhatWasCut(t *testing.T) {
	defer logstore.SetSegmentBytes(4 << 10)()
	o, s, keep, busy := pinnedStore(t)
	gone := mustRange(t, s, "gone") // dropped in the window
	lead(t, gone, 1)
	appendN(t, gone, 1, 1)
	waitDurable(t, gone, gone.LogEnd())
	indexNow(t, s)
	appendBig(t, s, busy, 2) // gone's batches are no longer in the newest file
	if err := keep.SetHWM(10); err != nil {
		t.Fatal(err)
	}
	cut := keep.LogEnd() - 10
	want := readAll(t, keep)[:cut]
	defer logstore.SetRelocateSwapHook(func() {
		if _, err := keep.Truncate(cut); err != nil {
			t.Errorf("Truncate(%d) in the window = %v", cut, err)
		}
		if _, err := keep.AdvanceLogStart(5); err != nil {
			t.Errorf("AdvanceLogStart(5) in the window = %v", err)
		}
		if _, err := s.DropRange("gone"); err != nil {
			t.Errorf("DropRange(gone) in the window = %v", err)
		}
	})()
	if n, err := s.RelocateNow(); err != nil || n == 0 {
		t.Fatalf("RelocateNow() = %d, %v; want files emptied", n, err)
	}
	check := func(what string, s *logstore.Store, keep *logstore.Range) {
		t.Helper()
		if keep.LogStart() != 5 || keep.LogEnd() != cut {
			t.Fatalf("%s: keep holds [%d, %d), want [5, %d)", what, keep.LogStart(), keep.LogEnd(), cut)
		}
		sameRecords(t, what, readAll(t, keep), want[5:])
		checkStoredBytes(t, s, keep)
		if _, ok := s.Range("gone"); ok {
			t.Fatalf("%s: the dropped range is back", what)
		}
	}
	check("after relocating", s, keep)
	reclaimNow(t, s)
	checkFilesLive(t, o, s)
	closeStore(t, s)
	if n := len(o.pointers("keep")); uint64(n) != cut-5 {
		t.Fatalf("Badger holds %d batches of keep, want %d", n, cut-5)
	}
	if n := len(o.pointers("gone")); n != 0 {
		t.Fatalf("Badger holds %d batches of the dropped range", n)
	}
	s = o.open()
	defer closeStore(t, s)
	keep, _ = s.Range("keep")
	check("after a reopen", s, keep)
}
