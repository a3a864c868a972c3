package logstore_test

import (
	"sync/atomic"
	"testing"

	"github.com/tenurelog/tenure/internal/uring"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// Records synced through the WAL's io_uring are durable: a power loss
// right after WaitDurable returned keeps every one of them, those synced
// on the ring and those synced after it failed (fdatasync(2) then). Where
// io_uring is refused (a seccomp profile, an old kernel) the store has no
// ring and syncs with fdatasync(2), with the same outcome.
func TestWALSyncsOnTheRingAreDurable(t *testing.T) {
	var onRing atomic.Int64
	defer logstore.SetWALSyncOnRing(func() bool { onRing.Add(1); return true })()
	o := newOpener(t)
	s := o.open()
	ring, err := uring.New()
	if err == nil {
		_ = ring.Close()
	}
	if got, want := s.WALHasRing(), err == nil; got != want {
		t.Fatalf("store has a ring = %v, but io_uring here: %v", got, err)
	}
	r := mustRange(t, s, "a")
	lead(t, r, 1)
	for range 20 {
		appendN(t, r, 1, 3)
		waitDurable(t, r, r.LogEnd())
	}
	if s.WALHasRing() {
		if onRing.Load() == 0 {
			t.Fatal("no WAL sync went through the ring")
		}
		// A ring that fails (here: closed under the store) leaves the
		// syncs to fdatasync(2): nothing fails, nothing is lost.
		if err := s.CloseWALRing(); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		appendN(t, r, 1, 3)
		waitDurable(t, r, r.LogEnd())
	}
	want := readAll(t, r)
	losePower(t, s)
	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("a")
	if r.LogEnd() != 76 {
		t.Fatalf("LogEnd after the power loss = %d, want 76: records synced on the ring, or after it failed, were lost", r.LogEnd())
	}
	sameRecords(t, "after the power loss", readAll(t, r), want)
}
