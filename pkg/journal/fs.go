package journal

import (
	"io"
	"io/fs"
	"os"
)

// FS is the filesystem seam of the journal: every byte the journal reads or
// writes and every fsync it issues goes through one. OSFS is the real one;
// tests wrap it to inject failures or replace it with a crash-simulating
// in-memory filesystem (see package journaltest).
type FS interface {
	// OpenFile opens name with os.OpenFile's flag and perm semantics.
	OpenFile(name string, flag int, perm fs.FileMode) (File, error)
	// Rename atomically replaces newname with oldname. The change is durable
	// only after SyncDir of the directory holding both.
	Rename(oldname, newname string) error
	// Remove removes name.
	Remove(name string) error
	// SyncDir fsyncs the directory dir, making the creation, rename or
	// removal of the names in it durable.
	SyncDir(dir string) error
}

// File is an open journal file. *os.File satisfies it.
//
// The journal writes with WriteAt at computed entry boundaries, never with a
// seek position, so a short write cannot shift where the next entry lands.
type File interface {
	io.ReaderAt
	io.WriterAt
	// Sync makes the file's written bytes and its size durable.
	Sync() error
	// Truncate changes the file's size; durable after Sync.
	Truncate(size int64) error
	// Stat reports the file's size among other things.
	Stat() (fs.FileInfo, error)
	Close() error
}

// OSFS is the operating system's filesystem. It is the default of Open,
// Create and Inspect.
type OSFS struct{}

var _ FS = OSFS{}

// OpenFile calls os.OpenFile.
func (OSFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		// Return a nil interface, not an interface holding a nil *os.File.
		return nil, err
	}
	return f, nil
}

// Rename calls os.Rename.
func (OSFS) Rename(oldname, newname string) error { return os.Rename(oldname, newname) }

// Remove calls os.Remove.
func (OSFS) Remove(name string) error { return os.Remove(name) }

// SyncDir opens dir and fsyncs it. Without it, a power loss can take a newly
// created or renamed journal's directory entry, and the whole history with it,
// even though the file's own bytes were fsynced.
func (OSFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		_ = d.Close()
		return err
	}
	return d.Close()
}
