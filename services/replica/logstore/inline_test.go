package logstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// A follower's AppendRecords on a store with no commit running commits and
// syncs on the caller's goroutine: the records are durable when it returns,
// with no wait for the writer or the syncer.
func TestFollowerAppendOnIdleStoreIsDurableOnReturn(t *testing.T) {
	s := newOpener(t).open()
	defer closeStore(t, s)
	r := mustRange(t, s, "r1")
	if err := r.AppendRecords([]*tenurev1.Record{rec(0, 1, true, "")}); err != nil {
		t.Fatalf("AppendRecords = %v", err)
	}
	for off := uint64(1); off <= 20; off++ {
		if err := r.AppendRecords([]*tenurev1.Record{rec(off, 1, false, "v")}); err != nil {
			t.Fatalf("AppendRecords(%d) = %v", off, err)
		}
		if got := r.DurableEnd(); got != off+1 {
			t.Fatalf("DurableEnd() after AppendRecords(%d) on an idle store = %d, want %d", off, got, off+1)
		}
	}
	checkConsistent(t, r)
}

// Followers of many ranges applying fetched batches at once share the
// writer role: whichever goroutine commits, every range's records land
// contiguous and in order, each becomes durable, and leader appends on the
// same store (committed by the writer goroutine) interleave with them.
// Closing the store while they still run neither hangs nor loses a batch
// whose AppendRecords returned: each one is there after reopening.
func TestInlineAndWriterCommitsInterleaveAndSurviveClose(t *testing.T) {
	o := newOpener(t)
	s := o.open()
	const followers, batches, per = 8, 40, 3
	rs := make([]*logstore.Range, followers)
	for i := range rs {
		rs[i] = mustRange(t, s, fmt.Sprintf("f%d", i))
	}
	leader := mustRange(t, s, "leader")
	lead(t, leader, 1)

	// done[i] is how many of range i's batches AppendRecords returned nil for.
	done := make([]int, followers)
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Go(func() {
			for b := range batches {
				var recs []*tenurev1.Record
				for k := range per {
					off := uint64(b*per + k)
					recs = append(recs, rec(off, 1, off == 0, valueAt(off)))
				}
				if err := r.AppendRecords(recs); err != nil {
					return // closed under it: fine, the ones before count
				}
				done[i] = b + 1
				// Durable, also when the close came meanwhile: Close
				// commits and syncs every write it accepted.
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				err := r.WaitDurable(ctx, uint64((b+1)*per))
				cancel()
				if err != nil {
					t.Errorf("f%d: WaitDurable(%d) after AppendRecords returned = %v", i, (b+1)*per, err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for range batches {
			if _, err := leader.Append(1, false, [][]byte{[]byte("x")}); err != nil {
				return
			}
		}
	})
	// Let them run for a while, then close underneath the rest.
	waitDurable(t, rs[0], per*batches/2)
	closeStore(t, s)
	wg.Wait()

	s = o.open()
	defer closeStore(t, s)
	for i := range rs {
		r, ok := s.Range(fmt.Sprintf("f%d", i))
		if !ok {
			t.Fatalf("range f%d missing after reopen", i)
		}
		if want := uint64(done[i] * per); r.LogEnd() < want {
			t.Fatalf("f%d: LogEnd() after reopen = %d, want at least %d (batches AppendRecords returned for)", i, r.LogEnd(), want)
		}
		checkConsistent(t, r)
		for _, got := range readAll(t, r) {
			if string(got.GetValue()) != valueAt(got.GetOffset()) && got.GetOffset() != 0 {
				t.Fatalf("f%d: record %d = %q, want %q", i, got.GetOffset(), got.GetValue(), valueAt(got.GetOffset()))
			}
		}
	}
}

func valueAt(off uint64) string {
	if off == 0 {
		return ""
	}
	return fmt.Sprintf("v%d", off)
}

// Records queued for several ranges (QueueRecords) and committed at once
// (CommitQueued) are written by one group commit and made durable by one
// WAL sync (the syncer's), as a fetch session's answers for many ranges
// are applied: one AppendRecords per range would commit, and mostly sync,
// once per range.
func TestQueuedRecordsOfManyRangesShareOneSync(t *testing.T) {
	s := newOpener(t).open()
	defer closeStore(t, s)
	const ranges = 8
	rs := make([]*logstore.Range, ranges)
	mine := map[*logstore.Range]bool{}
	for i := range rs {
		rs[i] = mustRange(t, s, fmt.Sprintf("q%d", i))
		mine[rs[i]] = true
		if err := rs[i].AppendRecords([]*tenurev1.Record{rec(0, 1, true, "")}); err != nil {
			t.Fatalf("AppendRecords(epoch start) on q%d = %v", i, err)
		}
	}
	var mu sync.Mutex
	var syncs []int // per sync covering any of rs: how many of rs it covered
	t.Cleanup(logstore.SetSyncedHook(func(ends map[*logstore.Range]uint64) {
		n := 0
		for r := range ends {
			if mine[r] {
				n++
			}
		}
		if n > 0 {
			mu.Lock()
			syncs = append(syncs, n)
			mu.Unlock()
		}
	}))
	waits := make([]func() error, ranges)
	for i, r := range rs {
		w, err := r.QueueRecords([]*tenurev1.Record{rec(1, 1, false, "a"), rec(2, 1, false, "b")})
		if err != nil {
			t.Fatalf("QueueRecords on q%d = %v", i, err)
		}
		waits[i] = w
	}
	rs[0].CommitQueued() // the store's queue, every range's
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, w := range waits {
		if err := w(); err != nil {
			t.Fatalf("q%d: queued records failed: %v", i, err)
		}
		if got := rs[i].LogEnd(); got != 3 {
			t.Fatalf("q%d: LogEnd() after CommitQueued = %d, want 3", i, got)
		}
		if err := rs[i].WaitDurable(ctx, 3); err != nil {
			t.Fatalf("q%d: WaitDurable(3) = %v", i, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(syncs) != 1 || syncs[0] != ranges {
		t.Fatalf("syncs covering the queued ranges: %v (ranges covered by each), want one covering all %d", syncs, ranges)
	}
	for _, r := range rs {
		checkConsistent(t, r)
	}
}

// A queued batch that fails its checks is refused with nothing queued, so
// a caller may hand the same records to AppendRecords, which refuses them
// the same way.
func TestQueueRecordsRefusesAsAppendRecordsDoes(t *testing.T) {
	s := newOpener(t).open()
	defer closeStore(t, s)
	r := mustRange(t, s, "q")
	if err := r.AppendRecords([]*tenurev1.Record{rec(0, 1, true, "")}); err != nil {
		t.Fatal(err)
	}
	gap := []*tenurev1.Record{rec(5, 1, false, "gap")}
	if _, err := r.QueueRecords(gap); err == nil {
		t.Fatal("QueueRecords accepted records past the log end")
	}
	if got := r.LogEnd(); got != 1 {
		t.Fatalf("LogEnd() after a refused QueueRecords = %d, want 1", got)
	}
	if err := r.AppendRecords(gap); err == nil {
		t.Fatal("AppendRecords accepted records past the log end")
	}
}
