package logstore

import (
	"os"
	"time"
)

// ReclaimNow runs a segment reclaim pass at once (reclaim.go) and returns
// how many files it deleted; a background pass may have deleted some
// already.
func (s *Store) ReclaimNow() (int, error) { return s.reclaimSegments() }

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
