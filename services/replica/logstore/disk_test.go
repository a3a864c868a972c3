package logstore_test

import (
	"bytes"
	"errors"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// fakeFree is a FreeBytes seam the test moves.
type fakeFree struct{ n atomic.Uint64 }

func (f *fakeFree) free() (uint64, error) { return f.n.Load(), nil }

// wantDiskFull checks that err is ErrDiskFull naming the free space and the
// reserve.
func wantDiskFull(t testing.TB, what string, err error) {
	t.Helper()
	if !errors.Is(err, logstore.ErrDiskFull) || !strings.Contains(err.Error(), "below the reserve") {
		t.Fatalf("%s = %v, want ErrDiskFull naming the free space against the reserve", what, err)
	}
}

// Below its reserve the store refuses new records, leader's and
// follower's, before they get offsets, while fences, HWMs, truncation,
// retention, a new epoch's start record and reads go on; once the free
// space is back above the reserve plus its hysteresis, appends resume by
// themselves, and everything acknowledged survives a reopen.
func TestDiskFullRefusesAppendsOnly(t *testing.T) {
	const reserve = 64 << 20
	var free fakeFree
	free.n.Store(1 << 30)
	o := newOpener(t)
	o.opts.DiskReserveBytes = reserve
	o.opts.FreeBytes = free.free
	s := o.open()
	r := mustRange(t, s, "r1")
	f := mustRange(t, s, "f1")
	lead(t, r, 1)
	appendN(t, r, 1, 20)
	fol := func(from uint64, n int, epoch uint64) []*tenurev1.Record {
		var recs []*tenurev1.Record
		for i := range n {
			off := from + uint64(i)
			recs = append(recs, &tenurev1.Record{Offset: off, Epoch: epoch, EpochStart: off == 0, Value: value("f1", off)})
		}
		if from == 0 {
			recs[0].Value = nil
		}
		return recs
	}
	if err := f.AppendRecords(fol(0, 10, 1)); err != nil {
		t.Fatalf("AppendRecords(0..10) = %v", err)
	}
	waitDurable(t, r, r.LogEnd())
	waitDurable(t, f, f.LogEnd())
	if err := r.SetHWM(r.LogEnd()); err != nil {
		t.Fatal(err)
	}
	if st := s.DiskStatus(); st.Full || st.FreeBytes != 1<<30 || st.ReserveBytes != reserve || st.UsedBytes == 0 {
		t.Fatalf("DiskStatus() = %+v, want not full, 1 GiB free, the reserve, some bytes used", st)
	}

	free.n.Store(reserve - 1)
	s.ReadDiskNow()
	st := s.DiskStatus()
	if !st.Full || !strings.Contains(st.Reason, "below the reserve") || st.FullSince.IsZero() {
		t.Fatalf("DiskStatus() = %+v, want full, below the reserve, with a time", st)
	}
	rEnd, fEnd := r.AssignedEnd(), f.AssignedEnd()
	_, err := r.Append(1, false, [][]byte{[]byte("refused")})
	wantDiskFull(t, "Append", err)
	_, _, err = r.AppendProduced(1, logstore.ProducerAppend{ID: logstore.ProducerID{1}, Epoch: 1, FirstSeq: 0}, [][]byte{[]byte("refused")})
	wantDiskFull(t, "AppendProduced", err)
	err = f.AppendRecords(fol(10, 5, 2))
	wantDiskFull(t, "AppendRecords", err)
	if r.AssignedEnd() != rEnd || f.AssignedEnd() != fEnd {
		t.Fatalf("assigned ends %d, %d after refusals, want %d, %d: a refused write assigned offsets", r.AssignedEnd(), f.AssignedEnd(), rEnd, fEnd)
	}
	// The follower's new epoch 2 was not journaled either.
	checkHistory(t, f, es(1, 0))
	if got := s.DiskStatus().RefusedAppends; got != 3 {
		t.Fatalf("RefusedAppends = %d, want 3", got)
	}

	// What keeps working out of the reserve.
	if got := len(readAll(t, r)); got != 21 {
		t.Fatalf("read %d records of r1 while full, want 21", got)
	}
	if err := f.SetState(logstore.State{FencedEpoch: 3, Epoch: 3, Role: tenurev1.Role_ROLE_LEADER}); err != nil {
		t.Fatalf("SetState (a fence) while full = %v", err)
	}
	if removed, err := f.Truncate(8); err != nil || removed != 2 {
		t.Fatalf("Truncate(8) while full = %d, %v, want 2 removed", removed, err)
	}
	if err := f.RecordEpoch(3, f.LogEnd()); err != nil {
		t.Fatalf("RecordEpoch while full = %v", err)
	}
	if _, err := f.Append(3, true, [][]byte{{}}); err != nil {
		t.Fatalf("Append of the epoch-start record while full = %v, want it written out of the reserve", err)
	}
	waitDurable(t, f, f.LogEnd())
	if err := r.SetHWM(r.LogEnd()); err != nil {
		t.Fatalf("SetHWM while full = %v", err)
	}
	if start, err := r.AdvanceLogStart(5); err != nil || start != 5 {
		t.Fatalf("AdvanceLogStart(5) while full = %d, %v", start, err)
	}

	// Above the reserve but within the hysteresis: still full.
	free.n.Store(reserve + reserve/16)
	s.ReadDiskNow()
	if !s.DiskStatus().Full {
		t.Fatalf("full cleared at %d free, within the hysteresis above the reserve %d", reserve+reserve/16, reserve)
	}
	free.n.Store(reserve + reserve/8)
	s.ReadDiskNow()
	if st := s.DiskStatus(); st.Full || st.Reason != "" || !st.FullSince.IsZero() {
		t.Fatalf("DiskStatus() = %+v after space came back, want not full", st)
	}
	appendN(t, r, 1, 5)
	if err := f.AppendRecords([]*tenurev1.Record{{Offset: f.LogEnd(), Epoch: 3, Value: []byte("after")}}); err != nil {
		t.Fatalf("AppendRecords after space came back = %v", err)
	}
	rEnd, fEnd = r.LogEnd(), f.LogEnd()
	waitDurable(t, r, rEnd)
	waitDurable(t, f, fEnd)
	closeStore(t, s)

	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	f, _ = s.Range("f1")
	if r.LogEnd() != rEnd || r.LogStart() != 5 || f.LogEnd() != fEnd {
		t.Fatalf("after reopen r1 [%d, %d), f1 end %d; want [5, %d), %d", r.LogStart(), r.LogEnd(), f.LogEnd(), rEnd, fEnd)
	}
	checkConsistent(t, r)
	checkConsistent(t, f)
	checkHistory(t, f, es(1, 0, 3, 8))
}

// A store opened on a disk already below its reserve opens full: the first
// append after Open is refused, not written into the last of the space.
func TestDiskFullAtOpen(t *testing.T) {
	var free fakeFree
	free.n.Store(1 << 20)
	o := newOpener(t)
	o.opts.DiskReserveBytes = 8 << 20
	o.opts.FreeBytes = free.free
	s := o.open()
	defer closeStore(t, s)
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	_, err := r.Append(1, false, [][]byte{[]byte("x")})
	wantDiskFull(t, "Append right after Open", err)
}

// Reserve 0 turns the preventive check off: however little is free, appends
// are written (only a failed write makes the store full then).
func TestDiskReserveZeroNeverRefuses(t *testing.T) {
	var free fakeFree
	o := newOpener(t)
	o.opts.FreeBytes = free.free
	s := o.open()
	defer closeStore(t, s)
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	appendN(t, r, 1, 3)
	s.ReadDiskNow()
	if st := s.DiskStatus(); st.Full {
		t.Fatalf("DiskStatus() = %+v with reserve 0, want not full", st)
	}
}

// A segment write that fails with ENOSPC (the indexer's, behind the WAL)
// does not fail the store: the store turns full and refuses new records,
// what it acknowledged stays readable (from memory, and durable in the
// WAL), fences go on, and once the filesystem has room again the indexer
// writes the batches and appends resume, with everything there after a
// reopen. Reserve 0: only the failed write makes it full.
func TestSegmentENOSPCIsFullNotFailed(t *testing.T) {
	var free fakeFree
	free.n.Store(1 << 20) // under the 8 MiB an ENOSPC needs to clear
	o := newOpener(t)
	o.opts.FreeBytes = free.free
	s := o.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	appendN(t, r, 1, 10)

	var faults atomic.Int64
	restore := logstore.SetSegmentWriteFault(func(uint32) error {
		faults.Add(1)
		return syscall.ENOSPC
	})
	defer restore()
	base := appendN(t, r, 1, 10) // the WAL takes it; the indexer will not
	waitDurable(t, r, r.LogEnd())
	waitFor(t, "the store to turn full after the indexer's ENOSPC", func() bool { return s.DiskStatus().Full })
	if st := s.DiskStatus(); !strings.Contains(st.Reason, "no space left on device") {
		t.Fatalf("DiskStatus() = %+v, want the failed write as the reason", st)
	}
	_, err := r.Append(1, false, [][]byte{[]byte("refused")})
	if !errors.Is(err, logstore.ErrDiskFull) || !strings.Contains(err.Error(), "a write failed") {
		t.Fatalf("Append after the ENOSPC = %v, want ErrDiskFull naming the failed write", err)
	}
	if got := readAll(t, r); len(got) != 21 || string(got[base].GetValue()) != string(value("r1", base)) {
		t.Fatalf("read %d records after the ENOSPC, want all 21 acknowledged", len(got))
	}
	// A durable state write (a fence at the epoch it leads) goes through.
	if err := r.SetState(logstore.State{FencedEpoch: 1, Epoch: 1, Role: tenurev1.Role_ROLE_LEADER, LeaderID: "me"}); err != nil {
		t.Fatalf("SetState after the ENOSPC = %v", err)
	}

	// Room again: the fault ends and the filesystem shows space.
	restore()
	n := faults.Load()
	free.n.Store(1 << 30)
	waitFor(t, "the store to clear full", func() bool { return !s.DiskStatus().Full })
	if n == 0 {
		t.Fatal("no segment write was refused")
	}
	appendN(t, r, 1, 5)
	end := r.LogEnd()
	waitDurable(t, r, end)
	closeStore(t, s)

	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	if r.LogEnd() != end {
		t.Fatalf("after reopen the log ends at %d, want %d", r.LogEnd(), end)
	}
	got := readAll(t, r)
	for i := uint64(1); i < end; i++ {
		if !bytes.Equal(got[i].GetValue(), value("r1", i)) {
			t.Fatalf("record %d = %q after reopen, want %q", i, got[i].GetValue(), value("r1", i))
		}
	}
}

// waitFor polls cond every 10 ms for up to 10 s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
