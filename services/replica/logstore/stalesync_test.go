package logstore_test

import (
	"sync/atomic"
	"testing"
	"time"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// A sync that took a range's log end before a truncation must not publish
// that end as durable after it: the offsets below it may by then hold new
// records, written after that sync's fdatasync, which it never covered.
//
// The sequence: the syncer fsyncs r's end 6 and is held before publishing it;
// an inline sync of another range (b) takes r's later end 11 and publishes
// it, so r is quiet and durable; r is fenced, truncated to 1 and leads epoch
// 2, writing [1, 11) unsynced (it syncs on demand, and nothing demands).
// Then the held sync publishes end 6. Before the fix r's DurableEnd became 6
// (WaitDurable(6) returned) for records no sync covered, and a power loss
// then left the log ending at 1.
func TestStaleSyncAfterTruncateCountsNothingDurable(t *testing.T) {
	t.Cleanup(logstore.SetSyncDemandDelay(time.Hour))
	o := newOpener(t)
	s := o.open()
	r := mustRange(t, s, "a")
	b := mustRange(t, s, "b")
	lead(t, r, 1)
	waitDurable(t, r, r.LogEnd())

	var armed atomic.Bool
	entered := make(chan uint64, 1)
	release := make(chan struct{})
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	t.Cleanup(logstore.SetSyncedHook(func(ends map[*logstore.Range]uint64) {
		if _, ok := ends[b]; ok {
			return // b's inline syncs pass
		}
		if end, ok := ends[r]; ok && armed.CompareAndSwap(true, false) {
			entered <- end
			<-release
		}
	}))
	armed.Store(true)
	appendN(t, r, 1, 5)
	var held uint64
	select {
	case held = <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the syncer never synced r's write")
	}
	end2 := appendN(t, r, 1, 5) + 5

	// b follows: its AppendRecords commits and syncs inline, taking the
	// end the writer handed over for r.
	for i := uint64(0); r.DurableEnd() < end2; i++ {
		rec := &tenurev1.Record{Offset: b.LogEnd(), Epoch: 1, Value: []byte("b")}
		if b.LogEnd() == 0 {
			rec = &tenurev1.Record{Offset: 0, Epoch: 1, EpochStart: true}
		}
		if err := b.AppendRecords([]*tenurev1.Record{rec}); err != nil {
			t.Fatalf("b.AppendRecords = %v", err)
		}
		if i > 1000 {
			t.Fatalf("r's DurableEnd stays %d, want %d", r.DurableEnd(), end2)
		}
		time.Sleep(time.Millisecond)
	}

	// Fence r, cut it to 1, and lead epoch 2 with writes nothing syncs.
	if err := r.SetState(logstore.State{FencedEpoch: 2, Role: tenurev1.Role_ROLE_FENCED}); err != nil {
		t.Fatalf("SetState = %v", err)
	}
	if _, err := r.Truncate(1); err != nil {
		t.Fatalf("Truncate(1) = %v", err)
	}
	r.SetSyncOnDemand(true)
	lead(t, r, 2)
	appendN(t, r, 2, 9)
	if got := r.DurableEnd(); got != 1 {
		t.Fatalf("DurableEnd() = %d before the held sync ends, want 1", got)
	}

	close(release)
	time.Sleep(100 * time.Millisecond)
	if got := r.DurableEnd(); got > 1 {
		losePower(t, s)
		s2 := o.open()
		defer closeStore(t, s2)
		r2, _ := s2.Range("a")
		t.Fatalf("a sync of end %d taken before the truncation to 1 made DurableEnd %d for epoch 2's records, which no sync covered; after a power loss the log ends at %d",
			held, got, r2.LogEnd())
	}
	closeStore(t, s)
}
