package logstore_test

import (
	"testing"
	"time"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"

	"github.com/tenurelog/tenure/services/replica/logstore"
)

// heldLeader opens a store whose group commits stay out of Badger until a
// checkpoint, Close or IndexNow indexes them, with range r1 led at epoch 1.
func heldLeader(t *testing.T) (*opener, *logstore.Store, *logstore.Range) {
	t.Cleanup(logstore.HoldIndex())
	o := newOpener(t)
	s := o.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	return o, s, r
}

// Records are readable, and their epochs known, from the moment they are
// written, before Badger holds them: Read serves them from the range's
// tail, however far it reaches below the tail's keep limits, and across
// the boundary with what Badger does hold.
func TestReadServesRecordsNotYetIndexed(t *testing.T) {
	_, s, r := heldLeader(t)
	appendN(t, r, 1, 100)
	if err := s.IndexNow(); err != nil {
		t.Fatal(err)
	}
	indexed := r.LogEnd() // 101: Badger holds [0, 101)
	// Far more than the tail keeps of indexed writes (256 records), one
	// record per batch, so only the index may release them.
	for range 600 {
		appendN(t, r, 1, 1)
	}
	end := r.LogEnd()
	waitDurable(t, r, end)
	if n := s.Stats().IndexCommits; n != 1 {
		t.Fatalf("IndexCommits = %d, want 1: the test must read records Badger does not hold", n)
	}
	check := func(when string) {
		t.Helper()
		recs := readAll(t, r)
		if uint64(len(recs)) != end {
			t.Fatalf("%s: read %d records, want %d", when, len(recs), end)
		}
		for i, rec := range recs {
			if rec.GetOffset() != uint64(i) || rec.GetEpoch() != 1 {
				t.Fatalf("%s: record %d is offset %d epoch %d", when, i, rec.GetOffset(), rec.GetEpoch())
			}
			if i > 0 && string(rec.GetValue()) != string(value("r1", uint64(i))) {
				t.Fatalf("%s: record %d holds %q", when, i, rec.GetValue())
			}
		}
		// A read across the boundary, bounded by bytes, stops at the
		// bound exactly as a read of Badger alone would.
		size := len(value("r1", indexed))
		part, err := r.Read(indexed-3, 0, 6*size)
		if err != nil {
			t.Fatalf("%s: Read(%d) = %v", when, indexed-3, err)
		}
		if len(part) != 6 || part[0].GetOffset() != indexed-3 || part[5].GetOffset() != indexed+2 {
			t.Fatalf("%s: Read(%d, %d bytes) = %d records from %d", when, indexed-3, 6*size, len(part), part[0].GetOffset())
		}
		for _, off := range []uint64{1, indexed - 1, indexed, end - 2} {
			if e, err := r.EpochAt(off); err != nil || e != 1 {
				t.Fatalf("%s: EpochAt(%d) = %d, %v", when, off, e, err)
			}
		}
	}
	check("before indexing")
	if err := s.IndexNow(); err != nil {
		t.Fatal(err)
	}
	check("after indexing")
	closeStore(t, s)
}

// Close indexes what waits: a clean Close tells Open there is nothing to
// replay, so a record Badger did not hold by then would be gone after a
// restart.
func TestCloseIndexesWhatWaits(t *testing.T) {
	o, s, r := heldLeader(t)
	for range 10 {
		appendN(t, r, 1, 1)
	}
	waitDurable(t, r, 11)
	want := readAll(t, r)
	closeStore(t, s)
	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	if r.LogEnd() != 11 {
		t.Fatalf("LogEnd after a clean restart = %d, want 11", r.LogEnd())
	}
	sameRecords(t, "after a clean restart", readAll(t, r), want)
}

// A WAL checkpoint lets Open skip the old file's entries, so it must index
// them first, and sync the segments it wrote them to: otherwise a power
// loss after it loses records that were durable (neither replayed nor in
// Badger and its segments). With indexing held back, only the checkpoints
// index anything here.
func TestCheckpointIndexesTheOldFile(t *testing.T) {
	defer logstore.HoldIndex()()
	defer logstore.SetWALSizes(16<<10, 2<<10)()
	o := newOpener(t)
	s := o.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	appendAcrossSwitches(t, s, r, 100) // ~100 KiB: several switches
	end := r.AssignedEnd()
	waitDurable(t, r, end)
	want := readAll(t, r)
	losePower(t, s)
	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	if r.LogEnd() != end {
		t.Fatalf("LogEnd after the power loss = %d, want %d: durable records were lost", r.LogEnd(), end)
	}
	sameRecords(t, "after the power loss", readAll(t, r), want)
	checkConsistent(t, r)
}

// A truncation of records Badger does not hold yet cuts them for good:
// they are indexed before the cut, so no later index commit writes them
// back, and the log continues from the cut.
func TestTruncateRecordsNotYetIndexed(t *testing.T) {
	o, s, r := heldLeader(t)
	appendN(t, r, 1, 20)
	waitDurable(t, r, 21)
	if _, err := r.Truncate(8); err != nil {
		t.Fatalf("Truncate(8) = %v", err)
	}
	appendN(t, r, 1, 4) // offsets 8..11 again
	waitDurable(t, r, 12)
	if err := s.IndexNow(); err != nil {
		t.Fatal(err)
	}
	want := readAll(t, r)
	if len(want) != 12 {
		t.Fatalf("read %d records after the cut and 4 appends, want 12", len(want))
	}
	closeStore(t, s)
	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	sameRecords(t, "after reopening", readAll(t, r), want)
	checkConsistent(t, r)
}

// StoredBytes counts a batch from its append on, not from its index
// commit: status and metrics report an append's bytes with its log end, and
// a status reader comparing two snapshots never sees bytes arrive by
// themselves up to indexDelay later (with 25 ms, the promoter's
// authorisation test saw stored_bytes move between two snapshots around
// refused calls). IndexedBytes, what RetainBytes can cut, follows the index;
// an index commit raises it and wakes IndexGrown, on which a leader checks
// its range's size limit (replica commitLoop): when the last appends
// passed the limit only once indexed, nothing else woke the leader, and the
// range stayed over its limit until the next retention interval.
func TestStoredBytesCountsAnAppendAndTheIndexCommitWakesIndexGrown(t *testing.T) {
	_, s, r := heldLeader(t)
	defer closeStore(t, s)
	startStored, startIndexed := r.StoredBytes(), r.IndexedBytes()
	appendN(t, r, 1, 10)
	waitDurable(t, r, r.LogEnd())
	if n := s.Stats().IndexCommits; n != 0 {
		t.Fatalf("IndexCommits = %d, want 0: the test must look before the index commit", n)
	}
	appended := r.StoredBytes()
	if appended <= startStored {
		t.Fatalf("StoredBytes %d after 10 appends, %d before; want more before any index commit", appended, startStored)
	}
	if got := r.IndexedBytes(); got != startIndexed {
		t.Fatalf("IndexedBytes %d before the index commit, want %d as at the start", got, startIndexed)
	}
	grown := r.IndexGrown()
	if err := s.IndexNow(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-grown:
	default:
		t.Fatal("an index commit left IndexGrown waiting")
	}
	if got := r.StoredBytes(); got != appended {
		t.Fatalf("StoredBytes %d after the index commit, %d before it; want no change", got, appended)
	}
	if got := r.IndexedBytes(); got != appended {
		t.Fatalf("IndexedBytes %d after the index commit, want StoredBytes, %d", got, appended)
	}
	checkStoredBytes(t, s, r)
}

// What waits for the index counts against the queue's byte bound: with the
// index stalled, appends wait once maxQueueBytes of values wait for it, and
// go on when an index commit takes them. Before, the index ran on a
// goroutine of its own with nothing to hold the writer back, and a stalled
// index let the WAL and the ranges' tails grow without bound.
func TestAppendsWaitForAStalledIndex(t *testing.T) {
	defer logstore.SetMaxQueueBytes(64 << 10)()
	_, s, r := heldLeader(t)
	defer closeStore(t, s)
	// 15 KiB a write: four fit in 64 KiB with their framing, five do not.
	val := make([]byte, 15<<10)
	const writes = 8
	done := make(chan error, writes)
	go func() {
		for range writes {
			_, err := r.Append(1, false, [][]byte{val})
			done <- err
			if err != nil {
				return
			}
		}
	}()
	wait := func(n int) {
		t.Helper()
		for i := range n {
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("append: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("append %d of %d did not return within 10s", i+1, n)
			}
		}
	}
	wait(4)
	select {
	case err := <-done:
		t.Fatalf("a fifth append returned (err %v) while 60 KiB waited for a stalled index, bound 64 KiB", err)
	case <-time.After(300 * time.Millisecond):
	}
	if n := s.Stats().IndexCommits; n != 0 {
		t.Fatalf("IndexCommits = %d, want 0: the index must be stalled until now", n)
	}
	// What an operator reads (tenure_replica_append_queue_*): the four
	// appends' bytes held, all committed, against the bound, and the fifth
	// counted as waiting.
	q := s.QueueStatus()
	if q.Bytes < 4*len(val) || q.Bytes > q.MaxBytes || q.MaxBytes != 64<<10 || q.Records != 0 || q.Waits != 1 {
		t.Fatalf("QueueStatus with the index stalled = %+v, want the bytes of 4 appends of %d held (at most MaxBytes %d), no records, 1 wait", q, len(val), 64<<10)
	}
	if err := s.IndexNow(); err != nil {
		t.Fatal(err)
	}
	wait(writes - 4)
	if err := s.IndexNow(); err != nil {
		t.Fatal(err)
	}
	if q := s.QueueStatus(); q.Bytes != 0 || q.Waits < 1 {
		t.Fatalf("QueueStatus once everything is indexed = %+v, want no bytes held and the waits kept", q)
	}
}

// Every way a write takes room in the queue gives all of it back: appends
// committed and indexed, a retry answered from the dedupe state, an append
// refused after it was admitted, a follower's records committed inline and
// queued for a shared commit, and a truncation's checkpoint. A leak would
// shrink the room a little each time, until appends waited for ever.
func TestQueueRoomComesBackWhole(t *testing.T) {
	_, s, r := heldLeader(t)
	defer closeStore(t, s)
	appendN(t, r, 1, 10)
	pa := logstore.ProducerAppend{ID: logstore.ProducerID{9}, Epoch: 1, FirstSeq: 0}
	if _, dup, err := produce(t, r, 1, pa, "a", "b"); err != nil || dup {
		t.Fatalf("AppendProduced = dup %v, %v", dup, err)
	}
	if _, dup, err := produce(t, r, 1, pa, "a", "b"); err != nil || !dup {
		t.Fatalf("AppendProduced retried = dup %v, %v; want a duplicate", dup, err)
	}
	// Admitted, then refused for its epoch, newer than the journal's.
	if _, err := r.Append(2, false, [][]byte{[]byte("x")}); err == nil {
		t.Fatal("an append at an unjournaled epoch was accepted")
	}
	f := mustRange(t, s, "f1")
	if err := f.AppendRecords([]*tenurev1.Record{rec(0, 1, true, ""), rec(1, 1, false, "y")}); err != nil {
		t.Fatal(err)
	}
	wait, err := f.QueueRecords([]*tenurev1.Record{rec(2, 1, false, "z")})
	if err != nil {
		t.Fatal(err)
	}
	f.CommitQueued()
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	appendN(t, r, 1, 5)
	waitDurable(t, r, r.LogEnd())
	if _, err := r.Truncate(r.LogEnd() - 2); err != nil { // checkpoints first, indexing all
		t.Fatal(err)
	}
	if err := s.IndexNow(); err != nil {
		t.Fatal(err)
	}
	if q := s.QueueStatus(); q.Records != 0 || q.Bytes != 0 {
		t.Fatalf("the queue holds %d records and %d bytes with everything committed and indexed, want none", q.Records, q.Bytes)
	}
}
