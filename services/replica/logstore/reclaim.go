package logstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/tenurelog/tenure/pkg/journal"
)

// Reclaiming space.
//
// Segments. Every segment file has a live count: how many pointers under
// l/ keys refer to it, and their bytes. Open builds the counts from Badger
// after every recovery step (buildAccounting: one pass over every l/ key,
// reading only the 25-byte pointers the LSM tree holds, plus the bytes of
// batches Badger holds inline, which only stores written before segments
// and truncations inside a batch have; for a store of N batches that is N
// keys read, about 60 bytes each, a second or so per ten million). Then
// the indexer counts every pointer it writes (segments.write), and
// releaseStored takes off every pointer logstore deletes or overwrites
// (AdvanceLogStart, Truncate's cut and its rewrite of a straddling batch,
// DropRange). Pointers written before the accounting is built (Open's WAL
// replay) and released before it (Open's redos) are seen by the build
// itself. No other path overwrites a pointer: the indexer writes each
// batch's key once (a key is written again only after a cut or a drop
// deleted it), and the WAL holds batches, never pointers, so a replay
// never names an existing segment: it writes its batches to a new one.
//
// A segment with no live pointer that is neither the one being written nor
// the highest numbered (so file numbers never repeat across an Open) is
// deleted by the reclaim pass (reclaimSegments), in the background: first a
// Badger sync that starts after the pass collected it, which makes durable
// the deletes or rewrites of its last pointers (releaseStored runs after
// they were committed), then the file's removal and a sync of the
// directory. A crash anywhere leaves either the file (found with no
// pointer at the next Open and deleted then) or no durable pointer to it.
// A count only ever errs high (a pointer counted before its commit), which
// keeps a file, never deletes one early.
//
// Segments are shared by every range of the store, in write order: a file
// is freed once every range with batches in it has released them. A range
// that keeps everything (no retention) would keep every file it has
// batches in, and with them the other ranges' bytes there: the relocator
// (relocate.go) moves the live batches of files mostly free into the file
// being written, so that the old one can go.
//
// Badger. Keys deleted are Badger deletes. Its LSM tree drops a deleted
// key, and every older version of an overwritten one (NumVersionsToKeep
// 1), when a compaction rewrites the table holding it and no open
// transaction can still read it; a delete marker itself goes once no lower
// level overlaps it. Compactions run as levels fill, so under a steady
// write rate the tree stays near its live size; nothing forces one on an
// idle store. Measured with these options (2026-12-03): 3.2M log keys with
// 25-byte values written in rounds of 400k, all but the newest 50k deleted
// after each round: the SSTs stayed at 6.5 MB in 3 files from the second
// round on (5.2 MB after the first). Values in the value log (inline
// batches, 256 bytes and up) are reclaimed only by value-log GC, which the
// reclaimer runs every vlogGCInterval (runValueLogGC). Badger never
// rewrites the value-log file being written, and inline batches are rare
// now (a truncation inside a batch), so one file of 256 MiB may hold them
// for a long time; its discard counts come from compactions.

// vlogGCInterval is how often the reclaimer runs Badger's value-log GC; a
// variable so tests can run it at once.
var vlogGCInterval = time.Minute

// vlogGCMaxRewrites bounds the value-log files one GC round rewrites: each
// rewrite reads a file and writes its live values again, which on 2 cores
// competes with serving.
const vlogGCMaxRewrites = 4

// vlogGCDiscardRatio is the share of a value-log file that must be garbage
// for GC to rewrite it (Badger's recommended 0.5: rewriting a file half
// live costs as much as it frees).
const vlogGCDiscardRatio = 0.5

// segUse is one segment file's live pointers and their bytes.
type segUse struct {
	ptrs  int
	bytes int64
}

// SegmentUse is one segment file's live accounting, for tests and status.
type SegmentUse struct {
	Segment  uint32
	Pointers int
	Bytes    int64
}

// countLocked counts pointers written to segment n. g.mu is held.
func (g *segments) countLocked(n uint32, ptrs int, bytes int64) {
	if g.use == nil {
		return // Open's replay: the accounting is built after it
	}
	u := g.use[n]
	if u == nil {
		u = &segUse{}
		g.use[n] = u
	}
	u.ptrs += ptrs
	u.bytes += bytes
}

// takeKick reports (and clears) whether a file became deletable when a
// new one was started.
func (g *segments) takeKick() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := g.kick
	g.kick = false
	return k
}

// release takes the pointers among vals off their segments' counts and
// reports whether any segment reached zero.
func (g *segments) release(vals [][]byte) (freed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.use == nil {
		return false
	}
	for _, v := range vals {
		n, length, ok := pointerSegment(v)
		if !ok {
			continue
		}
		u := g.use[n]
		if u == nil || u.ptrs == 0 {
			// Released more than counted: a pointer the accounting never
			// saw. Never below zero (that would free a file early); log
			// nothing per key, it is harmless.
			continue
		}
		u.ptrs--
		u.bytes -= int64(length)
		if u.ptrs == 0 {
			freed = true
		}
	}
	return freed
}

// pointerSegment reads a pointer's segment and length fields without
// verifying it (its checksum covers the batch, which is not read here);
// ok is false for anything but a pointer.
func pointerSegment(v []byte) (n, length uint32, ok bool) {
	if len(v) != segmentPointerBytes || v[0] != segmentMagic {
		return 0, 0, false
	}
	return binary.BigEndian.Uint32(v[5:9]), binary.BigEndian.Uint32(v[17:21]), true
}

// storedSize is what a stored value occupies: a pointer's batch length in
// its segment, or the inline batch itself.
func storedSize(v []byte) uint64 {
	if _, length, ok := pointerSegment(v); ok {
		return uint64(length)
	}
	return uint64(len(v))
}

// logKeyRange returns the range id of a log key.
func logKeyRange(k []byte) (string, bool) {
	if !isLogKey(k) || k[len(k)-9] != '/' {
		return "", false
	}
	return string(k[len(prefixLog) : len(k)-9]), true
}

// SegmentUses returns the live accounting of every segment file the store
// knows (on disk or counted), by number.
func (s *Store) SegmentUses() []SegmentUse {
	g := s.segs
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []SegmentUse
	for n := uint32(1); n < g.next; n++ {
		u, counted := g.use[n]
		_, onDisk := g.synced[n]
		if !counted && !onDisk {
			continue
		}
		su := SegmentUse{Segment: n}
		if u != nil {
			su.Pointers, su.Bytes = u.ptrs, u.bytes
		}
		out = append(out, su)
	}
	return out
}

// buildAccounting counts, at Open after every recovery step, the live
// pointers of each segment and the stored bytes of each loaded range, in
// one pass over every l/ key (see "Reclaiming space" for the cost).
func (s *Store) buildAccounting() error {
	use := map[uint32]*segUse{}
	stored := map[string]int64{}
	err := s.eachStored(func(id string, _, b []byte) error {
		if n, length, ok := pointerSegment(b); ok {
			u := use[n]
			if u == nil {
				u = &segUse{}
				use[n] = u
			}
			u.ptrs++
			u.bytes += int64(length)
		}
		stored[id] += int64(storedSize(b))
		return nil
	})
	if err != nil {
		return fmt.Errorf("logstore: count stored batches: %w", err)
	}
	g := s.segs
	g.mu.Lock()
	g.use = use
	g.mu.Unlock()
	for id, r := range s.ranges {
		// Everything is indexed at Open: the WAL was replayed into Badger.
		r.rc.indexed.Store(stored[id])
		r.rc.published.Store(stored[id])
	}
	return nil
}

// eachStored calls fn with the range id, key and stored value of every
// l/ key, in key order; key and value are valid only during the call. Only
// a pointer's fields, or an inline batch's length, are ever needed from a
// value, and a pointer is small enough to live in the LSM tree, so no
// value is prefetched.
func (s *Store) eachStored(fn func(id string, key, val []byte) error) error {
	return s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(prefixLog), PrefetchValues: false})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			id, ok := logKeyRange(item.Key())
			if !ok {
				continue
			}
			if err := item.Value(func(b []byte) error { return fn(id, item.Key(), b) }); err != nil {
				return err
			}
		}
		return nil
	})
}

// kickReclaim asks the reclaimer for a pass (without waiting).
func (s *Store) kickReclaim() {
	select {
	case s.reclaimKick <- struct{}{}:
	default:
	}
}

// startReclaimer starts the background reclaimer: a segment pass whenever
// kicked (and once at start, for the segments Open found free), and every
// vlogGCInterval a relocation pass (relocate.go) then value-log GC.
// stopReclaimer ends it.
func (s *Store) startReclaimer() {
	s.reclaimKick = make(chan struct{}, 1)
	s.reclaimStop = make(chan struct{})
	s.reclaimDone = make(chan struct{})
	s.kickReclaim()
	go func() {
		defer close(s.reclaimDone)
		gc := time.NewTicker(vlogGCInterval)
		defer gc.Stop()
		for {
			select {
			case <-s.reclaimStop:
				return
			case <-s.reclaimKick:
				if _, err := s.reclaimSegments(); err != nil {
					s.log.Warn("reclaiming segments failed; they stay until the next pass", "err", err)
				}
			case <-gc.C:
				if _, err := s.relocateSegments(); err != nil {
					s.log.Warn("relocating live batches out of mostly-free segment files failed; they stay until the next pass", "err", err)
				}
				s.runValueLogGC()
			}
		}
	}()
}

// stopReclaimer stops the reclaimer and waits for a pass in progress: at
// Close, before the database closes.
func (s *Store) stopReclaimer() {
	if s.reclaimStop == nil {
		return
	}
	close(s.reclaimStop)
	<-s.reclaimDone
}

// reclaimSegments deletes every segment file with no live pointer but the
// one being written and the highest numbered, and returns how many it
// deleted. Passes run one at a time.
func (s *Store) reclaimSegments() (int, error) {
	s.reclaimMu.Lock()
	defer s.reclaimMu.Unlock()
	g := s.segs
	g.mu.Lock()
	var cands []uint32
	if g.use != nil && g.failed == nil {
		for n := range g.synced {
			// The highest numbered file stays even when it is not being
			// written (just after an Open): the next Open numbers new files
			// above the highest it finds, so numbers are never reused.
			if n == g.cur || n+1 >= g.next {
				continue
			}
			if u := g.use[n]; u == nil || u.ptrs == 0 {
				cands = append(cands, n)
			}
		}
	}
	g.mu.Unlock()
	if len(cands) == 0 {
		return 0, nil
	}
	end, err := s.begin()
	if err != nil {
		return 0, nil // closed: the next Open finds them again
	}
	defer end()
	if err := s.writeErr(); err != nil {
		// Failed: what reached Badger is unknown until a reopen, which
		// counts again.
		return 0, nil
	}
	// The deletes (or rewrites) of the candidates' last pointers were
	// committed before they were released (releaseStored), so before this
	// sync starts: once it returns no durable pointer names them.
	if err := s.syncDB(); err != nil {
		return 0, err
	}
	// Not behind the segment syncs: a sync of the last moments' batches
	// (a WAL checkpoint's fdatasync of up to walSwitchBytes of them) took
	// 30-45 ms on a busy disk, and the freed files waited for it, several
	// MiB at full write rate (the retention soak, bench/soak_test.go). A
	// file that sync is using is left to after it (busy).
	removed, freed, busy, errs := g.removeFree(cands)
	if len(busy) > 0 {
		// No sync runs while syncMu is held: none of them is in use then.
		g.syncMu.Lock()
		r, f, _, more := g.removeFree(busy)
		g.syncMu.Unlock()
		removed, freed, errs = removed+r, freed+f, append(errs, more...)
	}
	if removed > 0 {
		// Outside g.mu: reads and the indexer's writes go on meanwhile.
		if err := (journal.OSFS{}).SyncDir(g.dir); err != nil {
			errs = append(errs, syncFailure(fmt.Errorf("logstore: sync directory %s: %w", g.dir, err)))
		}
		s.log.Info("deleted segment files with no live batch", "files", removed, "bytes", freed)
	}
	return removed, errors.Join(errs...)
}

// removeFree removes (and closes) the files among cands that are still
// free, but for those the sync in progress is using, which it returns as
// busy: its fdatasync runs on their raw descriptors, which a close would
// pull from under it (and a sync that completed after a removal would
// count the file synced again). A sync that starts after a removal no
// longer finds the file.
func (g *segments) removeFree(cands []uint32) (removed int, freed int64, busy []uint32, errs []error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.lostPower || g.failed != nil {
		return 0, 0, nil, nil
	}
	for _, n := range cands {
		if _, ok := g.syncing[n]; ok {
			busy = append(busy, n)
			continue
		}
		// Still free: no write goes to a file but the current one, and a
		// pointer is counted before it is committed.
		if u := g.use[n]; n == g.cur || (u != nil && u.ptrs > 0) {
			continue
		}
		path := segmentPath(g.dir, n)
		size := fileUsage(path)
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("logstore: remove segment %d: %w", n, err))
			continue
		}
		if f, ok := g.files[n]; ok {
			// Closed now: an unlinked file's blocks are freed only once
			// its last descriptor closes (kept to the next pass, up to 4
			// MiB stayed allocated in the retention soak, and after the
			// last pass until the next one, however far off). A read that
			// took f from g.files just before is safe: os.File defers the
			// close(2) until a pread in progress returns, and one that
			// starts after fails with os.ErrClosed, which read reports as
			// the file gone.
			_ = f.Close()
			delete(g.files, n)
		}
		delete(g.synced, n)
		delete(g.dirty, n)
		delete(g.use, n)
		removed++
		freed += size
	}
	return removed, freed, busy, errs
}

// runValueLogGC runs Badger's value-log GC: up to vlogGCMaxRewrites files,
// each rewritten only when at least vlogGCDiscardRatio of it is garbage.
//
// A rewrite writes the file's live values again (not synced: SyncWrites is
// off) and deletes the old file at once, so a power loss right after it
// could lose values whose new copies had not reached the disk: each
// rewrite is followed at once by a sync of Badger, which bounds that window
// to the rewrite's end. Only inline batches live in the value log (a
// truncation's rewrite, stores written before segments).
func (s *Store) runValueLogGC() {
	rewrote := 0
	for rewrote < vlogGCMaxRewrites {
		end, err := s.begin()
		if err != nil {
			return
		}
		if s.writeErr() != nil {
			end()
			return
		}
		err = s.db.RunValueLogGC(vlogGCDiscardRatio)
		if err == nil {
			rewrote++
			err = s.syncDB()
		}
		end()
		if errors.Is(err, badger.ErrNoRewrite) || errors.Is(err, badger.ErrRejected) {
			break
		}
		if err != nil {
			s.log.Warn("value-log GC failed", "err", err)
			break
		}
	}
	if rewrote > 0 {
		s.log.Info("value-log GC rewrote files", "files", rewrote)
	}
}

// DiskUsage is what a store's files take on disk, by part, in bytes
// allocated (du's count: sparse files such as Badger's preallocated
// value log and memtable WALs count only the blocks written).
type DiskUsage struct {
	// Segments: dir/segments, the stored batches.
	Segments int64
	// WAL: dir/wal.0 and dir/wal.1, of a fixed size once written through.
	WAL int64
	// Badger: dir/badger, the index, state and metadata (and inline batches).
	Badger int64
	// Journals: dir/journal, one epoch journal per range.
	Journals int64
}

// Total is the sum of the parts.
func (u DiskUsage) Total() int64 { return u.Segments + u.WAL + u.Badger + u.Journals }

// DiskUsage reports the bytes the store's files take on disk, by part. It
// lists the directories (no file is read), so it is cheap enough for a
// status call or a metrics refresh; files created or removed meanwhile
// may be counted or not.
func (s *Store) DiskUsage() DiskUsage {
	dir := filepath.Dir(s.badgerDir)
	return DiskUsage{
		Segments: dirUsage(s.segs.dir),
		WAL:      fileUsage(walPath(dir, 0)) + fileUsage(walPath(dir, 1)),
		Badger:   dirUsage(s.badgerDir),
		Journals: dirUsage(s.journalDir),
	}
}

func dirUsage(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		n += fileUsage(p)
		return nil
	})
	return n
}

// fileUsage is the bytes allocated to path (0 when it is gone).
func fileUsage(path string) int64 {
	fi, err := os.Lstat(path)
	if err != nil {
		return 0
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}
