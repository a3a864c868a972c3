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
