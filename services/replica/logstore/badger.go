package logstore

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/dgraph-io/badger/v4"
)

// badgerOptions tunes Badger for a replica on a small box (2 cores, a few
// GiB of memory, shared with the other services), where the workload is
// append-mostly logs read back sequentially, plus a handful of small keys
// per range.
func badgerOptions(dir string, log *slog.Logger) badger.Options {
	return badger.DefaultOptions(dir).
		// Group commit is ours (commit.go): one fdatasync of our own WAL per
		// batch of many appends (wal.go); Badger's files are synced only at
		// WAL checkpoints and for the rare writes that must be durable at
		// once (putSynced). With SyncWrites Badger would fsync once per
		// commit request, and records would not be readable (fetchable by
		// followers) until their own fsync finished.
		WithSyncWrites(false).
		// Each key has one writer (the committer, or Truncate on a drained
		// range) and nothing reads-modifies-writes inside a transaction, so
		// conflict detection would only cost memory and time per commit.
		WithDetectConflicts(false).
		// Records are never overwritten and metadata keys only need their
		// latest value: old versions are garbage to drop at compaction.
		WithNumVersionsToKeep(1).
		// 16 MiB memtables (default 64): Badger allocates each memtable's
		// arena up front, NumMemtables of them under write pressure. With
		// batches in segments a memtable entry is ~100 bytes, so 16 MiB
		// still holds ~150k records, seconds of appends between flushes.
		// A transaction is limited to 15% of this (2.4 MiB), which the
		// WriteBatch in commit.go splits around transparently.
		WithMemTableSize(16 << 20).
		// 3 memtables (default 5): bounds memtable memory at ~3x20 MiB; a
		// flush that cannot keep up stalls writers rather than growing.
		WithNumMemtables(3).
		// The block cache holds SST blocks (keys, value pointers, small
		// values). Followers and readers mostly read the log tail, which is
		// in memtables or the value log's page cache, so 32 MiB (default
		// 256) is plenty and leaves memory to the page cache.
		WithBlockCacheSize(32 << 20).
		// Bound the memory of table indexes and bloom filters (default 0:
		// all in memory, growing with the data). Cold tables are rarely read.
		WithIndexCacheSize(16 << 20).
		// Values of at least 256 bytes go to the value log and are written
		// once; only keys and 12-byte pointers go through compaction, which
		// on 2 cores competes with serving. Log keys hold 25-byte pointers
		// to segments (segment.go), so they and the small keys stay in the
		// LSM tree; what still reaches the value log is a batch held in
		// Badger itself: stores written before segments, and a truncation
		// inside a batch, which rewrites the records it keeps. Those are
		// long-lived, and values in the LSM tree degrade as compaction
		// rewrites them (BenchmarkAppendParallel, 1 KiB values, before
		// segments: ~51k against ~35k records/s at 200 MiB, ~40k against
		// ~33k at 600 MiB, still falling). Their value-log space is
		// reclaimed only by value-log GC, which the reclaimer runs
		// every minute (reclaim.go).
		WithValueThreshold(256).
		// 256 MiB value-log files (default 1 GiB): Badger maps them at twice
		// their size, and GC reclaims whole files, so smaller files reclaim
		// sooner. Still far above wire.MaxRecordBytes.
		WithValueLogFileSize(256 << 20).
		// 2 compactors (the minimum besides 0, which stops compaction and
		// eventually stalls writes; default 4): one per core at most.
		WithNumCompactors(2).
		// Badger's own logging goes to slog, warnings and errors only: its
		// info lines (every flush and compaction) would drown ours.
		WithLogger(badgerLogger{log.With("component", "badger")}).
		WithLoggingLevel(badger.WARNING)
}

// badgerLogger routes Badger's logging to slog at warning level and above.
type badgerLogger struct{ log *slog.Logger }

func (l badgerLogger) Errorf(f string, args ...any) {
	l.log.Error(strings.TrimSpace(fmt.Sprintf(f, args...)))
}

func (l badgerLogger) Warningf(f string, args ...any) {
	l.log.Warn(strings.TrimSpace(fmt.Sprintf(f, args...)))
}

func (badgerLogger) Infof(string, ...any)  {}
func (badgerLogger) Debugf(string, ...any) {}

// syncDB makes everything committed to Badger so far durable (see syncOnce
// for what that takes).
//
// Concurrent callers share syncs: a caller takes a ticket, and the first sync
// that STARTS after the ticket was taken covers the caller's writes (they
// committed before the ticket). While one sync runs, every caller that
// arrives waits for the next one, which then covers all of them. A thousand
// ranges fenced at once (mass failover) so cost a handful of fsyncs, not a
// thousand serialized ones.
func (s *Store) syncDB() error {
	s.syncGate.Lock()
	defer s.syncGate.Unlock()
	if s.syncCond == nil {
		s.syncCond = sync.NewCond(&s.syncGate)
	}
	s.syncWanted++
	ticket := s.syncWanted
	for s.syncDone < ticket {
		if s.syncing {
			s.syncCond.Wait()
			continue
		}
		// Every ticket handed out so far committed before this point, so
		// this sync covers them all.
		target := s.syncWanted
		s.syncing = true
		s.syncGate.Unlock()
		err := s.syncOnce()
		s.syncGate.Lock()
		s.syncing = false
		s.syncCond.Broadcast()
		if err != nil {
			// Others waiting retry with a sync of their own; the store is
			// failed by the caller anyway.
			return err
		}
		s.syncDone = max(s.syncDone, target)
	}
	return nil
}

// syncOnce is one durability sync of the database: an fsync of the active
// memtable WAL, of the active value-log file and of each rotated-away WAL not
// yet synced, all at once.
//
// This is what db.Sync does (it msyncs the active WAL and value log), done
// with fsync instead, in parallel: db.Sync runs its two msyncs one after the
// other, and msync(MS_SYNC) of a mapping walks its whole range (Badger maps
// each value-log file at twice its size, 512 MiB here), which showed as ~7%
// of a replica's CPU under load. On Linux fsync of any descriptor of a file
// writes back its dirty pages, mapped ones included, and concurrent fsyncs
// on one filesystem share journal commits: measured on the target box, two
// preallocated files synced in parallel take ~180us against ~270us in turn.
//
// The files are found by listing the directory: Badger numbers memtable WALs
// ("<fid>.mem") and value-log files ("<fid>.vlog") in creation order, and
// writes only to the newest of each. A file created after the listing holds
// nothing committed before this sync began. A value-log file is synced by
// Badger itself when it rotates away from it (ristretto's MmapFile.Truncate
// msyncs first), so only the newest one needs syncing here.
func (s *Store) syncOnce() error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	ents, err := os.ReadDir(s.badgerDir)
	if err != nil {
		return fmt.Errorf("logstore: list %s: %w", s.badgerDir, err)
	}
	var names []string
	if vlog := newestWithSuffix(ents, ".vlog"); vlog != "" {
		names = append(names, vlog)
	}
	if mem := newestWithSuffix(ents, ".mem"); mem != "" {
		names = append(names, mem)
	}
	errs := make([]error, len(names)+1)
	var wg sync.WaitGroup
	// All but the first in goroutines of their own, the first on this one:
	// the syncs still overlap, for one goroutine hand-off fewer.
	for i := len(names) - 1; i >= 0; i-- {
		f, err := s.syncHandle(names[i])
		if err != nil {
			errs[i] = err
			continue
		}
		if i == 0 {
			errs[i] = fsyncFile(f)
			continue
		}
		wg.Go(func() { errs[i] = fsyncFile(f) })
	}
	errs[len(names)] = s.syncSealed(ents)
	wg.Wait()
	s.dropSyncHandles(names)
	if err := errors.Join(errs...); err != nil {
		return err
	}
	s.syncs.Add(1)
	return nil
}

// syncHandle returns an open descriptor of the Badger file name, opened at
// its first sync and kept while the file is the newest of its kind: a sync
// per group commit then costs the fsyncs, not an open and a close per file
// as well. Badger never reuses a file name while open (file ids only
// grow), so a kept descriptor always refers to the file listed under that
// name. A file removed meanwhile (flushed to an SST) is nil: nothing to sync.
// s.syncMu is held.
func (s *Store) syncHandle(name string) (*os.File, error) {
	if f, ok := s.syncFiles[name]; ok {
		return f, nil
	}
	f, err := os.Open(filepath.Join(s.badgerDir, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("logstore: %w", err)
	}
	s.syncFiles[name] = f
	return f, nil
}

// dropSyncHandles closes the kept descriptors of files that are no longer
// among keep, the newest files this sync used: Badger has rotated away from
// them (a rotated value-log file is synced by Badger, a rotated WAL by
// syncSealed) or removed them. s.syncMu is held.
func (s *Store) dropSyncHandles(keep []string) {
	for name, f := range s.syncFiles {
		if !slices.Contains(keep, name) {
			_ = f.Close()
			delete(s.syncFiles, name)
		}
	}
}

// closeSyncHandles closes every kept descriptor, at Close.
func (s *Store) closeSyncHandles() {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	for name, f := range s.syncFiles {
		_ = f.Close()
		delete(s.syncFiles, name)
	}
}

// newestWithSuffix returns the name of the highest-numbered "<n><suffix>"
// entry, "" when there is none.
func newestWithSuffix(ents []os.DirEntry, suffix string) string {
	newest, name := -1, ""
	for _, e := range ents {
		fid, ok := strings.CutSuffix(e.Name(), suffix)
		n, err := strconv.Atoi(fid)
		if ok && err == nil && n > newest {
			newest, name = n, e.Name()
		}
	}
	return name
}

// syncSealedWALs fsyncs the memtable WAL files ("<fid>.mem") other than the
// newest that it has not fsynced before. s.syncMu is held.
func (s *Store) syncSealedWALs() error {
	ents, err := os.ReadDir(s.badgerDir)
	if err != nil {
		return fmt.Errorf("logstore: list %s: %w", s.badgerDir, err)
	}
	return s.syncSealed(ents)
}

// syncSealed is syncSealedWALs on a listing of the directory.
//
// With SyncWrites off, Badger does not sync a memtable's WAL when it rotates
// to a new memtable (badger v4.9.6 ensureRoomForWrite; issue #1847 fixed only
// the active one), so records committed just before a rotation sit unsynced
// in the previous WAL until its flush to an SST. A rotated WAL is never
// written again, so each costs one fsync, once.
func (s *Store) syncSealed(ents []os.DirEntry) error {
	var mems []string
	newest := -1
	for _, e := range ents {
		fid, ok := strings.CutSuffix(e.Name(), ".mem")
		n, err := strconv.Atoi(fid)
		if !ok || err != nil {
			continue
		}
		mems = append(mems, e.Name())
		newest = max(newest, n)
	}
	present := map[string]bool{}
	for _, name := range mems {
		present[name] = true
		n, _ := strconv.Atoi(strings.TrimSuffix(name, ".mem"))
		if n == newest || s.sealed[name] {
			// The newest is the active one, synced by syncOnce (or one
			// created after the listing, which holds nothing committed
			// before this sync).
			continue
		}
		if err := fsyncPath(filepath.Join(s.badgerDir, name)); err != nil {
			return err
		}
		s.sealed[name] = true
	}
	for name := range s.sealed {
		if !present[name] {
			delete(s.sealed, name) // flushed to an SST and removed
		}
	}
	return nil
}

// fsyncFile fsyncs a file Badger writes through a shared mapping; on Linux
// fsync of any descriptor writes back the inode's dirty pages, mapped ones
// included. nil (the file was removed) is nothing to do.
func fsyncFile(f *os.File) error {
	if f == nil {
		return nil
	}
	if err := f.Sync(); err != nil {
		return syncFailure(fmt.Errorf("logstore: fsync %s: %w", f.Name(), err))
	}
	return nil
}

// fsyncPath opens path, fsyncs it (fsyncFile) and closes it. A file removed
// meanwhile was flushed to an SST: nothing to do.
func fsyncPath(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("logstore: %w", err)
	}
	if err := fsyncFile(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// putSynced writes key=value in its own transaction and syncs. It is for the
// rare writes that must be durable before their caller returns (state,
// truncation intents), not for records.
func (s *Store) putSynced(key, value []byte) error {
	if err := s.db.Update(func(txn *badger.Txn) error { return txn.Set(key, value) }); err != nil {
		return s.fail(fmt.Errorf("logstore: write %q: %w", key, err))
	}
	if err := s.syncDB(); err != nil {
		return s.fail(err)
	}
	return nil
}

// get returns a copy of key's value; ok is false when key is absent.
func (s *Store) get(key []byte) (value []byte, ok bool, err error) {
	err = s.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(key)
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		ok = true
		value, err = item.ValueCopy(nil)
		return err
	})
	if err != nil {
		return nil, false, fmt.Errorf("logstore: read %q: %w", key, err)
	}
	return value, ok, nil
}

// getU64 reads and verifies an h/, d/ or t/ value of range id; absent is 0.
func (s *Store) getU64(prefix, id string) (v uint64, ok bool, err error) {
	key := rangeKey(prefix, id)
	b, ok, err := s.get(key)
	if err != nil || !ok {
		return 0, ok, err
	}
	v, err = decodeU64(key, b)
	return v, err == nil, err
}

// persistedRangeIDs lists the ranges with a state key, sorted by Badger.
func (s *Store) persistedRangeIDs() ([]string, error) {
	var ids []string
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(prefixState)})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			ids = append(ids, string(it.Item().Key()[len(prefixState):]))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("logstore: list ranges: %w", err)
	}
	return ids, nil
}

// readRecord reads and verifies the record of range id at offset (and the
// rest of the stored batch holding it).
func (s *Store) readRecord(id string, offset uint64) (epoch uint64, flags byte, value []byte, err error) {
	found := false
	err = s.db.View(func(txn *badger.Txn) error {
		_, gap, err := s.scanLog(txn, id, offset, func(sr storedRecord) (bool, error) {
			epoch, flags, value, found = sr.epoch, sr.flags, bytes.Clone(sr.value), true
			return false, nil
		})
		if err == nil && !found {
			if gap == "" {
				gap = fmt.Sprintf("record %d is missing", offset)
			}
			err = fmt.Errorf("%w: range %s: %s", ErrCorrupt, id, gap)
		}
		return err
	})
	if err != nil {
		return 0, 0, nil, fmt.Errorf("logstore: read record %d of %s: %w", offset, id, err)
	}
	return epoch, flags, value, nil
}
