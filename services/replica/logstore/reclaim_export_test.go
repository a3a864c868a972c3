package logstore

import (
	"os"
	"time"
)

// ReclaimNow runs a segment reclaim pass at once (reclaim.go) and returns
// how many files it deleted; a background pass may have deleted some
// already.
func (s *Store) ReclaimNow() (int, error) { return s.reclaimSegments() }

// RelocateNow runs a relocation pass at once (relocate.go), then a reclaim
// pass if it emptied a file, and returns how many files it emptied.
func (s *Store) RelocateNow() (int, error) { return s.relocateSegments() }

// SetRelocateMaxBytes bounds the live bytes a relocation pass copies; the
// returned function restores the bound.
func SetRelocateMaxBytes(n int64) (restore func()) {
	old := relocateMaxBytes
	relocateMaxBytes = n
	return func() { relocateMaxBytes = old }
}

// SetRelocateSwapHook sets a function a relocation pass calls between its
// copies' sync and its pointer swaps; the returned function removes it.
func SetRelocateSwapHook(h func()) (restore func()) {
	relocateSwapHook = h
	return func() { relocateSwapHook = nil }
}

// MarkCount is how many time marks range r holds.
func (r *Range) MarkCount() int { return r.markCount() }

// SetVlogGCInterval sets how often the reclaimer runs value-log GC, for
// stores opened after; the returned function restores it.
func SetVlogGCInterval(d time.Duration) (restore func()) {
	old := vlogGCInterval
	vlogGCInterval = d
	return func() { vlogGCInterval = old }
}

// RunValueLogGC runs one value-log GC round at once.
func (s *Store) RunValueLogGC() { s.runValueLogGC() }

// MarkMax is the bound on a range's time marks.
const MarkMax = markMax

// HoldSegmentSync makes the segments look as if a sync were fdatasyncing
// the files numbered files, from now until release: it holds what a sync
// holds (the sync lock, and those files' descriptors marked in use).
func (s *Store) HoldSegmentSync(files ...uint32) (release func()) {
	g := s.segs
	g.syncMu.Lock()
	g.mu.Lock()
	g.syncing = map[uint32]*os.File{}
	for _, n := range files {
		g.syncing[n] = g.files[n]
	}
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		g.syncing = nil
		g.mu.Unlock()
		g.syncMu.Unlock()
	}
}
