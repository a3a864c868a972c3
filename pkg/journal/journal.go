package journal

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
)

// Errors, matched with errors.Is. Every error from this package starts with
// "journal: ".
var (
	// ErrCorrupt: the file is not a journal this build can trust (bad header,
	// damage before the final entry, a non-advancing history, or too long).
	// The history is unknown until rebuilt from the log with Create.
	ErrCorrupt = errors.New("journal: corrupt")
	// ErrConflict: the entry contradicts the history: the latest epoch at a
	// different start, or a later epoch starting below the latest start.
	ErrConflict = errors.New("journal: conflicting entry")
	// ErrPoisoned: an earlier write, fsync or truncate failed, so the file's
	// tail is unknown. Reopen the journal to revalidate it.
	ErrPoisoned = errors.New("journal: poisoned")
	// ErrFull: the journal already holds MaxEntries entries.
	ErrFull = errors.New("journal: full")
	// ErrInvalid: the caller asked for an entry or history the rules forbid
	// (epoch 0, or a non-advancing history given to Create).
	ErrInvalid = errors.New("journal: invalid history")
	// ErrClosed: the Journal was closed.
	ErrClosed = errors.New("journal: closed")
)

// A Journal is an open epoch journal. It is safe for concurrent use; reads
// take the same lock as writes, so no caller observes an entry before it is
// durable, nor a history half-way through a truncation.
type Journal struct {
	path string
	// fsys is the filesystem the journal lives in (TrimBefore rewrites
	// the file through it).
	fsys FS

	// mu guards the fields below, for reads as well as writes.
	mu sync.Mutex
	// f is the open file.
	// Invariant: unless poisoned, f's length is entryOffset(len(entries)) and
	// its bytes are the header and entries, all fsynced.
	f File
	// entries is the durable history.
	// Invariant: checkHistory(entries) == nil.
	entries []EpochStart
	// poisoned is the first write, fsync or truncate failure; once set, the
	// bytes past the last durable entry are unknown, nothing more is written
	// and the history reads empty.
	poisoned error
	// closed is set by Close; nothing is written after it.
	closed bool
}

// Open opens the journal at path with the operating system's filesystem,
// creating it if missing. See OpenFS.
func Open(path string) (*Journal, error) { return OpenFS(OSFS{}, path) }

// OpenFS opens the journal at path in fsys, creating it if missing, and
// recovers it: a torn or checksum-failed final entry is cut off and the cut
// fsynced, so the next Record lands on an entry boundary. Damage anywhere
// else is ErrCorrupt. The parent directory is fsynced on every open, not only
// on create: a crash between creating the file and syncing its directory
// leaves a file that exists now but whose name may not survive power loss.
func OpenFS(fsys FS, path string) (*Journal, error) {
	f, err := fsys.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	entries, err := recoverFile(fsys, f, path)
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return &Journal{path: path, fsys: fsys, f: f, entries: entries}, nil
}

// recoverFile reads and validates f, applies the repair scan decided, and
// makes the file and its name durable.
func recoverFile(fsys FS, f File, path string) ([]EpochStart, error) {
	in, err := readImage(f, path)
	if err != nil {
		return nil, err
	}
	switch in.Repair {
	case RepairHeader:
		// The file holds nothing or a prefix of the header, so writing the
		// whole header over it loses nothing.
		if _, err := f.WriteAt(header[:], 0); err != nil {
			return nil, fmt.Errorf("journal: write header of %s: %w", path, err)
		}
	case RepairTorn, RepairChecksum:
		// Cut to the last whole entry. Dropping the fragment from memory but
		// leaving it on disk would make the next append land after it and
		// misalign every entry from then on; the damage would show only at
		// the next open, as a refused or wrong history.
		if err := f.Truncate(in.Size - int64(in.CutBytes)); err != nil {
			return nil, fmt.Errorf("journal: cut torn tail of %s: %w", path, err)
		}
	}
	if in.Repair != RepairNone {
		if err := f.Sync(); err != nil {
			return nil, fmt.Errorf("journal: sync %s after %s: %w", path, in.Repair, err)
		}
	}
	// filepath.Dir of a bare name is ".", so a relative journal name works.
	if err := fsys.SyncDir(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("journal: sync directory of %s: %w", path, err)
	}
	return in.Entries, nil
}

// readImage reads the whole of f, bounded, and scans it.
func readImage(f File, path string) (Inspection, error) {
	fi, err := f.Stat()
	if err != nil {
		return Inspection{}, fmt.Errorf("journal: %w", err)
	}
	// Bound before allocating: the size is the file's say-so.
	if err := checkSize(fi.Size()); err != nil {
		return Inspection{}, fmt.Errorf("%w (in %s)", err, path)
	}
	img := make([]byte, fi.Size())
	n, err := f.ReadAt(img, 0)
	switch {
	case n == len(img):
		err = nil // ReadAt may report io.EOF with a full read
	case err == nil, errors.Is(err, io.EOF):
		err = io.ErrUnexpectedEOF // the file shrank under us
	}
	if err != nil {
		return Inspection{}, fmt.Errorf("journal: read %s: %w", path, err)
	}
	in, err := scan(img)
	if err != nil {
		return Inspection{}, fmt.Errorf("%w (in %s)", err, path)
	}
	return in, nil
}

// Record makes (epoch, start) the latest entry: this replica's first record
// under epoch sits at start. The entry is fsynced before Record returns, so
// the caller may expose the epoch or write its records only after a nil
// error.
//
// Recording the latest pair again is a no-op, and so is an epoch older than
// the latest: both are observations a watcher repeats, not rewinds. epoch 0
// is ErrInvalid; the latest epoch at another start, or a start below the
// latest start, is ErrConflict; a full journal is ErrFull. A failed write or
// fsync poisons the journal.
func (j *Journal) Record(epoch, start uint64) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.writable(); err != nil {
		return err
	}
	// Epoch 0 means "no grant yet": nothing is ever written under it, so it
	// has no start to record.
	if epoch == 0 {
		return fmt.Errorf("%w: Record(0, %d): epoch 0 is never recorded", ErrInvalid, start)
	}
	if n := len(j.entries); n > 0 {
		latest := j.entries[n-1]
		switch {
		case epoch < latest.Epoch:
			// A stale observation (a late fetch answer, a slow watcher):
			// the older epoch is already behind us. Recording it would
			// rewind the history; refusing it would fail a harmless caller.
			return nil
		case epoch == latest.Epoch && start == latest.Start:
			return nil
		case epoch == latest.Epoch:
			// An epoch has exactly one first record. Two starts for one
			// epoch mean two claims about the same boundary, and picking
			// either would misattribute the records between them.
			return fmt.Errorf("%w: Record(%d, %d): epoch %d already starts at %d", ErrConflict, epoch, start, epoch, latest.Start)
		case start < latest.Start:
			// A later epoch writes after the earlier one in the log; starting
			// below it would make the stretches overlap.
			return fmt.Errorf("%w: Record(%d, %d): start is below the latest start %d (epoch %d)", ErrConflict, epoch, start, latest.Start, latest.Epoch)
		}
	}
	if len(j.entries) >= MaxEntries {
		return fmt.Errorf("%w: Record(%d, %d): %d entries is the limit (wire.MaxEpochStarts); a range with this many leadership changes is flapping and needs an operator", ErrFull, epoch, start, MaxEntries)
	}

	e := EpochStart{Epoch: epoch, Start: start}
	i := len(j.entries)
	var buf [EntryBytes]byte
	// WriteAt the computed boundary, not the current end: the file length is
	// entryOffset(i) by the invariant on f.
	if _, err := j.f.WriteAt(appendEntry(buf[:0], e), entryOffset(i)); err != nil {
		return j.poison(fmt.Errorf("write entry %d (%d, %d) of %s: %w", i, epoch, start, j.path, err))
	}
	if err := j.f.Sync(); err != nil {
		return j.poison(fmt.Errorf("sync entry %d (%d, %d) of %s: %w", i, epoch, start, j.path, err))
	}
	// Only now, durable, does the entry become visible.
	j.entries = append(j.entries, e)
	return nil
}

// TruncateFrom removes the entries whose start is at or above offset, for a
// log truncated to end at offset: an epoch whose first record is gone wrote
// nothing that remains, and keeping it would claim records the log no longer
// holds. The cut is fsynced before TruncateFrom returns; a failure poisons
// the journal. Entries below offset stay, even though their epoch's stretch
// now ends earlier: its start is still where it was.
func (j *Journal) TruncateFrom(offset uint64) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.writable(); err != nil {
		return err
	}
	// Starts never decrease, so the entries at or above offset are a suffix.
	keep := sort.Search(len(j.entries), func(i int) bool { return j.entries[i].Start >= offset })
	if keep == len(j.entries) {
		return nil
	}
	// The kept entries are a prefix of fixed-size records, so cutting the
	// file at entry boundary keep is the whole rewrite, and crash-safe
	// without a temporary file: a crash leaves either the old length, whose
	// entries are all whole, or the new one.
	if err := j.f.Truncate(entryOffset(keep)); err != nil {
		return j.poison(fmt.Errorf("truncate %s to %d entries: %w", j.path, keep, err))
	}
	if err := j.f.Sync(); err != nil {
		return j.poison(fmt.Errorf("sync %s truncated to %d entries: %w", j.path, keep, err))
	}
	j.entries = j.entries[:keep]
	return nil
}

// TrimBefore removes the entries that describe only offsets below offset:
// every entry but the one in force at offset (the last starting at or
// below it) and those after it. It is for a log whose front retention
// removed (logstore's AdvanceLogStart passes the last offset it removed, so
// that the epoch of the record just below the log start stays known). The
// kept entries are the very entries the journal held, so the first one may
// start below offset: its epoch is in force from there on, whatever of its
// stretch the log still holds. DivergencePoint and EndOffsetFor stay exact
// for every offset at or above offset (see DivergencePoint on trimmed
// histories). No entry starts at or below offset: nothing changes.
//
// The file keeps its format: header, then the kept entries. It is rewritten
// whole (entry k of a journal is always at byte 8+20k, so a front cannot be
// cut in place) the way Create replaces a journal: written to path+".tmp",
// fsynced, renamed over path, the directory fsynced. A crash at any point
// leaves the old journal or the new one, never a mix. A failure poisons the
// journal (the file may be the old or the new one until reopened).
func (j *Journal) TrimBefore(offset uint64) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.writable(); err != nil {
		return err
	}
	// Starts never decrease: the entries starting at or below offset are a
	// prefix, and the last of them is the one in force at offset.
	k := sort.Search(len(j.entries), func(i int) bool { return j.entries[i].Start > offset }) - 1
	if k <= 0 {
		return nil // no entry, or only the one in force, starts at or below offset
	}
	keep := j.entries[k:]
	img := make([]byte, 0, entryOffset(len(keep)))
	img = append(img, header[:]...)
	for _, e := range keep {
		img = appendEntry(img, e)
	}
	tmp := j.path + ".tmp"
	if err := writeSynced(j.fsys, tmp, img); err != nil {
		_ = j.fsys.Remove(tmp)
		return j.poison(fmt.Errorf("trim %s before %d: %w", j.path, offset, err))
	}
	if err := j.fsys.Rename(tmp, j.path); err != nil {
		_ = j.fsys.Remove(tmp)
		return j.poison(fmt.Errorf("trim %s before %d: %w", j.path, offset, err))
	}
	// From here the name may point at either file until the directory is
	// synced; both are whole journals, and memory follows the new one only
	// once it is durable.
	if err := j.fsys.SyncDir(filepath.Dir(j.path)); err != nil {
		return j.poison(fmt.Errorf("trim %s before %d: sync directory: %w", j.path, offset, err))
	}
	f, err := j.fsys.OpenFile(j.path, os.O_RDWR, 0o644)
	if err != nil {
		return j.poison(fmt.Errorf("trim %s before %d: reopen: %w", j.path, offset, err))
	}
	// The old descriptor is the replaced file's, no longer named: appends
	// must go to the new one.
	_ = j.f.Close()
	j.f = f
	j.entries = append([]EpochStart(nil), keep...)
	return nil
}

// Entries returns a copy of the history. It is empty when the history is
// unknown (nothing recorded) or broken (the journal is poisoned): never a
// partial vector, which would read as authoritative.
func (j *Journal) Entries() []EpochStart {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.poisoned != nil || len(j.entries) == 0 {
		return nil
	}
	return append([]EpochStart(nil), j.entries...)
}

// Latest returns the latest entry; false when the history is empty or the
// journal is poisoned.
func (j *Journal) Latest() (EpochStart, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.poisoned != nil || len(j.entries) == 0 {
		return EpochStart{}, false
	}
	return j.entries[len(j.entries)-1], true
}

// Close closes the file. Record and TruncateFrom then return ErrClosed;
// Entries and Latest keep answering from memory. Closing twice is a no-op.
func (j *Journal) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return nil
	}
	j.closed = true
	if err := j.f.Close(); err != nil {
		return fmt.Errorf("journal: close %s: %w", j.path, err)
	}
	return nil
}

// writable reports why the journal must not be changed, if it must not.
// j.mu is held.
func (j *Journal) writable() error {
	if j.closed {
		return fmt.Errorf("%w: %s", ErrClosed, j.path)
	}
	if j.poisoned != nil {
		return fmt.Errorf("%w: reopen the journal to recover (first failure: %w)", ErrPoisoned, j.poisoned)
	}
	return nil
}

// poison records the first failure and returns it as ErrPoisoned. j.mu is
// held. Poisoning rather than retrying: after a failed write or fsync the
// file may hold a partial entry, and the kernel may have dropped the dirty
// pages, so a retry could report success over bytes that never reach disk.
// Only reopening, which rereads and revalidates the file, knows the truth.
func (j *Journal) poison(cause error) error {
	if j.poisoned == nil {
		j.poisoned = cause
	}
	return fmt.Errorf("%w: %w", ErrPoisoned, cause)
}
