package logstore_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// sameRecords fails unless got and want are the same records.
func sameRecords(t testing.TB, what string, got, want []*tenurev1.Record) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d records, want %d", what, len(got), len(want))
	}
	for i := range got {
		if !proto.Equal(got[i], want[i]) {
			t.Fatalf("%s: record %d = %v, want %v", what, i, got[i], want[i])
		}
	}
}

// ReadTail answers exactly what Read answers, from any offset, within the
// same bounds, whether the records come from memory or from Badger.
func TestReadTailMatchesRead(t *testing.T) {
	s := newOpener(t).open()
	defer closeStore(t, s)
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	for range 20 {
		appendN(t, r, 1, 7)
	}
	end := r.LogEnd()
	if got := r.AssignedEnd(); got != end {
		t.Fatalf("AssignedEnd() = %d, LogEnd() = %d after every Append returned", got, end)
	}
	for from := uint64(0); from <= end; from += 3 {
		for _, n := range []int{0, 1, 5, 64} {
			want, err := r.Read(from, n, 0)
			if err != nil {
				t.Fatalf("Read(%d, %d) = %v", from, n, err)
			}
			got, err := r.ReadTail(from, n, 0)
			if err != nil {
				t.Fatalf("ReadTail(%d, %d) = %v", from, n, err)
			}
			sameRecords(t, "ReadTail", got, want)
		}
	}
	// Byte bound: at least one record, then stop before exceeding it.
	got, err := r.ReadTail(1, 0, 1)
	if err != nil || len(got) != 1 || got[0].GetOffset() != 1 {
		t.Fatalf("ReadTail(1, 0, 1 byte) = %v, %v; want the record at 1 alone", got, err)
	}
	if _, err := r.ReadTail(end+1, 0, 0); !errors.Is(err, logstore.ErrOutOfRange) {
		t.Fatalf("ReadTail(%d) beyond the end = %v, want ErrOutOfRange", end+1, err)
	}
}

// A leader serves a batch to followers from the moment Append accepted it,
// before its own write of the batch has committed: LogEnd and DurableEnd
// stay where they were until the write is done, and Read (committed
// records) does not see it.
func TestReadTailServesRecordsBeforeTheirWrite(t *testing.T) {
	o := newOpener(t)
	var hold atomic.Bool
	release := make(chan struct{})
	o.opts.CrashAt = func(point string) error {
		if point == logstore.CrashCommitWrite && hold.Load() {
			<-release
		}
		return nil
	}
	s := o.open()
	defer closeStore(t, s)
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	waitDurable(t, r, 1)

	hold.Store(true)
	done := make(chan error, 1)
	go func() {
		_, err := r.Append(1, false, [][]byte{[]byte("a"), []byte("b")})
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for r.AssignedEnd() != 3 {
		if time.Now().After(deadline) {
			t.Fatal("Append did not assign its offsets")
		}
		time.Sleep(time.Millisecond)
	}
	if r.LogEnd() != 1 || r.DurableEnd() != 1 {
		t.Fatalf("with the write held: LogEnd, DurableEnd = %d, %d; want 1, 1", r.LogEnd(), r.DurableEnd())
	}
	got, err := r.ReadTail(1, 0, 0)
	if err != nil {
		t.Fatalf("ReadTail(1) = %v", err)
	}
	sameRecords(t, "ReadTail before the write", got, []*tenurev1.Record{rec(1, 1, false, "a"), rec(2, 1, false, "b")})
	if recs, err := r.Read(1, 0, 0); err != nil || len(recs) != 0 {
		t.Fatalf("Read(1) with the write held = %v, %v; want nothing", recs, err)
	}
	select {
	case err := <-done:
		t.Fatalf("Append returned before its write: %v", err)
	default:
	}

	hold.Store(false)
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("Append = %v", err)
	}
	waitDurable(t, r, 3)
	want, err := r.Read(1, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	sameRecords(t, "Read after the write", want, got)
}

// After a truncation the records cut are never served from memory: a
// replica that was truncated as a follower and then leads serves the new
// records at those offsets.
func TestReadTailAfterTruncate(t *testing.T) {
	s := newOpener(t).open()
	defer closeStore(t, s)
	r := mustRange(t, s, "r1")
	if err := r.AppendRecords([]*tenurev1.Record{
		rec(0, 1, true, ""), rec(1, 1, false, "a"), rec(2, 1, false, "b"), rec(3, 1, false, "c"),
	}); err != nil {
		t.Fatal(err)
	}
	waitDurable(t, r, 4)
	if _, err := r.Truncate(2); err != nil {
		t.Fatalf("Truncate(2) = %v", err)
	}
	if err := r.AppendRecords([]*tenurev1.Record{rec(2, 2, true, ""), rec(3, 2, false, "x")}); err != nil {
		t.Fatal(err)
	}
	want := []*tenurev1.Record{rec(0, 1, true, ""), rec(1, 1, false, "a"), rec(2, 2, true, ""), rec(3, 2, false, "x")}
	got, err := r.ReadTail(0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	sameRecords(t, "ReadTail after the cut", got, want)
	got, err = r.ReadTail(2, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	sameRecords(t, "ReadTail from the cut", got, want[2:])
}
