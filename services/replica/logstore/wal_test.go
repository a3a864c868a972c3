package logstore_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// crashable is an opener whose store fails at its next group commit once
// crash is called: Close then writes nothing more, as after a real crash.
type crashable struct {
	*opener
	armed atomic.Bool
}

func newCrashable(t *testing.T) *crashable {
	c := &crashable{opener: newOpener(t)}
	c.opts.CrashAt = func(point string) error {
		if point == logstore.CrashCommitWrite && c.armed.Load() {
			return errors.New("crash")
		}
		return nil
	}
	return c
}

// crash fails s at its next commit and closes it.
func (c *crashable) crash(s *logstore.Store, r *logstore.Range, epoch uint64) {
	c.t.Helper()
	c.armed.Store(true)
	if _, err := r.Append(epoch, false, [][]byte{[]byte("lost")}); err == nil {
		c.t.Fatal("Append after the crash point succeeded")
	}
	// Close after a failure writes nothing (and reports nothing new).
	_ = s.Close()
	c.armed.Store(false)
}

// loseRecords deletes range id's records [from, to) from the closed store's
// Badger database: what a power loss does to writes Badger never synced.
func (o *opener) loseRecords(id string, from, to uint64) {
	o.t.Helper()
	o.editDB(func(txn *badger.Txn) error {
		for off := from; off < to; off++ {
			if err := txn.Delete(logKey(id, off)); err != nil {
				return err
			}
		}
		return nil
	})
}

// crashedAfter leaves a crashed store whose range r1 leads epoch 1 and holds
// the epoch-start record then n records, all durable, appended in batches
// of at most batch, and returns the records.
func crashedAfter(t *testing.T, n, batch int) (*crashable, []*tenurev1.Record) {
	c := newCrashable(t)
	s := c.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	for done := 0; done < n; done += batch {
		appendN(t, r, 1, min(batch, n-done))
	}
	waitDurable(t, r, uint64(n)+1)
	want := readAll(t, r)
	c.crash(s, r, 1)
	return c, want
}

// reopen opens the crashed store, closed when the test ends, and checks r1's
// log end and its consistency.
func (c *crashable) reopen(wantEnd uint64) *logstore.Range {
	c.t.Helper()
	s := c.open()
	c.t.Cleanup(func() { closeStore(c.t, s) })
	r, _ := s.Range("r1")
	if r.LogEnd() != wantEnd {
		c.t.Fatalf("LogEnd after reopening = %d, want %d", r.LogEnd(), wantEnd)
	}
	checkConsistent(c.t, r)
	return r
}

// A group commit is durable once it is in the WAL: records Badger lost
// (it is never synced for a group commit) come back from it at Open, byte
// for byte, and the range's log end is where it was.
func TestOpenReplaysWhatBadgerLost(t *testing.T) {
	c, want := crashedAfter(t, 20, 5)
	c.loseRecords("r1", 7, 21)
	sameRecords(t, "after replay", readAll(t, c.reopen(21)), want)
}

// Truncate checkpoints the WAL before it cuts: a replay after a later
// crash must not write the cut records back (they are in the WAL, which
// made them durable before the cut).
func TestReplayDoesNotUndoTruncate(t *testing.T) {
	c := newCrashable(t)
	s := c.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	appendN(t, r, 1, 10)
	waitDurable(t, r, 11)
	if _, err := r.Truncate(5); err != nil {
		t.Fatalf("Truncate(5) = %v", err)
	}
	c.crash(s, r, 1)
	c.reopen(5)
}

// The WAL's two files alternate, each overwritten in place once the other
// is checkpointed, so they stay near walSwitchBytes however much is
// written; a replay after many switches still restores the newest batch.
func TestWALSwitchesFilesAndStaysBounded(t *testing.T) {
	const switchAt, zeroAhead = 16 << 10, 2 << 10
	defer logstore.SetWALSizes(switchAt, zeroAhead)()
	c := newCrashable(t)
	s := c.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	// A file grows past the switch size while the other one's checkpoint
	// runs, by however many batches arrive meanwhile; one batch at a time
	// keeps the bound below exact on a loaded box.
	const batches = 200 // ~200 KiB: a dozen switches
	appendAcrossSwitches(t, s, r, batches)
	end := r.AssignedEnd()
	waitDurable(t, r, end)
	want := readAll(t, r)
	c.crash(s, r, 1)
	for i := range 2 {
		fi, err := os.Stat(filepath.Join(c.dir, fmt.Sprintf("wal.%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		// The switch size plus the entry that crossed it (and an HWM
		// entry or two) and the zeros ahead of it.
		if fi.Size() > switchAt+4<<10+zeroAhead {
			t.Errorf("wal.%d is %d bytes after %d KiB written, switching at %d", i, fi.Size(), batches, switchAt)
		}
	}
	c.loseRecords("r1", end-1, end)
	sameRecords(t, "after replay", readAll(t, c.reopen(end)), want)
}

// A torn or garbage WAL tail ends the replay; it never fails the Open or
// writes anything it did not check.
func TestReplayStopsAtATornTail(t *testing.T) {
	c, want := crashedAfter(t, 10, 10)
	for i := range 2 {
		f, err := os.OpenFile(filepath.Join(c.dir, fmt.Sprintf("wal.%d", i)), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		// A header claiming a huge entry, then junk.
		if _, err := f.Write(append(bytes.Repeat([]byte{0, 0, 0, 0, 0, 0, 0, 1, 0x7f}, 3), "junk"...)); err != nil {
			t.Fatal(err)
		}
		_ = f.Close()
	}
	c.loseRecords("r1", 3, 11)
	sameRecords(t, "after replay", readAll(t, c.reopen(11)), want)
}

// PowerLoss drops what a machine losing power could drop, and Open
// recovers every record that was durable: Badger's copies of them are
// gone, so only the WAL's replay brings them back.
func TestPowerLossKeepsWhatWasDurable(t *testing.T) {
	o := newOpener(t)
	s := o.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	for range 6 {
		appendN(t, r, 1, 5)
	}
	waitDurable(t, r, 31)
	// More, not waited for: they may or may not survive.
	for range 4 {
		appendN(t, r, 1, 5)
	}
	durable := r.DurableEnd()
	want := readAll(t, r)
	losePower(t, s)
	db := o.rawDB()
	err := db.View(func(txn *badger.Txn) error {
		_, err := txn.Get(logKey("r1", durable-1))
		return err
	})
	_ = db.Close()
	if !errors.Is(err, badger.ErrKeyNotFound) {
		t.Fatalf("record %d is still in Badger after the power loss (%v): the test would not exercise the replay", durable-1, err)
	}

	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	if r.LogEnd() < durable {
		t.Fatalf("LogEnd after the power loss = %d, below the durable end %d", r.LogEnd(), durable)
	}
	sameRecords(t, "after the power loss", readAll(t, r), want[:r.LogEnd()])
	checkConsistent(t, r)
}

// The WAL is extended with zeros ahead of its entries, so that most syncs
// overwrite bytes already on disk instead of growing the file.
func TestWALZeroesAhead(t *testing.T) {
	const zeroAhead = 8 << 10
	defer logstore.SetWALSizes(64<<20, zeroAhead)()
	o := newOpener(t)
	s := o.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	waitDurable(t, r, 1)
	fi, err := os.Stat(filepath.Join(o.dir, "wal.0"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() < zeroAhead {
		t.Fatalf("wal.0 is %d bytes after one small entry, want at least the %d zeroed ahead", fi.Size(), zeroAhead)
	}
	closeStore(t, s)
}

// A Truncate that arrives while a WAL checkpoint runs waits for the
// checkpoint after it, which starts when the running one ends. (It once
// waited for one switch too many, which nobody made: the mass-failover
// benchmark's followers hung in Truncate for minutes, holding their
// ranges' locks.)
func TestTruncateDuringACheckpoint(t *testing.T) {
	defer logstore.SetWALSizes(16<<10, 2<<10)()
	o := newOpener(t)
	var hold atomic.Bool
	held := make(chan struct{}, 1)
	release := make(chan struct{})
	o.opts.CrashAt = func(p string) error {
		if p == logstore.CrashWALCheckpoint && hold.CompareAndSwap(true, false) {
			held <- struct{}{}
			<-release
		}
		return nil
	}
	// Closed only on success: a Truncate that hangs would hang Close too.
	s := o.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	appendN(t, r, 1, 10)
	hold.Store(true)
	// Past the switch size: the writer switches, and its checkpoint holds.
	// The checkpoint starts on a goroutine of its own, and an append
	// returns once its WAL entry is written (no Badger commit), so each
	// append waits a moment for it: a count of appends alone raced it.
	deadline := time.Now().Add(10 * time.Second)
	for len(held) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("appended for 10 s and no checkpoint started")
		}
		if _, err := r.Append(1, false, [][]byte{make([]byte, 1024)}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	done := make(chan error, 1)
	go func() {
		_, err := r.Truncate(5)
		done <- err
	}()
	deadline = time.Now().Add(10 * time.Second)
	for !s.WALSwitchWanted() {
		if time.Now().After(deadline) {
			close(release)
			t.Fatal("Truncate never asked for a checkpoint")
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Truncate(5) = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Truncate did not return: it waits for a checkpoint nobody starts")
	}
	if r.LogEnd() != 5 {
		t.Fatalf("LogEnd after Truncate(5) = %d", r.LogEnd())
	}
	closeStore(t, s)
}

// heldCheckpoints is an opener whose WAL checkpoints, once hold is set,
// wait at their start until release is closed; entered receives once per
// checkpoint held.
type heldCheckpoints struct {
	*opener
	hold    atomic.Bool
	fail    atomic.Bool // the next group commit fails the store
	entered chan struct{}
	release chan struct{}
}

func newHeldCheckpoints(t *testing.T) *heldCheckpoints {
	h := &heldCheckpoints{opener: newOpener(t), entered: make(chan struct{}, 16), release: make(chan struct{})}
	h.opts.CrashAt = func(point string) error {
		switch {
		case point == logstore.CrashWALCheckpoint && h.hold.Load():
			h.entered <- struct{}{}
			<-h.release
		case point == logstore.CrashCommitWrite && h.fail.Load():
			return errors.New("crash")
		}
		return nil
	}
	return h
}

// waitEntered waits, bounded, for a held checkpoint to start.
func (h *heldCheckpoints) waitEntered() {
	h.t.Helper()
	select {
	case <-h.entered:
	case <-time.After(10 * time.Second):
		h.t.Fatal("no WAL checkpoint started within 10s")
	}
}

// walGen reads w/gen, the oldest WAL generation Open replays, from the
// closed store.
func (o *opener) walGen() uint64 {
	o.t.Helper()
	db := o.rawDB()
	defer db.Close()
	var gen uint64
	err := db.View(func(txn *badger.Txn) error {
		item, err := txn.Get([]byte("w/gen"))
		if err != nil {
			return err
		}
		return item.Value(func(b []byte) error {
			gen = binary.BigEndian.Uint64(b) // v u64 | crc u32
			return nil
		})
	})
	if err != nil {
		o.t.Fatal(err)
	}
	return gen
}

// A switch right after Open leaves the generation Open started empty and
// the next one holding durable batches until its checkpoint ends; a power
// loss before that must still replay them, past the empty generation.
func TestReplayPassesAnEmptyGeneration(t *testing.T) {
	h := newHeldCheckpoints(t)
	s := h.open()
	r1 := mustRange(t, s, "r1")
	lead(t, r1, 1)
	appendN(t, r1, 1, 4)
	r2 := mustRange(t, s, "r2")
	lead(t, r2, 1)
	waitDurable(t, r1, 5)
	waitDurable(t, r2, 1)
	closeStore(t, s)

	s = h.open() // writes to a new generation, still empty
	r1, _ = s.Range("r1")
	r2, _ = s.Range("r2")
	h.hold.Store(true)
	truncated := make(chan error, 1)
	go func() { // its forced checkpoint switches files at once, then waits
		_, err := r1.Truncate(3)
		truncated <- err
	}()
	h.waitEntered()
	appendN(t, r2, 1, 5) // into the generation after the empty one
	waitDurable(t, r2, 6)
	want := readAll(t, r2)
	after := s.PowerLoss()
	close(h.release)
	if err := <-truncated; err == nil {
		t.Fatal("Truncate across a power loss succeeded")
	}
	_ = s.Close()
	if err := after(); err != nil {
		t.Fatalf("PowerLoss: %v", err)
	}
	h.hold.Store(false)
	s = h.open()
	defer closeStore(t, s)
	r2, _ = s.Range("r2")
	if r2.LogEnd() != 6 {
		t.Fatalf("r2's LogEnd after the power loss = %d, want 6: records durable in the WAL were not replayed", r2.LogEnd())
	}
	sameRecords(t, "after the power loss", readAll(t, r2), want)
}

// A store that failed writes nothing more, and a checkpoint running when
// it failed does not move w/gen: the batches of the generation it would
// retire may never have reached Badger.
func TestCheckpointAfterAFailureKeepsTheGeneration(t *testing.T) {
	defer logstore.SetWALSizes(16<<10, 2<<10)()
	h := newHeldCheckpoints(t)
	s := h.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	waitDurable(t, r, 1)
	h.hold.Store(true)
	// 40 KiB: the WAL switches files at 16 KiB, and no more while the
	// checkpoint that switch started is held.
	for range 40 {
		if _, err := r.Append(1, false, [][]byte{make([]byte, 1024)}); err != nil {
			t.Fatal(err)
		}
	}
	h.waitEntered()
	// Nothing waits to be indexed: the checkpoint would find its work done.
	if err := s.IndexNow(); err != nil {
		t.Fatal(err)
	}
	h.fail.Store(true)
	if _, err := r.Append(1, false, [][]byte{[]byte("fails the store")}); err == nil {
		t.Fatal("Append at the crash point succeeded")
	}
	close(h.release)
	s.WaitWALCheckpoint()
	_ = s.Close()
	// Open started generation 1, the switch generation 2; w/gen stays 1.
	if gen := h.walGen(); gen != 1 {
		t.Fatalf("w/gen after a checkpoint of a failed store = %d, want 1", gen)
	}
}

// flipInWAL flips one bit of the first occurrence of needle in the closed
// store's WAL files, as a disk that damaged synced bytes would, and returns
// the file it changed and that file's bytes after the change.
func (o *opener) flipInWAL(needle []byte) (string, []byte) {
	o.t.Helper()
	for i := range 2 {
		path := filepath.Join(o.dir, fmt.Sprintf("wal.%d", i))
		b, err := os.ReadFile(path)
		if err != nil {
			o.t.Fatal(err)
		}
		if at := bytes.Index(b, needle); at >= 0 {
			b[at] ^= 0x01
			if err := os.WriteFile(path, b, 0o644); err != nil {
				o.t.Fatal(err)
			}
			return path, b
		}
	}
	o.t.Fatalf("%q is in neither WAL file", needle)
	return "", nil
}

// A bit that flips on the disk inside a WAL entry that was synced is
// damage, not a torn tail: the batches from there on were durable (and
// acknowledged), and replaying only up to it would serve a copy with fewer
// records than it acknowledged, one that still counts as the member. Open
// refuses, names the file and the offset, and changes nothing. (It used to
// stop the replay there and open with the log cut short.)
func TestReplayRefusesADamagedSyncedEntry(t *testing.T) {
	c := newCrashable(t)
	s := c.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	// One batch at a time, each durable before the next is written: every
	// entry after a batch's records its sync.
	for range 10 {
		appendN(t, r, 1, 1)
		waitDurable(t, r, r.LogEnd())
	}
	c.crash(s, r, 1)
	// Badger lost what it was never made to sync: only the WAL has it.
	c.loseRecords("r1", 3, 11)
	path, damaged := c.flipInWAL(value("r1", 4))

	_, err := logstore.Open(c.dir, c.opts)
	if !errors.Is(err, logstore.ErrWALDamaged) || !errors.Is(err, logstore.ErrCorrupt) {
		t.Fatalf("Open with a damaged synced WAL entry = %v, want ErrWALDamaged (an ErrCorrupt)", err)
	}
	for _, want := range []string{path, "completed fdatasync", "replaced disk", "tenurectl range rebuild"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open's error does not say %q: %v", want, err)
		}
	}
	if b, err := os.ReadFile(path); err != nil || !bytes.Equal(b, damaged) {
		t.Errorf("Open changed %s (%v): a refusal must leave the evidence", path, err)
	}
}

// The same flip in the last entry, or in an entry no later entry records
// as synced, is indistinguishable from a torn tail and ends the replay, as
// a crash's torn tail does: nothing after it was ever acknowledged by this
// store (a later sync would have been recorded). The last batch here was
// never waited for.
func TestReplayStopsAtAnUnwitnessedDamagedEntry(t *testing.T) {
	c := newCrashable(t)
	s := c.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	appendN(t, r, 1, 5)
	waitDurable(t, r, 6)
	want := readAll(t, r)
	appendN(t, r, 1, 1) // record 6, the last entry
	c.crash(s, r, 1)
	c.loseRecords("r1", 1, 7)
	c.flipInWAL(value("r1", 6))
	sameRecords(t, "after replay", readAll(t, c.reopen(6)), want)
}

// With two generations to replay (a crash while the older one's checkpoint
// ran), damage in the older one's last entry has no later entry of its own
// to witness it, but the newer generation does: its first entry records
// where the older pass ended, and a sync it records covered all of that.
// Open refuses. (It used to replay the older pass up to the damage, then
// the newer one on top, and recovery cut the log at the hole: every
// record from the damaged one on, the newer generation's included, gone.)
func TestReplayRefusesAnOlderGenerationCutShort(t *testing.T) {
	defer logstore.SetWALSizes(16<<10, 2<<10)()
	h := newHeldCheckpoints(t)
	s := h.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	waitDurable(t, r, 1)
	h.hold.Store(true)
	// 1 KiB records, each durable before the next: the WAL switches at 16
	// KiB, and the held checkpoint keeps the first generation replayable.
	val := func(i int) []byte { return append(fmt.Appendf(nil, "rec-%04d-", i), make([]byte, 1000)...) }
	const n = 24
	for i := range n {
		if _, err := r.Append(1, false, [][]byte{val(i)}); err != nil {
			t.Fatal(err)
		}
		waitDurable(t, r, r.LogEnd())
	}
	h.waitEntered()
	h.fail.Store(true)
	if _, err := r.Append(1, false, [][]byte{[]byte("fails the store")}); err == nil {
		t.Fatal("Append at the crash point succeeded")
	}
	close(h.release)
	s.WaitWALCheckpoint()
	_ = s.Close()
	if gen := h.walGen(); gen != 1 {
		t.Fatalf("w/gen = %d, want 1: the test needs two generations to replay", gen)
	}
	// The last record the first generation (wal.0) holds.
	wal0, err := os.ReadFile(filepath.Join(h.dir, "wal.0"))
	if err != nil {
		t.Fatal(err)
	}
	last := -1
	for i := range n {
		if bytes.Contains(wal0, fmt.Appendf(nil, "rec-%04d-", i)) {
			last = i
		}
	}
	if last < 0 || last == n-1 {
		t.Fatalf("wal.0 holds records up to %d of %d: the test needs both files to hold some", last, n)
	}
	h.loseRecords("r1", 1, n+1)
	path, _ := h.flipInWAL(fmt.Appendf(nil, "rec-%04d-", last))
	_, err = logstore.Open(h.dir, h.opts)
	if !errors.Is(err, logstore.ErrWALDamaged) || !strings.Contains(err.Error(), path) {
		t.Fatalf("Open with the older generation's last synced entry damaged = %v, want ErrWALDamaged naming %s", err, path)
	}
}
