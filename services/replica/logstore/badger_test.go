package logstore

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// syncSealedWALs fsyncs each rotated-away memtable WAL once, never the
// newest (db.Sync's), and forgets files Badger removed.
func TestSyncSealedWALs(t *testing.T) {
	dir := t.TempDir()
	s := &Store{badgerDir: dir, sealed: map[string]bool{}}
	touch := func(names ...string) {
		for _, n := range names {
			if err := os.WriteFile(filepath.Join(dir, n), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	sealed := func() []string { return slices.Sorted(maps.Keys(s.sealed)) }

	touch("00001.mem", "000001.vlog", "MANIFEST")
	if err := s.syncSealedWALs(); err != nil {
		t.Fatal(err)
	}
	if got := sealed(); len(got) != 0 {
		t.Fatalf("sealed with one WAL = %v, want none (it is the active one)", got)
	}
	touch("00002.mem", "00003.mem") // two rotations since the last sync
	if err := s.syncSealedWALs(); err != nil {
		t.Fatal(err)
	}
	if got := sealed(); !slices.Equal(got, []string{"00001.mem", "00002.mem"}) {
		t.Fatalf("sealed = %v, want [00001.mem 00002.mem]", got)
	}
	// 00001 was flushed to an SST and removed.
	if err := os.Remove(filepath.Join(dir, "00001.mem")); err != nil {
		t.Fatal(err)
	}
	if err := s.syncSealedWALs(); err != nil {
		t.Fatal(err)
	}
	if got := sealed(); !slices.Equal(got, []string{"00002.mem"}) {
		t.Fatalf("sealed after removal = %v, want [00002.mem]", got)
	}
}

// SetWALSizes lets the external tests switch WAL files after a few small
// batches and zero only a little ahead; the returned function restores
// both sizes.
func SetWALSizes(switchAt, zeroAhead int64) (restore func()) {
	oldSwitch, oldZero := walSwitchBytes, walZeroAheadBytes
	walSwitchBytes, walZeroAheadBytes = switchAt, zeroAhead
	return func() { walSwitchBytes, walZeroAheadBytes = oldSwitch, oldZero }
}

// HoldIndex keeps group commits out of Badger until a checkpoint, Close or
// IndexNow indexes them (index.go); the returned function restores the
// delay and the size bound.
func HoldIndex() (restore func()) {
	oldDelay, oldMax := indexDelay, indexMaxBytes
	indexDelay, indexMaxBytes = time.Hour, 1<<40
	return func() { indexDelay, indexMaxBytes = oldDelay, oldMax }
}

// SetMaxQueueBytes sets the queue's byte bound (commit.go), for the
// external tests; the returned function restores it.
func SetMaxQueueBytes(n int) (restore func()) {
	old := maxQueueBytes
	maxQueueBytes = n
	return func() { maxQueueBytes = old }
}

// IndexNow commits every group commit waiting to Badger.
func (s *Store) IndexNow() error { return s.indexPending() }

// CheckpointNow runs a WAL checkpoint and waits for it: nothing written
// before is replayed by Open any more.
func (s *Store) CheckpointNow() error { return s.forceCheckpoint() }

// WaitWALCheckpoint waits until no WAL checkpoint is running.
func (s *Store) WaitWALCheckpoint() {
	w := s.wal
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.checkpointing {
		w.cond.Wait()
	}
}

// WALSwitchWanted reports whether a caller waits for the running WAL
// checkpoint to end so that another one starts (forceCheckpoint).
func (s *Store) WALSwitchWanted() bool {
	s.wal.mu.Lock()
	defer s.wal.mu.Unlock()
	return s.wal.wantSwitch
}

// SetSyncDemandDelay sets how long writes of ranges that sync on demand
// wait for a demand (commit.go); the returned function restores it.
func SetSyncDemandDelay(d time.Duration) (restore func()) {
	old := syncDemandDelay
	syncDemandDelay = d
	return func() { syncDemandDelay = old }
}

// SetSyncedHook sets a function every sync calls after its fdatasync and
// before it publishes its ends as durable (commit.go); the returned
// function removes it.
func SetSyncedHook(h func(ends map[*Range]uint64)) (restore func()) {
	syncedHook.Store(&h)
	return func() { syncedHook.Store(nil) }
}

// StoredBatchForTest returns the batch stored under log key in the closed
// store in dir, whose Badger value is stored: stored itself, or the batch
// its pointer points to in the store's segments, verified.
func StoredBatchForTest(dir string, key, stored []byte) ([]byte, error) {
	g, err := openSegments(filepath.Join(dir, "segments"), 0)
	if err != nil {
		return nil, err
	}
	defer g.close()
	return (&Store{segs: g}).loadBatch(key, stored)
}

// SetSegmentBytes sets the size at which a segment file is full; the
// returned function restores it.
func SetSegmentBytes(n int64) (restore func()) {
	old := segmentBytes
	segmentBytes = n
	return func() { segmentBytes = old }
}
