package logstore

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/pkg/wire"
)

// Errors, matched with errors.Is. Every error from this package starts with
// "logstore: ".
var (
	// ErrCorrupt: stored bytes fail their checksum or break a rule the writer
	// never breaks (a missing record below the log end, a decreasing epoch).
	ErrCorrupt = errors.New("logstore: corrupt")
	// ErrBelowHWM: a truncation would remove committed records.
	ErrBelowHWM = errors.New("logstore: below the high-water mark")
	// ErrClosed: the Store was closed.
	ErrClosed = errors.New("logstore: closed")
	// ErrFailed: an earlier write, fsync or journal update failed, or
	// Options.CrashAt simulated a crash. What reached the disk is unknown
	// until the Store is closed and reopened, so it refuses every write.
	ErrFailed = errors.New("logstore: failed, reopen to recover")
	// ErrStaleEpoch: an epoch below one this range has already written or
	// been fenced at. A deposed leader's late write lands here.
	ErrStaleEpoch = errors.New("logstore: stale epoch")
	// ErrUnjournaled: Append under an epoch that is not the journal's latest:
	// the leader must journal its epoch (RecordEpoch) before writing under it.
	ErrUnjournaled = errors.New("logstore: epoch not journaled")
	// ErrOutOfRange: an offset outside the log, or records that do not
	// start at the log end.
	ErrOutOfRange = errors.New("logstore: offset out of range")
	// ErrTruncated: WaitDurable's offset was cut by a Truncate while it
	// waited; the records it waited for are gone.
	ErrTruncated = errors.New("logstore: truncated while waiting")
	// ErrBusy: a write arrived while the range is being truncated. A
	// truncation runs only on a fenced replica, so the writer is stale.
	ErrBusy = errors.New("logstore: range is being truncated")
	// ErrInvalid: the arguments break the rules (epoch 0, a malformed
	// batch, a gap between records, a decreasing epoch within a batch).
	ErrInvalid = errors.New("logstore: invalid argument")
	// ErrQuarantined: the range's stored data failed its checks when the
	// store opened (quarantine.go), so it refuses every read and write
	// until it is dropped (DropRange) and rebuilt from its peers. The
	// message names the reason.
	ErrQuarantined = errors.New("logstore: range quarantined")
	// ErrDiskFull is in disk.go.
)

// Options configure a Store. The zero value is valid.
type Options struct {
	// Logger receives the store's and Badger's warnings. nil means slog.Default().
	Logger *slog.Logger
	// JournalFS is the filesystem of the epoch journals. nil means the
	// operating system's (journal.OSFS).
	JournalFS journal.FS
	// CrashAt, if set, is called at named points inside Truncate and
	// AppendRecords; a non-nil return simulates a crash there: the operation
	// stops at once leaving the disk as it is, and the Store refuses every
	// further write (ErrFailed) until it is closed and reopened. Points:
	// "truncate:intent" (intent synced), "truncate:journal" (journal cut),
	// "truncate:log" (log keys deleted, not yet synced), "append:journal"
	// (a new epoch journaled, its records not yet written), "commit:write"
	// (the group commit took a batch of records, not yet written to Badger:
	// they are assigned, and a leader already serves them to followers).
	// "commit:sync" (a sync of written, readable records, before its
	// fdatasync: they are not yet durable), "wal:checkpoint" (a WAL
	// checkpoint, in the background, before it syncs Badger), "drop:intent"
	// (a drop's intent synced, nothing deleted), "drop:log" (the range's
	// log keys deleted, not synced; its state and journal still there),
	// "advance:start", "advance:journal", "advance:log", "reset:journal",
	// "reset:start", "reset:log" (AdvanceLogStart's and ResetTo's steps,
	// see logstart.go). A
	// CrashAt that blocks holds the operation there (the committer, at
	// "commit:write"; the syncer or a follower's inline sync, at
	// "commit:sync"), which tests use to stage a slow disk.
	CrashAt func(point string) error
	// WALSyncSeconds, when set, observes how long each WAL sync's
	// fdatasyncs took, in seconds (etcd_disk_wal_fsync_duration_seconds'
	// counterpart). Called on the commit path: it must not block.
	WALSyncSeconds interface{ Observe(float64) }
	// SegmentBytes is the size at which a segment file is full (segment.go);
	// 0 means the default, 64 MiB. Space is reclaimed a whole file at a time,
	// so smaller files track a small retention more closely, at the cost of
	// more files.
	SegmentBytes int64
	// Now is the clock of the time marks RetainSince reads (marks.go); nil
	// means time.Now. Tests inject one rather than sleep.
	Now func() time.Time
	// DiskReserveBytes is the free space the store keeps on its
	// filesystem: below it, new records are refused (ErrDiskFull) while
	// fences, HWMs, truncations, retention and reads go on out of the
	// reserve (disk.go). 0 means no preventive check: only a write that
	// fails with ENOSPC makes the store full.
	DiskReserveBytes uint64
	// WALWriteFault, when set (tests only), runs before each WAL entry is
	// written; an error it returns is that write's, as if the write had
	// failed (wrap syscall.ENOSPC to stage a full disk where the store
	// cannot refuse a write whole: its records have offsets already).
	WALWriteFault func() error
	// FreeBytes reports the free space of the store's filesystem; nil
	// means statfs of the store's directory (the blocks available to an
	// unprivileged user). Tests inject one to stage a full disk.
	FreeBytes func() (uint64, error)
}

// Crash points, the arguments Options.CrashAt receives.
const (
	CrashTruncateIntent  = "truncate:intent"
	CrashTruncateJournal = "truncate:journal"
	CrashTruncateLog     = "truncate:log"
	CrashAppendJournal   = "append:journal"
	CrashCommitWrite     = "commit:write"
	CrashCommitSync      = "commit:sync"
	CrashWALCheckpoint   = "wal:checkpoint"
	CrashDropIntent      = "drop:intent"
	CrashDropLog         = "drop:log"
)

// A Store is one replica's storage: one Badger database for every range's
// records and metadata, and one epoch journal file per range. It is safe for
// concurrent use.
type Store struct {
	badgerDir  string
	journalDir string
	db         *badger.DB
	jfs        journal.FS
	log        *slog.Logger
	crashAt    func(string) error
	// walWriteFault is Options.WALWriteFault.
	walWriteFault func() error
	// walSyncSeconds is Options.WALSyncSeconds.
	walSyncSeconds interface{ Observe(float64) }

	// life is held shared by every operation that touches db directly and
	// exclusively by Close, so nothing uses db after it is closed.
	life   sync.RWMutex
	closed bool // guarded by life

	// creating holds a lock per range id being created or dropped
	// (lockID). Guarded by createMu.
	createMu sync.Mutex
	creating map[string]*idLock
	rangesMu sync.RWMutex
	ranges   map[string]*Range // guarded by rangesMu

	// The group-commit queue; see commit.go.
	qmu       sync.Mutex
	work      *sync.Cond // the writer waits here for writes, due HWMs or closing
	indexWork *sync.Cond // the indexer waits here for indexDue or indexStop
	space     *sync.Cond // appenders wait here for room in the queue
	syncWork  *sync.Cond // the syncer waits here for unsynced log ends
	// queue holds accepted writes not yet taken by the committer, each
	// range's in the order their offsets were assigned.
	queue []*write
	// dirty holds ranges whose HWM changed since the writer last wrote it.
	dirty map[*Range]struct{}
	// hwmArmed: a timer will set hwmDue in hwmFlushDelay. hwmDue: dirty
	// HWMs have waited long enough to be committed without records.
	hwmArmed, hwmDue bool
	// indexArmed: a timer will set indexDue in indexDelay. indexDue: the
	// indexer indexes the waiting batches next (index.go). indexStop: the
	// writer exited; the indexer exits too.
	indexArmed, indexDue, indexStop bool
	// unsynced holds, per range, the end of its writes committed and
	// published but not yet handed to a sync: the syncer's work.
	unsynced map[*Range]syncEnd
	// syncDue: the wait of the unsynced writes of ranges that sync on
	// demand is over (syncDemandDelay passed). syncArmed: a timer bounds their wait. syncRounds counts the takings
	// of unsynced, so a timer armed before the last one knows its wait
	// ended. See "Sync on demand" in commit.go.
	syncDue, syncArmed bool
	syncRounds         uint64
	// queuedRecords counts the records admitted but not yet committed,
	// queuedBytes the value bytes admitted but not yet indexed (commit.go).
	// Invariant: at most maxQueueRecords and maxQueueBytes, except that one
	// write is always admitted when both are 0.
	queuedRecords, queuedBytes int
	// queueWaits counts the writes that waited for room (QueueStatus).
	queueWaits uint64
	// writerBusy: a commit is running, on the writer or inline on a
	// caller (writeInline); only one runs at a time. inlineSyncs counts
	// syncs running inline; the syncer exits only once there are none.
	writerBusy  bool
	inlineSyncs int
	closing     bool  // Close began: no new writes
	writerDone  bool  // the writer exited; the syncer drains and exits
	stopped     bool  // the writer and the syncer exited
	failed      error // first fatal failure; see ErrFailed
	// syncFailed: an fsync the store issued failed (failed.go).
	syncFailed bool
	done       chan struct{}
	// takes counts takeLocked calls: a commit that began after a given
	// count took the dirty HWMs as they were then (DropRange's forgetHWM).
	takes uint64

	syncMu sync.Mutex
	// sealed names the memtable WAL files already fsynced after Badger
	// rotated away from them. Guarded by syncMu; see syncDB.
	sealed map[string]bool
	// syncFiles are the open descriptors syncOnce fsyncs, by file name.
	// Guarded by syncMu; see syncHandle.
	syncFiles map[string]*os.File

	// Sync coalescing (see syncDB), guarded by syncGate. Invariant:
	// syncDone <= syncWanted. Tickets are taken after the caller's write
	// committed, so a sync that starts after a ticket covers that write.
	syncGate   sync.Mutex
	syncCond   *sync.Cond // on syncGate; broadcast when a sync ends
	syncing    bool       // a sync is running
	syncWanted uint64     // highest ticket handed out
	syncDone   uint64     // every ticket up to this is durable
	// intentClears is for PowerLoss: per range whose truncation intent
	// was deleted, the intent's target and syncWanted just after the
	// delete. Until syncDone passes that ticket no sync started after the
	// delete has ended, and a power loss may still bring the intent back.
	intentClears map[string]intentClear

	// The index (index.go). unindexed holds the batches in the WAL not yet
	// committed to Badger, in WAL order, and unindexedBytes their value
	// bytes; guarded by imu (taken under wal.mu when a batch joins).
	// indexMu serializes index commits.
	imu            sync.Mutex
	unindexed      []*indexBatch
	unindexedBytes int
	indexMu        sync.Mutex

	// wal makes group commits durable (wal.go); bg runs its checkpoints.
	// segs holds the stored batches Badger points to (segment.go).
	wal  *wal
	segs *segments
	bg   sync.WaitGroup

	syncs, commits, indexCommits atomic.Uint64

	// now is Options.Now (time.Now by default).
	now func() time.Time
	// The reclaimer (reclaim.go): reclaimKick asks it for a segment pass,
	// reclaimStop ends it, reclaimDone is closed when it has. reclaimMu
	// serializes passes.
	reclaimKick chan struct{}
	reclaimStop chan struct{}
	reclaimDone chan struct{}
	reclaimMu   sync.Mutex
	// marksPruned: Open deleted time marks above a log end, to be synced
	// before the store takes writes.
	marksPruned bool

	// disk is the full-disk state (disk.go).
	disk *diskState
}

// Stats are counters for tests and metrics.
type Stats struct {
	// Syncs counts durability syncs of the database (group commits and
	// SetState/Truncate syncs).
	Syncs uint64
	// Commits counts group commits (each one WAL entry).
	Commits uint64
	// IndexCommits counts the Badger commits that index group commits
	// (index.go): each carries every group commit waiting.
	IndexCommits uint64
}

// Open opens the store in dir, creating it if missing: dir/badger holds one
// Badger database for all ranges, dir/journal/<range>.journal one epoch
// journal per range. Open loads every range, redoes pending truncations,
// recovers each log's end and reconciles each journal with its log (see
// recover.go) before returning: nothing is served from an unreconciled range.
//
// A range whose own stored data fails its checks (ErrCorrupt: its state,
// HWM or markers, the record below its synced marker, its journal against
// its log) is loaded quarantined (quarantine.go): it refuses every read and
// write with ErrQuarantined and Quarantined reports it, while every other
// range opens and serves. What is not one range's damage still fails Open:
// Badger, the segments or the WAL failing to open or replay, and any I/O
// error (see quarantines).
func Open(dir string, opts Options) (*Store, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("component", "logstore")
	jfs := opts.JournalFS
	if jfs == nil {
		jfs = journal.OSFS{}
	}
	s := &Store{
		badgerDir:     filepath.Join(dir, "badger"),
		journalDir:    filepath.Join(dir, "journal"),
		jfs:           syncWatchFS{jfs},
		log:           log,
		crashAt:       opts.CrashAt,
		walWriteFault: opts.WALWriteFault,
		ranges:        map[string]*Range{},
		dirty:         map[*Range]struct{}{},
		unsynced:      map[*Range]syncEnd{},
		done:          make(chan struct{}),
		sealed:        map[string]bool{},
		syncFiles:     map[string]*os.File{},
		disk:          &diskState{reserve: opts.DiskReserveBytes, free: opts.FreeBytes},
	}
	if s.disk.free == nil {
		s.disk.free = statfsFree(dir)
	}
	s.walSyncSeconds = opts.WALSyncSeconds
	s.now = opts.Now
	if s.now == nil {
		s.now = time.Now
	}
	s.work = sync.NewCond(&s.qmu)
	s.indexWork = sync.NewCond(&s.qmu)
	s.space = sync.NewCond(&s.qmu)
	s.syncWork = sync.NewCond(&s.qmu)
	// Before anything is created or opened: a store whose manifest is gone
	// must not be opened as a new one (lost.go).
	if err := checkNotLost(dir, s.badgerDir); err != nil {
		return nil, err
	}
	for _, d := range []string{s.badgerDir, s.journalDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("logstore: %w", err)
		}
	}
	// Badger fsyncs its own directory; the journal directory's entry in dir
	// (and dir's in its parent, if MkdirAll just made it) must be durable
	// before a journal inside it is.
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := (journal.OSFS{}).SyncDir(d); err != nil {
			return nil, fmt.Errorf("logstore: sync directory %s: %w", d, err)
		}
	}
	db, err := badger.Open(badgerOptions(s.badgerDir, log))
	if err != nil {
		return nil, fmt.Errorf("logstore: open badger in %s: %w%s", s.badgerDir, err, badgerOpenHint(dir, err))
	}
	s.db = db
	// The segments before the WAL, whose replay writes to them.
	s.segs, err = openSegments(filepath.Join(dir, "segments"), opts.SegmentBytes)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	// The WAL first: the ranges are loaded from what it made durable.
	err = s.recoverWAL(dir)
	if err == nil {
		// Before listing the ranges: a half-dropped one is never loaded.
		err = s.redoDrops()
	}
	var ids []string
	if err == nil {
		ids, err = s.persistedRangeIDs()
	}
	if err == nil {
		for _, id := range ids {
			r, lerr := s.loadRange(id)
			if lerr != nil && quarantines(lerr) {
				// This range's bytes are damaged: it alone stops.
				r, lerr = s.quarantinedRange(id, lerr), nil
			}
			if lerr != nil {
				err = lerr
				break
			}
			s.ranges[id] = r
		}
	}
	if err == nil {
		// After every step that writes or deletes log keys (replay,
		// redone drops and cuts): the counts are Badger's as it is now.
		err = s.buildAccounting()
	}
	if err == nil && s.marksPruned {
		err = s.syncDB()
	}
	if err != nil {
		for _, r := range s.ranges {
			_ = r.closeJournal()
		}
		if s.wal != nil {
			s.wal.close()
		}
		s.segs.close()
		_ = db.Close()
		return nil, err
	}
	// HWMs lowered at load are persisted at once, not after a delay.
	s.hwmDue = len(s.dirty) > 0
	// Before the first write is accepted: a store opened on a full disk
	// opens full.
	s.startDiskMonitor()
	go s.run()
	s.startReclaimer()
	return s, nil
}

// Close commits and syncs every write already accepted, persists dirty
// HWMs, and closes the journals and the database. After a failure
// (ErrFailed) it writes nothing more: the disk stays as the failure left it.
// Closing twice returns ErrClosed.
func (s *Store) Close() error {
	s.qmu.Lock()
	if s.closing {
		s.qmu.Unlock()
		return ErrClosed
	}
	s.closing = true
	s.work.Broadcast()
	s.space.Broadcast()
	s.qmu.Unlock()
	<-s.done // the committer drained the queue (or failed it) and exited
	s.wakeAll()
	// Before life: a pass holds it shared while it syncs.
	s.stopReclaimer()
	s.stopDiskMonitor()

	s.life.Lock()
	defer s.life.Unlock()
	s.closed = true
	// WAL checkpoints start at the writer's switches and at Truncate's;
	// both have ended (the writer exited, and Truncate holds life).
	s.bg.Wait()
	var errs []error
	// Batches the segments refused for want of space (index.go) are in
	// the WAL only: a clean close would move w/gen past them.
	clean := s.writeErrAfterClose() == nil && s.allIndexed()
	if clean {
		errs = append(errs, s.writeFinalMarkers())
	}
	errs = append(errs, s.closeWAL(clean))
	s.segs.close()
	for _, r := range s.snapshotRanges() {
		errs = append(errs, r.closeJournal())
	}
	s.closeSyncHandles()
	errs = append(errs, s.db.Close())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("logstore: close: %w", err)
	}
	return nil
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	return Stats{Syncs: s.syncs.Load(), Commits: s.commits.Load(), IndexCommits: s.indexCommits.Load()}
}

// RangeIDs returns the ids of the ranges with persisted state, sorted.
func (s *Store) RangeIDs() []string {
	s.rangesMu.RLock()
	defer s.rangesMu.RUnlock()
	ids := make([]string, 0, len(s.ranges))
	for id := range s.ranges {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Range returns a loaded range.
func (s *Store) Range(id string) (*Range, bool) {
	s.rangesMu.RLock()
	defer s.rangesMu.RUnlock()
	r, ok := s.ranges[id]
	return r, ok
}

// CreateRange returns range id, creating it if it does not exist: an empty
// journal, then its (zero) State, fsynced before CreateRange returns. The
// journal comes first so that every range with persisted state has one.
func (s *Store) CreateRange(id string) (*Range, error) {
	if err := wire.ValidateRangeID(id); err != nil {
		return nil, fmt.Errorf("%w: CreateRange: %w", ErrInvalid, err)
	}
	unlock := s.lockID(id)
	defer unlock()
	if r, ok := s.Range(id); ok {
		return r, nil
	}
	end, err := s.begin()
	if err != nil {
		return nil, err
	}
	defer end()
	if err := s.writeErr(); err != nil {
		return nil, err
	}
	// A journal file may exist without state: a crash between the two steps
	// below. Its range never existed, so it is replaced, not trusted.
	j, err := journal.CreateFS(s.jfs, s.journalPath(id), nil)
	if err != nil {
		return nil, fmt.Errorf("logstore: CreateRange(%s): %w", id, err)
	}
	if err := s.putSynced(rangeKey(prefixState, id), encodeState(rangeKey(prefixState, id), State{})); err != nil {
		_ = j.Close()
		return nil, fmt.Errorf("logstore: CreateRange(%s): %w", id, err)
	}
	r := newRange(s, id, j)
	s.rangesMu.Lock()
	s.ranges[id] = r
	s.rangesMu.Unlock()
	s.log.Info("created range", "range", id)
	return r, nil
}

// lockID takes the lock of range id that CreateRange and DropRange hold, so
// concurrent calls for one id run one at a time, while different ids (a
// promoter fencing a thousand new ranges) run in parallel and share their
// fsyncs. It returns the unlock.
func (s *Store) lockID(id string) (unlock func()) {
	s.createMu.Lock()
	if s.creating == nil {
		s.creating = map[string]*idLock{}
	}
	l := s.creating[id]
	if l == nil {
		l = &idLock{}
		s.creating[id] = l
	}
	l.users++
	s.createMu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		s.createMu.Lock()
		if l.users--; l.users == 0 {
			delete(s.creating, id)
		}
		s.createMu.Unlock()
	}
}

// idLock is one range id's lock, and how many callers hold or wait for it.
type idLock struct {
	mu    sync.Mutex
	users int
}

func (s *Store) journalPath(id string) string {
	return filepath.Join(s.journalDir, id+".journal")
}

func (s *Store) snapshotRanges() []*Range {
	s.rangesMu.RLock()
	defer s.rangesMu.RUnlock()
	rs := make([]*Range, 0, len(s.ranges))
	for _, r := range s.ranges {
		rs = append(rs, r)
	}
	return rs
}

// begin admits an operation that uses db directly; end must be called after.
func (s *Store) begin() (end func(), err error) {
	s.life.RLock()
	if s.closed {
		s.life.RUnlock()
		return nil, ErrClosed
	}
	return s.life.RUnlock, nil
}

// writeErr reports why the store accepts no writes, if it does not.
func (s *Store) writeErr() error {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	return s.writeErrLocked()
}

func (s *Store) writeErrLocked() error {
	if s.failed != nil {
		return s.failed
	}
	if s.closing {
		return ErrClosed
	}
	return nil
}

// waitErr reports why a waiter will never see more progress: the store
// failed, or it closed and the committer has made durable all it ever will.
func (s *Store) waitErr() error {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	if s.failed != nil {
		return s.failed
	}
	if s.stopped {
		return ErrClosed
	}
	return nil
}

// fail records the first fatal failure, fails every queued write and wakes
// every waiter. After a failed write or fsync the disk holds an unknown
// prefix of what was written, so continuing could acknowledge records that
// are not there; only reopening, which recovers from what is on disk, knows.
func (s *Store) fail(cause error) error {
	// A write that failed for want of space fails the store all the same
	// (what reached the disk is unknown), but status says why.
	s.noteNoSpace(cause)
	// Whether or not it is the first failure: a failed fsync anywhere
	// means a reopen in this process is no recovery (failed.go).
	s.noteSyncFailed(cause)
	err := cause
	if !errors.Is(cause, ErrFailed) {
		err = fmt.Errorf("%w: %w", ErrFailed, cause)
	}
	s.qmu.Lock()
	first := s.failed == nil
	if first {
		s.failed = err
	}
	queue := s.queue
	s.queue = nil
	s.work.Broadcast()
	s.indexWork.Broadcast()
	s.space.Broadcast()
	s.syncWork.Broadcast()
	s.qmu.Unlock()
	if first {
		s.log.Error("store failed; refusing writes until reopened", "err", err)
	}
	for _, w := range queue {
		w.finish(err)
	}
	// In a goroutine: fail may be called with a range's mu held, and
	// wakeAll takes every range's mu.
	go s.wakeAll()
	return err
}

// crash calls Options.CrashAt at point and fails the store if it says so.
func (s *Store) crash(point string) error {
	if s.crashAt == nil {
		return nil
	}
	if err := s.crashAt(point); err != nil {
		return s.fail(fmt.Errorf("simulated crash at %s: %w", point, err))
	}
	return nil
}

// wakeAll wakes every range's Changed waiters, so they notice a failure or
// a close.
func (s *Store) wakeAll() {
	for _, r := range s.snapshotRanges() {
		r.mu.Lock()
		r.notifyLocked()
		r.mu.Unlock()
	}
}
