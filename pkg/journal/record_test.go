package journal_test

import (
	"bytes"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/pkg/journal/journaltest"
)

func TestRecordRules(t *testing.T) {
	type step struct {
		epoch, start uint64
		err          error // nil, or the sentinel the error must match
	}
	tests := []struct {
		name  string
		steps []step
		want  []journal.EpochStart
	}{
		{"first entry at any start", []step{{5, 1000, nil}}, es(5, 1000)},
		{"advancing epochs", []step{{1, 0, nil}, {2, 300, nil}, {7, 900, nil}}, es(1, 0, 2, 300, 7, 900)},
		// An epoch that wrote nothing before the next began.
		{"new epoch at the same start", []step{{1, 100, nil}, {2, 100, nil}}, es(1, 100, 2, 100)},
		// A polling watcher observes the same epoch over and over.
		{"latest pair again is a no-op", []step{{1, 0, nil}, {2, 50, nil}, {2, 50, nil}}, es(1, 0, 2, 50)},
		{"latest epoch at another start", []step{{1, 0, nil}, {2, 50, nil}, {2, 60, journal.ErrConflict}}, es(1, 0, 2, 50)},
		{"latest epoch at an earlier start", []step{{2, 50, nil}, {2, 40, journal.ErrConflict}}, es(2, 50)},
		// A late fetch answer from a deposed leader is stale, not a rewind.
		{"older epoch is ignored", []step{{1, 0, nil}, {3, 100, nil}, {2, 50, nil}}, es(1, 0, 3, 100)},
		{"older epoch at a later start is ignored", []step{{3, 100, nil}, {2, 500, nil}}, es(3, 100)},
		{"an earlier entry again is ignored", []step{{1, 0, nil}, {2, 100, nil}, {1, 0, nil}}, es(1, 0, 2, 100)},
		{"start below the latest", []step{{1, 100, nil}, {2, 50, journal.ErrConflict}}, es(1, 100)},
		{"epoch 0 first", []step{{0, 0, journal.ErrInvalid}}, nil},
		{"epoch 0 later", []step{{1, 0, nil}, {0, 5, journal.ErrInvalid}}, es(1, 0)},
		{"refused entry leaves the journal usable", []step{{1, 100, nil}, {2, 50, journal.ErrConflict}, {2, 150, nil}}, es(1, 100, 2, 150)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "r1.journal")
			j := mustOpen(t, path)
			for _, s := range tt.steps {
				err := j.Record(s.epoch, s.start)
				switch {
				case s.err == nil && err != nil:
					t.Fatalf("Record(%d, %d) = %v, want nil", s.epoch, s.start, err)
				case s.err != nil:
					wantErrIs(t, "Record", err, s.err)
				}
			}
			wantEntries(t, j, tt.want)
			// No-ops and refusals write nothing.
			if got := readFile(t, path); !bytes.Equal(got, image(tt.want...)) {
				t.Fatalf("file = %x, want %x", got, image(tt.want...))
			}
			_ = j.Close()
			wantEntries(t, mustOpen(t, path), tt.want)
		})
	}
}

// The entry is durable when Record returns: a crash right after it, without
// Close, keeps it.
func TestRecordIsDurableWhenItReturns(t *testing.T) {
	mem := journaltest.NewMemFS()
	j := mustOpenFS(t, mem, "r1.journal")
	mustRecord(t, j, es(1, 0, 2, 100)...)
	wantEntries(t, mustOpenFS(t, mem.Crash(), "r1.journal"), es(1, 0, 2, 100))
}

// Reads take the write lock: while Record's fsync is in flight, a reader
// waits, and then sees the durable entry. A reader that did not wait would
// either see the entry before it is durable, or see a history that is about
// to be stale as if it were current.
func TestReadsWaitForRecord(t *testing.T) {
	for _, read := range []struct {
		name string
		fn   func(*journal.Journal) []journal.EpochStart
	}{
		{"Entries", (*journal.Journal).Entries},
		{"Latest", func(j *journal.Journal) []journal.EpochStart {
			e, ok := j.Latest()
			if !ok {
				return nil
			}
			return []journal.EpochStart{e}
		}},
	} {
		t.Run(read.name, func(t *testing.T) {
			fsys := journaltest.NewFaultFS(journaltest.NewMemFS())
			j := mustOpenFS(t, fsys, "r1.journal")
			mustRecord(t, j, es(1, 0)...)

			inSync, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			// Let the blocked Record finish however the test ends, or the
			// cleanup's Close would wait for its lock forever.
			releaseOnce := sync.OnceFunc(func() { close(release) })
			defer releaseOnce()
			fsys.SetInjector(func(op journaltest.Op, _ string) error {
				if op == journaltest.OpSync {
					once.Do(func() { close(inSync); <-release })
				}
				return nil
			})
			recorded := make(chan error)
			go func() { recorded <- j.Record(2, 100) }()
			select {
			case <-inSync:
			case err := <-recorded:
				t.Fatalf("Record(2, 100) = %v without an fsync", err)
			}

			got := make(chan []journal.EpochStart)
			go func() { got <- read.fn(j) }()
			select {
			case g := <-got:
				t.Fatalf("%s() = %v while Record's fsync was in flight; want it to wait for the lock", read.name, g)
			case <-time.After(50 * time.Millisecond):
			}
			releaseOnce()
			if err := <-recorded; err != nil {
				t.Fatal(err)
			}
			if g := <-got; len(g) == 0 || g[len(g)-1] != (journal.EpochStart{Epoch: 2, Start: 100}) {
				t.Fatalf("%s() after the fsync = %v, want it to end with (2, 100)", read.name, g)
			}
		})
	}
}

// Concurrent writers and readers on a real file (run with -race): every
// snapshot obeys the history rules and no reader sees the history go back.
func TestConcurrentRecordAndReads(t *testing.T) {
	j := mustOpen(t, filepath.Join(t.TempDir(), "r1.journal"))
	const writers, readers, epochs = 4, 4, 100
	var wg, readersWG sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			// Writers race over the same epochs; start is a function of the
			// epoch, so every loser is a repeat or a stale observation.
			for e := uint64(1 + w%2); e <= epochs; e++ {
				if err := j.Record(e, e*10); err != nil {
					t.Errorf("Record(%d, %d) = %v", e, e*10, err)
					return
				}
			}
		})
	}
	done := make(chan struct{})
	for range readers {
		readersWG.Go(func() {
			var seen int
			var latest uint64
			for {
				select {
				case <-done:
					return
				default:
				}
				h := j.Entries()
				if err := checkRules(h); err != nil {
					t.Errorf("Entries() = %v: %v", h, err)
					return
				}
				if len(h) < seen {
					t.Errorf("Entries() shrank from %d to %d entries", seen, len(h))
					return
				}
				seen = len(h)
				if e, ok := j.Latest(); ok {
					if e.Epoch < latest || (len(h) > 0 && e.Epoch < h[len(h)-1].Epoch) {
						t.Errorf("Latest() = %v went back (previous latest epoch %d, entries %v)", e, latest, h)
						return
					}
					latest = e.Epoch
				}
			}
		})
	}
	wg.Wait()
	close(done)
	readersWG.Wait()

	h := j.Entries()
	if last := h[len(h)-1]; last != (journal.EpochStart{Epoch: epochs, Start: epochs * 10}) {
		t.Fatalf("last entry = %v, want (%d, %d)", last, epochs, epochs*10)
	}
	for _, e := range h {
		if e.Start != e.Epoch*10 {
			t.Fatalf("entry %v was never recorded by any writer", e)
		}
	}
}

func TestCloseStopsWrites(t *testing.T) {
	j := mustOpen(t, filepath.Join(t.TempDir(), "r1.journal"))
	mustRecord(t, j, es(1, 0)...)
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	wantErrIs(t, "Record after Close", j.Record(2, 10), journal.ErrClosed)
	wantErrIs(t, "TruncateFrom after Close", j.TruncateFrom(0), journal.ErrClosed)
	wantEntries(t, j, es(1, 0))
	if err := j.Close(); err != nil {
		t.Fatalf("second Close() = %v, want nil", err)
	}
}

func TestTruncateFrom(t *testing.T) {
	h := es(1, 0, 2, 100, 3, 100, 4, 250)
	tests := []struct {
		offset uint64
		want   []journal.EpochStart
	}{
		{0, nil},
		{50, es(1, 0)},
		// Epochs 2 and 3 both start at 100: a log cut at 100 holds nothing
		// of either.
		{100, es(1, 0)},
		{101, es(1, 0, 2, 100, 3, 100)},
		{250, es(1, 0, 2, 100, 3, 100)},
		// Epoch 4's first record at 250 survives a cut at 251.
		{251, h},
		{^uint64(0), h},
	}
	for _, tt := range tests {
		fsys := journaltest.NewFaultFS(journal.OSFS{})
		path := filepath.Join(t.TempDir(), "r1.journal")
		j := mustOpenFS(t, fsys, path)
		mustRecord(t, j, h...)
		syncs := fsys.Syncs()
		if err := j.TruncateFrom(tt.offset); err != nil {
			t.Fatalf("TruncateFrom(%d) = %v", tt.offset, err)
		}
		wantEntries(t, j, tt.want)
		if got := readFile(t, path); !bytes.Equal(got, image(tt.want...)) {
			t.Fatalf("TruncateFrom(%d): file = %x, want %x", tt.offset, got, image(tt.want...))
		}
		wantSyncs := int64(1)
		if len(tt.want) == len(h) {
			wantSyncs = 0 // nothing to cut, nothing to write
		}
		if got := fsys.Syncs() - syncs; got != wantSyncs {
			t.Fatalf("TruncateFrom(%d) issued %d fsyncs, want %d", tt.offset, got, wantSyncs)
		}
		// The journal stays appendable at the new end, and the reopen shows
		// the cut landed on an entry boundary.
		next := journal.EpochStart{Epoch: 9, Start: max(tt.offset, 250)}
		mustRecord(t, j, next)
		_ = j.Close()
		wantEntries(t, mustOpen(t, path), append(slices.Clone(tt.want), next))
	}
}
