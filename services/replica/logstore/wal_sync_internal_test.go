package logstore

import (
	"encoding/binary"
	"io"
	"log/slog"
	"os"
	"testing"
)

// A WAL sync counts as synced only the pass it was taken in. One taken in
// a file's pass that ends after two switches have brought the writer back
// to that file, in a new pass already longer than the offset it was taken
// at, says nothing of the new pass, begun after the sync was taken.
// Counted for the new pass, the offset went into the next entry's
// w/synced, and a crash that tore an entry below it (never synced, so
// free to tear) made Open refuse the store with ErrWALDamaged, the advice
// being to treat the disk as replaced.
func TestWALSyncCountsOnlyItsOwnPass(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	w := s.wal
	// Entries under a key of no prefix the store uses: they reach Badger
	// inline at a checkpoint, and nothing reads them.
	fill := func(n int) {
		t.Helper()
		ib := &indexBatch{keys: [][]byte{[]byte("z/filler")}, vals: [][]byte{make([]byte, n)}}
		if err := s.appendWAL(ib); err != nil {
			t.Fatal(err)
		}
	}
	pos := func() (int, int64) {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.cur, w.files[w.cur].pos
	}
	fill(4096)
	file, taken := pos()
	ran := false
	hook := func() {
		walSyncHook.Store(nil)
		// Two switches: to the other file, then back to this one.
		for range 2 {
			if err := s.forceCheckpoint(); err != nil {
				t.Error(err)
				return
			}
		}
		if cur, p := pos(); cur != file || p != 0 {
			t.Errorf("after two switches the writer is at file %d offset %d, want file %d offset 0", cur, p, file)
			return
		}
		ran = true
		// The new pass grows past where the sync was taken.
		for {
			if _, p := pos(); p > taken {
				break
			}
			fill(100)
		}
	}
	walSyncHook.Store(&hook)
	defer walSyncHook.Store(nil)
	if err := s.syncWAL(); err != nil {
		t.Fatal(err)
	}
	if !ran {
		t.Fatal("the hook did not run")
	}
	w.mu.Lock()
	synced := w.files[file].synced
	w.mu.Unlock()
	if synced != 0 {
		t.Errorf("the new pass counts %d bytes synced, want 0: no sync was taken in it", synced)
	}

	// What a crash could leave: the new pass's second entry torn (no sync
	// covered it), the entries after it whole, the last one written after
	// the sync's bookkeeping.
	fill(100)
	data, err := os.ReadFile(walPath(dir, file))
	if err != nil {
		t.Fatal(err)
	}
	first := walHeaderBytes + int(binary.BigEndian.Uint32(data[8:12]))
	data[first+walHeaderBytes+20] ^= 0x10
	p := walPassOf(t, data)
	if len(p.payloads) != 1 || p.damage != nil {
		t.Errorf("walEntries of the pass torn at its second entry = %d entries, damage %v; want 1 entry and a torn tail, not damage", len(p.payloads), p.damage)
	}
}
