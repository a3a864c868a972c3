package logstore

import (
	"errors"
	"io/fs"

	"github.com/tenurelog/tenure/pkg/journal"
)

// What a failure leaves, and whether a reopen heals it.
//
// A store fails whole (ErrFailed) after a write or fsync failed: what
// reached the disk is unknown until Open recovers from it. For a failed
// write that is all: Open replays the WAL and cuts a torn tail by its
// checksums, so the reopened store holds every record a completed fdatasync
// covered, and nothing else is claimed. A failed fsync is different
// (fsyncgate, PostgreSQL 2018): Linux may mark the dirty pages it could not
// write back clean, or drop them, and a later read may return them from
// the page cache although they are not on the disk. A reopen in the same
// process would replay those bytes and call them durable, and a power loss
// later takes them back. So the store remembers whether any fsync it
// issued ever failed (Failed's syncFailed), and a caller that reopens a
// store after a want of space (package replica) does so only when none
// did: that takes a restart of the machine's page cache, i.e. the process
// and a check of the disk, as before.

// ErrSyncFailed is in the chain of every error of a failed fsync or
// fdatasync the store issued itself (its WAL, its segments, Badger's files,
// the directories and the epoch journals). Badger's own flushes of its
// tables are not seen here.
var ErrSyncFailed = errors.New("logstore: fsync failed")

// syncError marks err as a failed fsync; its message is err's.
type syncError struct{ err error }

func (e *syncError) Error() string        { return e.err.Error() }
func (e *syncError) Unwrap() error        { return e.err }
func (e *syncError) Is(target error) bool { return target == ErrSyncFailed }

// syncFailure marks a failed fsync's error (nil stays nil).
func syncFailure(err error) error {
	if err == nil {
		return nil
	}
	return &syncError{err: err}
}

// Failed reports why the store stopped taking writes: an error wrapping
// ErrFailed and the first failure's cause (errors.Is(err,
// syscall.ENOSPC) for a write that found no space), or nil while it has not
// failed. syncFailed says whether any fsync the store issued has failed,
// before or after that first failure: then a reopen in this process is not
// a recovery (see above).
func (s *Store) Failed() (err error, syncFailed bool) {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	return s.failed, s.syncFailed
}

// noteSyncFailed records that an fsync failed, if cause is one. Called by
// fail for every failure, the first or not. s.qmu is not held.
func (s *Store) noteSyncFailed(cause error) {
	if !errors.Is(cause, ErrSyncFailed) {
		return
	}
	s.qmu.Lock()
	s.syncFailed = true
	s.qmu.Unlock()
}

// syncWatchFS is the journals' filesystem with every failed fsync marked
// (ErrSyncFailed): the journal package poisons itself and returns the
// error, and the store fails on it (Range.journalErr).
type syncWatchFS struct{ journal.FS }

func (f syncWatchFS) OpenFile(name string, flag int, perm fs.FileMode) (journal.File, error) {
	file, err := f.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return syncWatchFile{file}, nil
}

func (f syncWatchFS) SyncDir(dir string) error { return syncFailure(f.FS.SyncDir(dir)) }

type syncWatchFile struct{ journal.File }

func (f syncWatchFile) Sync() error { return syncFailure(f.File.Sync()) }
