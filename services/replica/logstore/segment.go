package logstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/tenurelog/tenure/pkg/journal"
)

// Segments: where stored batches live.
//
// The indexer (index.go) writes each stored batch into a segment file with
// pwrite, many batches per call, and gives Badger only a pointer to it
// under the batch's log key. Until then Badger received the batch itself,
// which it copies into its value log through a mapping of a sparse file:
// every first touch of a page faults, and Badger's writer goroutine was
// the largest CPU item of a replica under load (23% of the process at 256
// appends in flight). Measured with the bench module (BenchmarkTenure, 4
// interleaved pairs, 2026-12-02): 256-in-flight went from a median of
// 33.2k to 47.1k records/s and from 45 to 28 us of CPU per record; the
// other shapes stayed within noise (they index far fewer bytes a second).
//
// Like Badger's value log, a segment is never synced for a group commit:
// the WAL (wal.go) makes batches durable, and Open replays every batch of
// the generations it has not checkpointed, writing it to a segment again.
// A checkpoint, and anything else that moves w/gen forward, first syncs
// the segments (sync): once a generation is no longer replayed, every
// batch Badger points to from it must be on disk. Badger itself may make a
// pointer durable earlier (a memtable flush), but such a pointer belongs to
// a generation Open replays, which overwrites it.
//
// Files are dir/segments/<n>.seg, n counting up from 1 (%08d), each at
// most Options.SegmentBytes (segmentBytes by default): a batch that does
// not fit starts the next file, and a batch bigger than a whole file (at
// most maxSegmentBatchBytes, the default size) gets one of its own,
// so no file exceeds max(SegmentBytes, maxSegmentBatchBytes). A store
// opened again writes to a new file, so nothing is ever appended after a
// tail a crash may have torn. A file is deleted once no live pointer refers
// to it and it is not the one being written (reclaim.go): the bytes of
// released batches (below a log start, truncated, dropped) are given back
// a whole file at a time.
//
// Pointer (the value of a log key, format.go):
//
//	segmentMagic u8 (0xB8) | count u32 | segment u32 | position u64 |
//	length u32 | crc32c u32
//
// count is the batch's record count (where a batch has it, so a cut counts
// what it deletes without reading segments); crc32c covers the key, the 21
// bytes before the crc, then the batch's bytes in the segment. A pointer
// moved to another key, or pointing at anything but the bytes it was
// written for, fails it: ErrCorrupt.
const (
	segmentMagic        byte = 0xB8
	segmentPointerBytes      = 1 + 4 + 4 + 8 + 4 + 4
	segmentSuffix            = ".seg"
)

// segmentBytes is the default size at which a segment file is full
// (Options.SegmentBytes). Files are reclaimed whole, so the disk holds up
// to about one file beyond what the ranges keep (the oldest file, part
// below a log start, and the one being written, part empty): 64 MiB keeps
// that small beside a retention of a few hundred MiB, while a store of a
// terabyte still has ~16k files (each stays open once read, so the
// process's descriptor limit must allow for them). A variable so tests
// can fill segments with small batches.
var segmentBytes int64 = 64 << 20

// segmentKeepBufBytes bounds the write buffer kept between writes: one
// index commit of the usual size (indexMaxBytes).
const segmentKeepBufBytes = 8 << 20

type segments struct {
	dir string

	mu    sync.Mutex
	files map[uint32]*os.File // open files, by number
	cur   uint32              // the file being written; 0 before the first write
	pos   int64               // where the next batch goes in cur
	next  uint32              // the number the next new file gets
	dirty map[uint32]int64    // written since their last sync: file -> end written
	// dirBelow: every file numbered below it has a directory entry a
	// completed sync covered (so a sync must sync the directory while
	// next is above it). synced is, per file, the length a completed sync
	// covered. Both for PowerLoss: files found at open count as synced
	// whole, files created since as 0 until synced.
	dirBelow  uint32
	synced    map[uint32]int64
	lostPower bool
	failed    error
	// buf is the writer's scratch, reused (write has one caller at a time).
	buf []byte
	// limit is the size at which a file is full (Options.SegmentBytes).
	limit int64
	// use is each file's live pointers (reclaim.go): nil until Open built
	// it, after the WAL's replay.
	use map[uint32]*segUse
	// kick: a file became deletable without a release (startLocked); the
	// writer asks for a reclaim pass.
	kick bool
	// syncing are the files the sync in progress fdatasyncs, by number
	// (nil between syncs): their descriptors are in use outside g.mu, so
	// removeFree leaves them to after it.
	syncing map[uint32]*os.File

	// syncMu serializes syncs, so a sync that returns covers every write
	// made before it was called.
	syncMu sync.Mutex
}

func segmentPath(dir string, n uint32) string {
	return filepath.Join(dir, fmt.Sprintf("%08d%s", n, segmentSuffix))
}

// openSegments opens dir (creating it, durably) and finds the segment
// files in it; the first write creates a new one.
func openSegments(dir string, limit int64) (*segments, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("logstore: %w", err)
	}
	if err := (journal.OSFS{}).SyncDir(filepath.Dir(dir)); err != nil {
		return nil, fmt.Errorf("logstore: sync directory %s: %w", filepath.Dir(dir), err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("logstore: list %s: %w", dir, err)
	}
	if limit <= 0 {
		limit = segmentBytes
	}
	g := &segments{dir: dir, files: map[uint32]*os.File{}, dirty: map[uint32]int64{}, synced: map[uint32]int64{}, limit: limit}
	var top uint32
	for _, e := range ents {
		num, ok := strings.CutSuffix(e.Name(), segmentSuffix)
		n, err := strconv.ParseUint(num, 10, 32)
		if !ok || err != nil || n == 0 {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			return nil, fmt.Errorf("logstore: %w", err)
		}
		g.synced[uint32(n)] = fi.Size()
		top = max(top, uint32(n))
	}
	g.next = top + 1
	g.dirBelow = g.next
	return g, nil
}

// close closes every open file.
func (g *segments) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for n, f := range g.files {
		_ = f.Close()
		delete(g.files, n)
	}
}

// write stores batches, in order, and returns a pointer for each: pointers[i]
// is batches[i], to be stored under keys[i] (each a log key). One pwrite
// per file they go to. One caller at a time: the indexer (under indexMu)
// or Open's replay. g.mu is not held during a pwrite, so a read of a
// batch written before never waits for one.
func (g *segments) write(keys, batches [][]byte) (pointers [][]byte, err error) {
	pointers = make([][]byte, len(batches))
	for i := 0; i < len(batches); {
		// The batches from i that fit in the current file go in one pwrite;
		// a batch bigger than a whole file gets a file of its own.
		g.mu.Lock()
		err := g.failed
		if err == nil && (g.cur == 0 || (g.pos > 0 && g.pos+int64(len(batches[i])) > g.limit)) {
			err = g.startLocked()
		}
		n, f, start := g.cur, g.files[g.cur], g.pos
		g.mu.Unlock()
		if err != nil {
			return nil, err
		}
		buf := g.buf[:0]
		first := i
		for ; i < len(batches) && (len(buf) == 0 || start+int64(len(buf)+len(batches[i])) <= g.limit); i++ {
			pointers[i] = encodeSegmentPointer(keys[i], uint32(storedCount(batches[i])), n, start+int64(len(buf)), batches[i])
			buf = append(buf, batches[i]...)
		}
		if h := segmentWriteHook.Load(); h != nil && err == nil {
			err = (*h)(n)
		}
		if err == nil {
			_, err = f.WriteAt(buf, start)
		}
		g.mu.Lock()
		if err != nil && errors.Is(err, syscall.ENOSPC) {
			// Not sticky: pos did not move, so the next write overwrites
			// whatever part of this one landed, and no pointer names it
			// (the indexer retries the batches later: index.go).
			err = fmt.Errorf("logstore: write segment %d: %w", n, err)
		} else if err != nil {
			g.failed = fmt.Errorf("logstore: write segment %d: %w", n, err)
			err = g.failed
		} else {
			// Dirty only once written: a sync that starts before this
			// covers what was written before, and the next one this.
			g.pos = start + int64(len(buf))
			g.dirty[n] = g.pos
			// Counted before Badger holds the pointers: a count errs
			// high, never low (reclaim.go).
			g.countLocked(n, i-first, int64(len(buf)))
		}
		g.mu.Unlock()
		if err != nil {
			return nil, err
		}
		g.buf = buf[:0]
		if cap(buf) > segmentKeepBufBytes {
			g.buf = nil
		}
	}
	return pointers, nil
}

// startLocked creates the next segment file and makes it the current one.
// g.mu is held.
func (g *segments) startLocked() error {
	n := g.next
	f, err := os.OpenFile(segmentPath(g.dir, n), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil && errors.Is(err, syscall.ENOSPC) {
		// Nothing created, nothing to undo: the next write tries again.
		return fmt.Errorf("logstore: create segment: %w", err)
	}
	if err != nil {
		g.failed = fmt.Errorf("logstore: create segment: %w", err)
		return g.failed
	}
	g.next++
	g.files[n] = f
	g.synced[n] = 0
	g.cur, g.pos = n, 0
	// The file that was the highest may have no live batch (an Open's
	// top file, kept so numbers never repeat): deletable from now on.
	if _, ok := g.synced[n-1]; ok && g.use != nil {
		if u := g.use[n-1]; u == nil || u.ptrs == 0 {
			g.kick = true
		}
	}
	return nil
}

// sync makes every batch written before the call durable: an fdatasync of
// each file written since its last sync, then of the directory if a file
// was created.
func (g *segments) sync() error {
	g.syncMu.Lock()
	defer g.syncMu.Unlock()
	g.mu.Lock()
	// The files created so far are those below next: a directory sync
	// covers their entries.
	todo, below, failed := g.dirty, g.next, g.failed
	newDir := below > g.dirBelow
	g.dirty = map[uint32]int64{}
	files := make(map[uint32]*os.File, len(todo))
	for n := range todo {
		files[n] = g.files[n]
	}
	g.syncing = files
	g.mu.Unlock()
	if failed != nil {
		g.mu.Lock()
		g.syncing = nil
		g.mu.Unlock()
		return failed
	}
	err := g.syncFiles(files, newDir)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.syncing = nil
	if err != nil {
		g.failed = err
		return err
	}
	if g.lostPower {
		// The sync may not have reached the disk (see PowerLoss).
		return errPowerLoss
	}
	for n, end := range todo {
		g.synced[n] = max(g.synced[n], end)
	}
	g.dirBelow = max(g.dirBelow, below)
	return nil
}

func (g *segments) syncFiles(files map[uint32]*os.File, newDir bool) error {
	for n, f := range files {
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return syncFailure(fmt.Errorf("logstore: fdatasync segment %d: %w", n, err))
		}
	}
	if newDir {
		if err := (journal.OSFS{}).SyncDir(g.dir); err != nil {
			return syncFailure(fmt.Errorf("logstore: sync directory %s: %w", g.dir, err))
		}
	}
	return nil
}

// read returns the batch a pointer stored under key points to, verified
// against the pointer's checksum.
func (g *segments) read(key, pointer []byte) ([]byte, error) {
	p, err := decodeSegmentPointer(key, pointer)
	if err != nil {
		return nil, err
	}
	f, err := g.file(p.segment)
	if err != nil {
		return nil, err
	}
	if f == nil {
		return nil, fmt.Errorf("%w: batch %s is in segment %d, which does not exist", ErrCorrupt, keyString(key), p.segment)
	}
	b := make([]byte, p.length)
	if _, err := f.ReadAt(b, p.position); errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: batch %s ends past the end of segment %d", ErrCorrupt, keyString(key), p.segment)
	} else if errors.Is(err, os.ErrClosed) {
		// The reclaimer deleted the file since file returned it: every
		// batch in it was released (below a log start, cut, dropped), as
		// when the file is not found at all.
		return nil, fmt.Errorf("%w: batch %s is in segment %d, which was deleted", ErrCorrupt, keyString(key), p.segment)
	} else if err != nil {
		return nil, fmt.Errorf("logstore: read segment %d: %w", p.segment, err)
	}
	if crc := crc32.Update(p.crcHead, castagnoli, b); crc != p.crc {
		return nil, fmt.Errorf("%w: batch %s fails its checksum in segment %d at %d (stored %08x, computed %08x)",
			ErrCorrupt, keyString(key), p.segment, p.position, p.crc, crc)
	}
	return b, nil
}

// file returns segment n's open file, opening it at its first read; nil
// when there is no such file.
func (g *segments) file(n uint32) (*os.File, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if f, ok := g.files[n]; ok {
		return f, nil
	}
	f, err := os.Open(segmentPath(g.dir, n))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("logstore: open segment: %w", err)
	}
	g.files[n] = f
	return f, nil
}

// powerLoss fails the segments (no sync completes after it) and returns
// what a completed sync covered of each file: its length, or -1 for a
// file whose directory entry none covered.
func (g *segments) powerLoss() map[uint32]int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lostPower = true
	g.failed = errPowerLoss
	kept := maps.Clone(g.synced)
	for n := range kept {
		if n >= g.dirBelow {
			kept[n] = -1
		}
	}
	return kept
}

// losePowerSegments cuts each closed segment file to what kept says a sync
// covered, and removes those it says none made part of the directory.
func losePowerSegments(dir string, kept map[uint32]int64) error {
	for n, end := range kept {
		var err error
		if end < 0 {
			err = os.Remove(segmentPath(dir, n))
		} else {
			err = os.Truncate(segmentPath(dir, n), end)
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("logstore: power loss: segment %d: %w", n, err)
		}
	}
	return nil
}

type segmentPointer struct {
	segment, length uint32
	position        int64
	crc             uint32
	// crcHead is the checksum over the key and the pointer's fields, to be
	// continued over the batch's bytes.
	crcHead uint32
}

func encodeSegmentPointer(key []byte, count, segment uint32, position int64, batch []byte) []byte {
	b := make([]byte, segmentPointerBytes)
	b[0] = segmentMagic
	binary.BigEndian.PutUint32(b[1:5], count)
	binary.BigEndian.PutUint32(b[5:9], segment)
	binary.BigEndian.PutUint64(b[9:17], uint64(position))
	binary.BigEndian.PutUint32(b[17:21], uint32(len(batch)))
	crc := crc32.Checksum(key, castagnoli)
	crc = crc32.Update(crc, castagnoli, b[:21])
	crc = crc32.Update(crc, castagnoli, batch)
	binary.BigEndian.PutUint32(b[21:25], crc)
	return b
}

// segmentWriteHook, when set (tests only), runs before each segment pwrite;
// an error it returns is that write's: the seam that injects ENOSPC.
var segmentWriteHook atomic.Pointer[func(segment uint32) error]

// maxSegmentBatchBytes bounds the length a pointer may claim, so a damaged
// pointer cannot make a reader allocate more than a batch can hold: a
// batch is one write's records, at most wire.MaxBatchBytes of values plus
// their headers, far below this.
const maxSegmentBatchBytes = 64 << 20

func decodeSegmentPointer(key, b []byte) (segmentPointer, error) {
	if len(b) != segmentPointerBytes || b[0] != segmentMagic {
		return segmentPointer{}, fmt.Errorf("%w: batch pointer %s is %d bytes, want %d", ErrCorrupt, keyString(key), len(b), segmentPointerBytes)
	}
	p := segmentPointer{
		segment:  binary.BigEndian.Uint32(b[5:9]),
		position: int64(binary.BigEndian.Uint64(b[9:17])),
		length:   binary.BigEndian.Uint32(b[17:21]),
		crc:      binary.BigEndian.Uint32(b[21:25]),
	}
	if p.segment == 0 || p.position < 0 || p.length < batchHeaderBytes || p.length > maxSegmentBatchBytes {
		return segmentPointer{}, fmt.Errorf("%w: batch pointer %s points to %d bytes at %d in segment %d", ErrCorrupt, keyString(key), p.length, p.position, p.segment)
	}
	p.crcHead = crc32.Update(crc32.Checksum(key, castagnoli), castagnoli, b[:21])
	return p, nil
}

// loadBatch returns the stored batch under log key: stored itself, or
// what the pointer stored points to.
func (s *Store) loadBatch(key, stored []byte) ([]byte, error) {
	if len(stored) == 0 || stored[0] != segmentMagic {
		return stored, nil
	}
	return s.segs.read(key, stored)
}

// storedCount is the record count of the batch or pointer stored, read
// from its header alone; 1 for anything else (a bare record, or damage).
func storedCount(stored []byte) uint64 {
	if len(stored) >= batchHeaderBytes && (stored[0] == batchMagic || stored[0] == segmentMagic) {
		return uint64(binary.BigEndian.Uint32(stored[1:batchHeaderBytes]))
	}
	return 1
}

// toSegments writes the batches stored under log keys among keys to the
// segments, in one write, and replaces each of them in vals (the caller's
// own slice) by its pointer; other keys' values are kept.
func (s *Store) toSegments(keys, vals [][]byte) error {
	var logKeys, batches [][]byte
	var at []int
	for i, k := range keys {
		if isLogKey(k) {
			logKeys, batches, at = append(logKeys, k), append(batches, vals[i]), append(at, i)
		}
	}
	if len(at) == 0 {
		return nil
	}
	pointers, err := s.segs.write(logKeys, batches)
	if err != nil {
		return err
	}
	if s.segs.takeKick() {
		s.kickReclaim()
	}
	for j, i := range at {
		vals[i] = pointers[j]
	}
	return nil
}
