package logstore_test

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/tenurelog/tenure/services/replica/logstore"
)

// appendBig appends n batches of two 700-byte records to r under epoch 1
// (each ~1.4 KiB stored: two to a 4 KiB segment file), then waits for
// them to be durable and indexed.
func appendBig(t testing.TB, s *logstore.Store, r *logstore.Range, n int) {
	t.Helper()
	for range n {
		if _, err := r.Append(1, false, [][]byte{make([]byte, 700), make([]byte, 700)}); err != nil {
			t.Fatal(err)
		}
	}
	waitDurable(t, r, r.LogEnd())
	indexNow(t, s)
}

func indexNow(t testing.TB, s *logstore.Store) {
	t.Helper()
	if err := s.IndexNow(); err != nil {
		t.Fatalf("IndexNow() = %v", err)
	}
}

func reclaimNow(t testing.TB, s *logstore.Store) {
	t.Helper()
	if _, err := s.ReclaimNow(); err != nil {
		t.Fatalf("ReclaimNow() = %v", err)
	}
}

// livePointers sums the pointers the store counts over every segment.
func livePointers(s *logstore.Store) int {
	n := 0
	for _, u := range s.SegmentUses() {
		n += u.Pointers
	}
	return n
}

// checkStoredBytes checks r's StoredBytes counter against a scan of its keys.
func checkStoredBytes(t testing.TB, s *logstore.Store, r *logstore.Range) {
	t.Helper()
	n, err := s.LogBytes(r.ID())
	if err != nil {
		t.Fatal(err)
	}
	if got := r.StoredBytes(); got != n {
		t.Fatalf("range %s: StoredBytes() = %d, its keys hold %d", r.ID(), got, n)
	}
}

// checkFilesLive checks that the only segment files left are those with a
// live pointer, and the highest numbered (kept so numbers never repeat).
func checkFilesLive(t testing.TB, o *opener, s *logstore.Store) {
	t.Helper()
	uses := s.SegmentUses()
	live := map[string]bool{}
	for _, u := range uses {
		if u.Pointers > 0 {
			live[segmentFile(o, u.Segment)] = true
		}
	}
	files := o.segmentFiles()
	for i, f := range files {
		if !live[f] && i != len(files)-1 {
			t.Errorf("segment %s has no live pointer and was not deleted (uses %+v)", f, uses)
		}
	}
	for f := range live {
		if !slices.Contains(files, f) {
			t.Errorf("segment %s has live pointers but is gone", f)
		}
	}
}

// Truncated batches free their segments: every file whose batches were all
// cut is deleted (a batch cut in its middle is rewritten inline, releasing
// its pointer too); what is left reads back after a reopen, and the
// accounting Open rebuilds matches the running one.
func TestTruncatedSegmentsAreDeleted(t *testing.T) {
	defer logstore.SetSegmentBytes(4 << 10)()
	o := newOpener(t)
	s := o.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	appendBig(t, s, r, 40)
	before := len(o.segmentFiles())
	if before < 15 {
		t.Fatalf("%d segment files after 40 batches of 1.4 KiB in 4 KiB files", before)
	}
	if n := livePointers(s); n != 41 {
		t.Fatalf("%d live pointers counted, want 41 (the epoch start and 40 batches)", n)
	}
	checkStoredBytes(t, s, r)
	want := readAll(t, r)[:10]

	// Batches start at 0 (epoch start), then 1, 3, 5, 7, 9: the cut at 10
	// is inside [9, 11).
	if _, err := r.Truncate(10); err != nil {
		t.Fatalf("Truncate(10) = %v", err)
	}
	reclaimNow(t, s)
	after := len(o.segmentFiles())
	// Ten records in five batches fill three files; the highest stays.
	if after > 4 {
		t.Fatalf("%d segment files left of %d after cutting all but 10 records", after, before)
	}
	checkFilesLive(t, o, s)
	checkStoredBytes(t, s, r)
	sameRecords(t, "after the cut", readAll(t, r), want)
	uses, stored := s.SegmentUses(), r.StoredBytes()
	closeStore(t, s)

	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	if got := s.SegmentUses(); !slices.Equal(got, uses) {
		t.Fatalf("accounting rebuilt at Open %+v, running one was %+v", got, uses)
	}
	if got := r.StoredBytes(); got != stored {
		t.Fatalf("StoredBytes() rebuilt at Open = %d, running one was %d", got, stored)
	}
	sameRecords(t, "after a reopen", readAll(t, r), want)
	checkConsistent(t, r)
	// And the store goes on: new batches, a new file.
	appendBig(t, s, r, 3)
	if got := len(readAll(t, r)); got != 16 {
		t.Fatalf("%d records after appending 6 to 10", got)
	}
}

// Segments are shared by the ranges in write order: one range releasing
// its batches frees no file another still has batches in; once the other
// releases too, they go.
func TestSharedSegmentsFreedOnlyWhenEveryRangeReleases(t *testing.T) {
	defer logstore.SetSegmentBytes(4 << 10)()
	o := newOpener(t)
	s := o.open()
	a, b := mustRange(t, s, "a"), mustRange(t, s, "b")
	lead(t, a, 1)
	lead(t, b, 1)
	for range 12 {
		appendBig(t, s, a, 1)
		appendBig(t, s, b, 1)
	}
	wantB := readAll(t, b)
	closeStore(t, s)
	bSegs := map[string]bool{}
	for _, p := range o.pointers("b") {
		bSegs[segmentFile(o, p.segment)] = true
	}

	s = o.open()
	if _, err := s.DropRange("a"); err != nil {
		t.Fatalf("DropRange(a) = %v", err)
	}
	reclaimNow(t, s)
	files := o.segmentFiles()
	for f := range bSegs {
		if !slices.Contains(files, f) {
			t.Fatalf("segment %s holds batches of b but was deleted when a was dropped", f)
		}
	}
	if len(files) > len(bSegs)+1 {
		t.Fatalf("%d segment files left, b has batches in %d", len(files), len(bSegs))
	}
	checkFilesLive(t, o, s)
	b, _ = s.Range("b")
	sameRecords(t, "b after a was dropped", readAll(t, b), wantB)
	if err := b.SetHWM(0); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Truncate(0); err != nil {
		t.Fatalf("Truncate(0) = %v", err)
	}
	reclaimNow(t, s)
	if files := o.segmentFiles(); len(files) != 1 {
		t.Fatalf("segment files %v left once no range has a batch, want only the highest", files)
	}
	closeStore(t, s)
	s = o.open()
	defer closeStore(t, s)
	if n := livePointers(s); n != 0 {
		t.Fatalf("%d live pointers after reopening an empty store", n)
	}
}

// A crash right after segments were deleted loses nothing: no durable
// pointer names a deleted file, and Open reads every record left.
func TestCrashAfterSegmentDeletion(t *testing.T) {
	defer logstore.SetSegmentBytes(4 << 10)()
	o := newOpener(t)
	s := o.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	appendBig(t, s, r, 20)
	want := readAll(t, r)[:6]
	if _, err := r.Truncate(6); err != nil {
		t.Fatalf("Truncate(6) = %v", err)
	}
	reclaimNow(t, s)
	left := o.segmentFiles()
	losePower(t, s)

	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	sameRecords(t, "after a power loss right after the deletion", readAll(t, r), want)
	checkConsistent(t, r)
	checkStoredBytes(t, s, r)
	for _, f := range o.segmentFiles() {
		if !slices.Contains(left, f) {
			t.Fatalf("segment %s appeared after the power loss", f)
		}
	}
	appendBig(t, s, r, 2)
	if got := len(readAll(t, r)); got != 10 {
		t.Fatalf("%d records after appending 4 to 6", got)
	}
}

// RetainBytes answers the lowest batch boundary from which the stored
// bytes to the log end are within the limit.
func TestRetainBytes(t *testing.T) {
	o := newOpener(t)
	s := o.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1) // batch [0, 1): the epoch-start record, 5 + 4 + 13 bytes
	for range 10 {
		appendN(t, r, 1, 1) // batches [1, 2) ... [10, 11): 5 + 4 + 13 + len("r1/N") bytes
	}
	waitDurable(t, r, 11)
	indexNow(t, s)
	const es = 22
	batch := func(off uint64) uint64 { return uint64(22 + len(value("r1", off))) }
	var total uint64 = es
	for off := uint64(1); off <= 10; off++ {
		total += batch(off)
	}
	if got := r.StoredBytes(); got != total {
		t.Fatalf("StoredBytes() = %d, want %d", got, total)
	}
	checkStoredBytes(t, s, r)
	// bytes of the batches from off to the end
	from := func(off uint64) uint64 {
		var n uint64
		for o := off; o <= 10; o++ {
			n += batch(o)
		}
		return n
	}
	for _, c := range []struct {
		limit, want uint64
	}{
		{total + 100, 0},
		{total, 0},
		{total - 1, 1},
		{from(1), 1},
		{from(1) - 1, 2},
		{from(8), 8},
		{from(7) - 1, 8},
		{batch(10), 10},
		{batch(10) - 1, 11},
		{0, 11},
	} {
		if got := r.RetainBytes(c.limit); got != c.want {
			t.Errorf("RetainBytes(%d) = %d, want %d (stored %d)", c.limit, got, c.want, total)
		}
	}
	// A cut lowers the count by what it removed.
	if _, err := r.Truncate(5); err != nil {
		t.Fatal(err)
	}
	if got, want := r.StoredBytes(), total-from(5); got != want {
		t.Fatalf("StoredBytes() after Truncate(5) = %d, want %d", got, want)
	}
	if got := r.RetainBytes(batch(4)); got != 4 {
		t.Fatalf("RetainBytes(%d) after Truncate(5) = %d, want 4", batch(4), got)
	}
	closeStore(t, s)
	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	if got, want := r.StoredBytes(), total-from(5); got != want {
		t.Fatalf("StoredBytes() after a reopen = %d, want %d", got, want)
	}
}

// fakeClock is an injectable Options.Now.
type fakeClock struct{ ms atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.UnixMilli(c.ms.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ms.Add(d.Milliseconds()) }
func (c *fakeClock) at(ms int64) time.Time   { return time.UnixMilli(ms) }

// RetainSince answers from persisted time marks: the offset below which
// every record was written before t, conservatively; marks survive a
// reopen, and a truncation removes those above its cut.
func TestRetainSince(t *testing.T) {
	clock := &fakeClock{}
	const t0 = 1_700_000_000_000
	clock.ms.Store(t0)
	o := newOpener(t)
	o.opts.Now = clock.now
	s := o.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	waitDurable(t, r, 1)
	indexNow(t, s) // mark (1, t0)
	for i := 1; i <= 5; i++ {
		clock.advance(2 * time.Second)
		appendN(t, r, 1, 1)
		waitDurable(t, r, r.LogEnd())
		indexNow(t, s) // mark (i+1, t0+2000i)
	}
	check := func(when string, cases [][2]uint64) {
		t.Helper()
		for _, c := range cases {
			if got := r.RetainSince(clock.at(int64(c[0]))); got != c[1] {
				t.Errorf("%s: RetainSince(t0%+d ms) = %d, want %d", when, int64(c[0])-t0, got, c[1])
			}
		}
	}
	cases := [][2]uint64{
		{t0 - 5000, 0}, // before every record: nothing
		{t0, 0},        // the epoch start's mark is not strictly older
		{t0 + 1, 1},
		{t0 + 2000, 1},
		{t0 + 2001, 2},
		{t0 + 7000, 4},
		{t0 + 10001, 6},
		{t0 + 1e9, 6}, // everything, never past the log end
	}
	check("running", cases)
	closeStore(t, s)
	s = o.open()
	r, _ = s.Range("r1")
	check("after a reopen", cases)

	// A cut removes the marks above it: the records written there next
	// are new.
	if _, err := r.Truncate(3); err != nil {
		t.Fatal(err)
	}
	check("after Truncate(3)", [][2]uint64{{t0 + 2001, 2}, {t0 + 1e9, 3}})
	clock.advance(2 * time.Second)
	appendN(t, r, 1, 2)
	waitDurable(t, r, 5)
	indexNow(t, s)
	check("after appending at the cut", [][2]uint64{{t0 + 12000, 3}, {t0 + 12001, 5}, {t0 + 1e6, 5}})
	closeStore(t, s)
	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	check("after the cut and a reopen", [][2]uint64{{t0 + 12000, 3}, {t0 + 12001, 5}, {t0 + 1e6, 5}})

	// A dropped range's marks go with it.
	if _, err := s.DropRange("r1"); err != nil {
		t.Fatal(err)
	}
	r = mustRange(t, s, "r1")
	lead(t, r, 1)
	appendN(t, r, 1, 3)
	if got := r.RetainSince(clock.at(t0 + 1e9)); got != 0 {
		t.Fatalf("RetainSince on a range created again = %d, want 0 (no mark of the dropped one)", got)
	}
}

// A store without marks (written before they existed) answers the log
// start: nothing is known to be old.
func TestRetainSinceWithoutMarks(t *testing.T) {
	o := newOpener(t)
	s := o.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	appendN(t, r, 1, 5)
	waitDurable(t, r, 6)
	closeStore(t, s)
	db := o.rawDB()
	if err := db.DropPrefix([]byte("m/")); err != nil {
		t.Fatal(err)
	}
	_ = db.Close()
	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	if got := r.RetainSince(time.Now().Add(time.Hour)); got != r.LogStart() {
		t.Fatalf("RetainSince with no marks = %d, want the log start %d", got, r.LogStart())
	}
}

// countMarks counts range id's m/ keys in the closed store.
func (o *opener) countMarks(id string) int {
	o.t.Helper()
	db := o.rawDB()
	defer db.Close()
	n := 0
	_ = db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte("m/" + id + "/")})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			n++
		}
		return nil
	})
	return n
}

// A range's marks stay bounded however long it writes, thinned from the
// oldest, and every answer stays conservative: never above the first
// record written at or after t.
func TestTimeMarksBounded(t *testing.T) {
	clock := &fakeClock{}
	const t0 = 1_700_000_000_000
	clock.ms.Store(t0)
	o := newOpener(t)
	o.opts.Now = clock.now
	s := o.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	waitDurable(t, r, 1)
	indexNow(t, s)
	// written[off] is when record off was written (the clock at its append).
	written := []int64{t0}
	const n = 3 * logstore.MarkMax / 2
	for range n {
		clock.advance(2 * time.Second)
		written = append(written, clock.ms.Load())
		appendN(t, r, 1, 1)
		waitDurable(t, r, r.LogEnd())
		indexNow(t, s)
	}
	if got := r.MarkCount(); got > logstore.MarkMax || got < logstore.MarkMax/2 {
		t.Fatalf("%d marks after %d marked commits, want at most %d (and not thinned to nothing)", got, n+1, logstore.MarkMax)
	}
	checkAnswers := func(when string) {
		t.Helper()
		for ms := int64(t0 - 1000); ms <= written[len(written)-1]+3000; ms += 700 {
			got := r.RetainSince(clock.at(ms))
			for off := uint64(0); off < got; off++ {
				if written[off] >= ms {
					t.Fatalf("%s: RetainSince(t0%+d ms) = %d, but record %d was written at t0%+d ms", when, ms-t0, got, off, written[off]-t0)
				}
			}
		}
		// The newest answers are exact to a mark.
		if got := r.RetainSince(clock.at(written[len(written)-1] + 1)); got != r.LogEnd() {
			t.Fatalf("%s: RetainSince(after the last write) = %d, want the log end %d", when, got, r.LogEnd())
		}
	}
	checkAnswers("running")
	marks := r.MarkCount()
	closeStore(t, s)
	if got := o.countMarks("r1"); got != marks {
		t.Fatalf("%d m/ keys persisted, %d marks in memory", got, marks)
	}
	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	checkAnswers("after a reopen")
}

// DiskUsage reports each part's bytes, and the segments' part shrinks once
// a cut's files are reclaimed.
func TestDiskUsage(t *testing.T) {
	defer logstore.SetSegmentBytes(4 << 10)()
	o := newOpener(t)
	s := o.open()
	defer closeStore(t, s)
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	appendBig(t, s, r, 20)
	u := s.DiskUsage()
	if u.Segments < 20*1400 || u.WAL == 0 || u.Badger == 0 || u.Journals == 0 {
		t.Fatalf("DiskUsage() = %+v after 20 batches of 1.4 KiB", u)
	}
	if u.Total() != u.Segments+u.WAL+u.Badger+u.Journals {
		t.Fatalf("Total() = %d for %+v", u.Total(), u)
	}
	if _, err := r.Truncate(3); err != nil {
		t.Fatal(err)
	}
	reclaimNow(t, s)
	if after := s.DiskUsage(); after.Segments > u.Segments/3 {
		t.Fatalf("segments take %d bytes after cutting all but 3 records, %d before", after.Segments, u.Segments)
	}
}
