package logstore

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/dgraph-io/badger/v4"
)

// Relocating live batches out of mostly-free segment files.
//
// Segment files are shared by every range, and one is deleted only once
// no live pointer names it (reclaim.go). So one range that keeps its
// records long (or an idle range whose only batch since a leader change
// is its epoch-start record) keeps every file it has a batch in, and with
// it every other range's released bytes there: measured in a 40-minute
// soak of 160 ranges at 2 MiB of retention beside 40 on longer limits,
// 1.84 GB of segments per replica while the ranges held 0.64 GB. A
// range with a short retention could be made to keep a week of writes
// by a neighbour that keeps a week of a few records.
//
// The relocator (relocateSegments, run by the reclaimer every
// vlogGCInterval) copies the live batches of files whose live bytes are
// under relocateLiveShare of their size into the segment being written,
// then points their keys at the copies; the old file then has no live
// pointer and the reclaim pass deletes it. What makes that safe:
//
//   - The copies are durable before any pointer names them: segments.sync
//     after the write, before the pointer swap (a crash in between leaves
//     unnamed bytes in the new file, which cost space, never a record).
//   - A pointer is swapped only if the key still holds the very pointer
//     the copy was made from (compare and set), under the range's cutMu
//     held exclusively. Every path that deletes or rewrites a log key of a
//     live range holds cutMu (Truncate, ResetTo and DropRange exclusively,
//     AdvanceLogStart shared), the indexer writes a key only for a new
//     batch (never one that exists), and a pointer names a unique place
//     (segment numbers never repeat), so a key of a range dropped and
//     created again never holds the old pointer. A batch whose key moved
//     meanwhile keeps its new value; its copy is released.
//   - Readers of records hold the range's cutMu shared from before their
//     Badger view to after their last segment read (Read, EpochAt, the
//     producer scan), so none holds an old pointer once the swap has the
//     lock: a read that started before it ended before it.
//   - The old file is deleted by the reclaim pass, after a Badger sync
//     that starts after the swap was committed and its old pointers
//     released (releaseStored's rule): no durable pointer names it then.
//     A crash before that sync leaves Badger naming either copy, both on
//     disk.
//   - A replay of the WAL at Open writes its batches to a new segment and
//     overwrites their keys, as it always did; a relocated copy of one is
//     simply replaced.
//
// The cost is a write of the live bytes again: at under a quarter live, at
// least three bytes are freed for each one written, and a pass copies at
// most relocateMaxBytes, so a minute's pass bounds what it adds to the
// disk's load.

// relocateLiveShare is the share of a file's size under which its live
// batches are relocated: a quarter frees three bytes per byte copied.
const relocateLiveShare = 0.25

// relocateMaxBytes bounds the live bytes one pass copies (and holds in
// memory): 32 MiB a minute is a small part of what the disk writes under
// load. A variable so tests can make passes small.
var relocateMaxBytes int64 = 32 << 20

// relocateSwapHook, when set (tests only), runs between the copies' sync
// and the pointer swaps: the window where a cut or a release races the
// swap.
var relocateSwapHook func()

// relocated is one live batch being moved: its key, the pointer it was
// copied from, and the copy's pointer once written.
type relocated struct {
	key, from, to []byte
	batch         []byte
	// swapped: the key now names the copy (swapPointers).
	swapped bool
}

// relocateCandidates returns the files whose live bytes are under
// relocateLiveShare of their size, the emptiest first, up to
// relocateMaxBytes of live bytes in all (at least one file, however big its
// live part). Never the file being written, nor the highest numbered
// (kept so numbers never repeat: reclaimSegments).
func (g *segments) relocateCandidates() map[uint32]bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.use == nil || g.failed != nil {
		return nil
	}
	type cand struct {
		n     uint32
		live  int64
		share float64
	}
	var cands []cand
	for n, synced := range g.synced {
		if n == g.cur || n+1 >= g.next {
			continue
		}
		size := max(synced, g.dirty[n])
		u := g.use[n]
		if u == nil || u.ptrs == 0 || size <= 0 {
			continue // free already: the reclaim pass deletes it
		}
		if share := float64(u.bytes) / float64(size); share < relocateLiveShare {
			cands = append(cands, cand{n, u.bytes, share})
		}
	}
	slices.SortFunc(cands, func(a, b cand) int { return cmp.Compare(a.share, b.share) })
	out := map[uint32]bool{}
	var total int64
	for _, c := range cands {
		if len(out) > 0 && total+c.live > relocateMaxBytes {
			break
		}
		out[c.n] = true
		total += c.live
	}
	return out
}

// relocateSegments moves the live batches of mostly-free segment files
// (see above) and returns how many files it emptied. One pass at a time,
// with the reclaim pass (reclaimMu), which it runs after.
func (s *Store) relocateSegments() (int, error) {
	files, err := s.relocateOnce()
	if err != nil || files == 0 {
		return 0, err
	}
	_, err = s.reclaimSegments()
	return files, err
}

func (s *Store) relocateOnce() (int, error) {
	s.reclaimMu.Lock()
	defer s.reclaimMu.Unlock()
	cands := s.segs.relocateCandidates()
	if len(cands) == 0 {
		return 0, nil
	}
	end, err := s.begin()
	if err != nil {
		return 0, nil // closed
	}
	defer end()
	// A full disk does not stop a pass: it frees at least three bytes for
	// each it writes, and a write refused for want of space moves nothing
	// (segments.write) and fails only this pass.
	if s.writeErr() != nil {
		return 0, nil // failed: a reopen counts again
	}
	byRange, err := s.livePointersIn(cands)
	if err != nil {
		return 0, err
	}
	ids := make([]string, 0, len(byRange))
	for id := range byRange {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	// Read every batch first, with no lock held: a batch released
	// meanwhile (its file may even be gone) fails its read or, later, the
	// compare; either way it is not moved.
	type rangeMoves struct {
		r     *Range
		moves []*relocated
	}
	var byServed []rangeMoves
	var moves []*relocated
	for _, id := range ids {
		r, ok := s.Range(id)
		if !ok || r.quarantined != nil {
			continue // not served: its batches stay where they are
		}
		var mine []*relocated
		for _, m := range byRange[id] {
			b, err := s.segs.read(m.key, m.from)
			if err != nil {
				continue
			}
			m.batch = b
			mine = append(mine, m)
		}
		if len(mine) > 0 {
			byServed = append(byServed, rangeMoves{r, mine})
			moves = append(moves, mine...)
		}
	}
	if len(moves) == 0 {
		return 0, nil
	}
	if err := s.writeCopies(moves); err != nil {
		return 0, err
	}
	if h := relocateSwapHook; h != nil {
		h()
	}
	// Swap range by range, each under its cutMu. A failed swap leaves
	// that range's keys, and the later ranges', as they were.
	var swapErr error
	for _, rm := range byServed {
		if err := s.swapPointers(rm.r, rm.moves); err != nil {
			swapErr = fmt.Errorf("logstore: relocate batches of %s: %w", rm.r.ID(), err)
			break
		}
	}
	// Each batch is named by one pointer now: the copy where the key was
	// swapped (the old one is released), the old one elsewhere (the copy
	// is). After the commits (releaseStored's rule): the reclaim pass
	// syncs Badger before it deletes a file these releases free.
	var release [][]byte
	moved, bytesMoved := 0, int64(0)
	for _, m := range moves {
		if m.swapped {
			release = append(release, m.from)
			moved++
			bytesMoved += int64(len(m.batch))
		} else {
			release = append(release, m.to)
		}
	}
	s.segs.release(release)
	if swapErr != nil {
		return 0, swapErr
	}
	emptied := 0
	s.segs.mu.Lock()
	for n := range cands {
		if u := s.segs.use[n]; u == nil || u.ptrs == 0 {
			emptied++
		}
	}
	s.segs.mu.Unlock()
	s.log.Info("relocated live batches out of mostly-free segment files", "files", len(cands), "emptied", emptied, "batches", moved, "bytes", bytesMoved)
	return emptied, nil
}

// livePointersIn returns, by range, every log key whose pointer names one
// of files, in key order (one pass over the l/ keys, reading only the
// pointers the LSM tree holds, as buildAccounting does).
func (s *Store) livePointersIn(files map[uint32]bool) (map[string][]*relocated, error) {
	out := map[string][]*relocated{}
	err := s.eachStored(func(id string, key, b []byte) error {
		if n, _, ok := pointerSegment(b); ok && files[n] {
			out[id] = append(out[id], &relocated{key: bytes.Clone(key), from: bytes.Clone(b)})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("logstore: find batches to relocate: %w", err)
	}
	return out, nil
}

// writeCopies writes the moves' batches to the segment being written and
// makes them durable, setting each move's new pointer. The segments take
// one writer at a time: the indexer's lock is held for the write.
func (s *Store) writeCopies(moves []*relocated) error {
	keys, batches := make([][]byte, len(moves)), make([][]byte, len(moves))
	for i, m := range moves {
		keys[i], batches[i] = m.key, m.batch
	}
	s.indexMu.Lock()
	pointers, err := s.segs.write(keys, batches)
	s.indexMu.Unlock()
	if err != nil {
		if s.noteNoSpace(err) {
			// Refused whole, nothing counted: this pass moves nothing.
			return fmt.Errorf("%w: relocate batches: %w", ErrDiskFull, err)
		}
		// The segments failed (sticky): so does the store, as when the
		// indexer's write fails.
		return s.fail(fmt.Errorf("logstore: relocate batches: %w", err))
	}
	for i, m := range moves {
		m.to = pointers[i]
	}
	// Durable before any key names them.
	if err := s.segs.sync(); err != nil {
		s.segs.release(pointers)
		return s.fail(fmt.Errorf("logstore: relocate batches: %w", err))
	}
	return nil
}

// relocateTxnKeys bounds the keys one swap transaction sets, well under
// Badger's transaction size limit.
const relocateTxnKeys = 1024

// swapPointers points each move's key at its copy where the key still
// holds the pointer the copy was made from, under r's cutMu held
// exclusively (see above), and marks the moves it swapped. On an error the
// moves of the transactions that committed stay marked.
func (s *Store) swapPointers(r *Range, moves []*relocated) error {
	r.cutMu.Lock()
	defer r.cutMu.Unlock()
	for lo := 0; lo < len(moves); lo += relocateTxnKeys {
		chunk := moves[lo:min(lo+relocateTxnKeys, len(moves))]
		var set []*relocated
		err := s.db.Update(func(txn *badger.Txn) error {
			set = set[:0]
			for _, m := range chunk {
				item, err := txn.Get(m.key)
				if errors.Is(err, badger.ErrKeyNotFound) {
					continue // released since: cut, below a log start, dropped
				}
				if err != nil {
					return err
				}
				same := false
				if err := item.Value(func(b []byte) error {
					same = bytes.Equal(b, m.from)
					return nil
				}); err != nil {
					return err
				}
				if !same {
					continue
				}
				if err := txn.Set(m.key, m.to); err != nil {
					return err
				}
				set = append(set, m)
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, m := range set {
			m.swapped = true
		}
	}
	return nil
}
