package logstore_test

import (
	"testing"
	"time"

	"github.com/tenurelog/tenure/services/replica/logstore"
)

// onDemandLeader opens a store with one range led at epoch 1, its
// epoch-start record durable, syncing on demand from then on with writes
// waiting up to delay for a demand. It returns the range and the store.
func onDemandLeader(t *testing.T, delay time.Duration) (*logstore.Store, *logstore.Range) {
	t.Helper()
	t.Cleanup(logstore.SetSyncDemandDelay(delay))
	s := newOpener(t).open()
	t.Cleanup(func() { closeStore(t, s) })
	r := mustRange(t, s, "a")
	lead(t, r, 1)
	waitDurable(t, r, r.LogEnd())
	r.SetSyncOnDemand(true)
	return s, r
}

// appendUnsynced appends n records to r under epoch 1 and checks, after a
// pause, that they are not durable and that s synced nothing meanwhile.
// It returns their end.
func appendUnsynced(t *testing.T, s *logstore.Store, r *logstore.Range, n int) uint64 {
	t.Helper()
	syncs := s.Stats().Syncs
	end := appendN(t, r, 1, n) + uint64(n)
	time.Sleep(50 * time.Millisecond)
	if got := r.DurableEnd(); got >= end {
		t.Fatalf("DurableEnd() = %d with nothing demanding a sync, want below %d", got, end)
	}
	if got := s.Stats().Syncs; got != syncs {
		t.Fatalf("%d syncs with nothing demanding one", got-syncs)
	}
	return end
}

// pollDurable waits, bounded, for r's durable end to reach end without
// calling WaitDurable (which would demand the sync itself).
func pollDurable(t *testing.T, r *logstore.Range, end uint64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); r.DurableEnd() < end; {
		if time.Now().After(deadline) {
			t.Fatalf("DurableEnd() = %d after 10s, want %d", r.DurableEnd(), end)
		}
		time.Sleep(time.Millisecond)
	}
}

// A leader whose commit needs a follower syncs records once a fetch took
// them, not before: until then its own copy cannot count.
func TestSyncOnDemandWaitsForAFetch(t *testing.T) {
	s, r := onDemandLeader(t, time.Hour)
	end := appendUnsynced(t, s, r, 3)
	base := end - 3

	// A fetch of the first record only demands the first record.
	recs, err := r.ReadTail(base, 1, 0)
	if err != nil || len(recs) != 1 {
		t.Fatalf("ReadTail(%d, 1) = %d records, %v", base, len(recs), err)
	}
	pollDurable(t, r, base+1)
	// One sync covers every write handed to it, the unfetched ones too.
	pollDurable(t, r, end)
}

// Waiting for durability (a fence, a truncation, a caller of WaitDurable)
// is a demand.
func TestSyncOnDemandWaitIsADemand(t *testing.T) {
	s, r := onDemandLeader(t, time.Hour)
	end := appendUnsynced(t, s, r, 2)
	waitDurable(t, r, end)
}

// With no demand at all, writes still become durable within the delay.
func TestSyncOnDemandWaitIsBounded(t *testing.T) {
	_, r := onDemandLeader(t, time.Millisecond)
	for range 5 {
		end := appendN(t, r, 1, 1) + 1
		pollDurable(t, r, end)
	}
}

// A range that stops syncing on demand (its leadership ended) makes what
// waits durable at once.
func TestSyncOnDemandOffSyncs(t *testing.T) {
	s, r := onDemandLeader(t, time.Hour)
	end := appendUnsynced(t, s, r, 2)
	r.SetSyncOnDemand(false)
	pollDurable(t, r, end)
	// And later writes sync without waiting for a demand.
	end = appendN(t, r, 1, 1) + 1
	pollDurable(t, r, end)
}
