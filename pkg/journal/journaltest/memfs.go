// Package journaltest provides filesystems for testing code that keeps an
// epoch journal: MemFS, which simulates a crash by keeping only what was
// fsynced, and FaultFS, which injects failing or torn operations into any
// journal.FS and counts fsyncs. Crash safety is tested, not hoped for.
package journaltest

import (
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/tenurelog/tenure/pkg/journal"
)

// MemFS is an in-memory journal.FS that remembers what is durable: a file's
// bytes as of its last Sync, and a directory's names as of its last SyncDir.
// Crash returns what a machine would find after losing power at that moment.
// Unsynced bytes are lost entirely (torn writes are FaultFS's job).
//
// Directories are not modelled beyond that: any directory exists. Names are
// cleaned with filepath.Clean, so "r1.journal" lives in directory ".".
// A MemFS is safe for concurrent use.
type MemFS struct {
	mu sync.Mutex
	// live is the namespace as running code sees it.
	live map[string]*inode
	// durable is the namespace as of each directory's last SyncDir.
	durable map[string]*inode
}

// inode is one file's content. A name maps to an inode, so a renamed or
// removed file's durable name can still point at its synced bytes.
type inode struct {
	data   []byte
	synced []byte
}

var _ journal.FS = (*MemFS)(nil)

// NewMemFS returns an empty MemFS.
func NewMemFS() *MemFS {
	return &MemFS{live: map[string]*inode{}, durable: map[string]*inode{}}
}

// Crash returns a new MemFS holding only what m made durable: the names
// present at their directory's last SyncDir, each with its bytes as of its
// last Sync. m itself is left as it was.
func (m *MemFS) Crash() *MemFS {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := NewMemFS()
	for name, ino := range m.durable {
		n := &inode{data: slices.Clone(ino.synced), synced: slices.Clone(ino.synced)}
		c.live[name], c.durable[name] = n, n
	}
	return c
}

// WriteFile creates or replaces name with data, durably, as if written,
// fsynced and its directory fsynced long ago. It sets up test fixtures.
func (m *MemFS) WriteFile(name string, data []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	name = filepath.Clean(name)
	n := &inode{data: slices.Clone(data), synced: slices.Clone(data)}
	m.live[name], m.durable[name] = n, n
}

// ReadFile returns name's current (not necessarily durable) bytes.
func (m *MemFS) ReadFile(name string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ino, ok := m.live[filepath.Clean(name)]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	return slices.Clone(ino.data), nil
}

// OpenFile honours O_CREATE, O_EXCL, O_TRUNC and the access mode.
func (m *MemFS) OpenFile(name string, flag int, _ fs.FileMode) (journal.File, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	name = filepath.Clean(name)
	ino, ok := m.live[name]
	switch {
	case ok && flag&os.O_CREATE != 0 && flag&os.O_EXCL != 0:
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrExist}
	case !ok && flag&os.O_CREATE == 0:
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	case !ok:
		ino = &inode{}
		m.live[name] = ino
	}
	access := flag & (os.O_RDONLY | os.O_WRONLY | os.O_RDWR)
	f := &memFile{fs: m, ino: ino, name: name, canRead: access != os.O_WRONLY, canWrite: access != os.O_RDONLY}
	if flag&os.O_TRUNC != 0 && f.canWrite {
		ino.data = nil
	}
	return f, nil
}

// Rename moves oldname to newname in the live namespace; durable after
// SyncDir.
func (m *MemFS) Rename(oldname, newname string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	oldname, newname = filepath.Clean(oldname), filepath.Clean(newname)
	ino, ok := m.live[oldname]
	if !ok {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: fs.ErrNotExist}
	}
	m.live[newname] = ino
	delete(m.live, oldname)
	return nil
}

// Remove removes name from the live namespace; durable after SyncDir.
func (m *MemFS) Remove(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	name = filepath.Clean(name)
	if _, ok := m.live[name]; !ok {
		return &fs.PathError{Op: "remove", Path: name, Err: fs.ErrNotExist}
	}
	delete(m.live, name)
	return nil
}

// SyncDir makes dir's live names durable, removals included.
func (m *MemFS) SyncDir(dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	dir = filepath.Clean(dir)
	for name := range m.durable {
		if filepath.Dir(name) == dir {
			delete(m.durable, name)
		}
	}
	for name, ino := range m.live {
		if filepath.Dir(name) == dir {
			m.durable[name] = ino
		}
	}
	return nil
}

// memFile is an open MemFS file. Its state is guarded by fs.mu.
type memFile struct {
	fs                *MemFS
	ino               *inode
	name              string
	canRead, canWrite bool
	closed            bool
}

// Access a file operation needs.
const (
	needOpen = iota
	needRead
	needWrite
)

func (f *memFile) check(op string, need int) error {
	switch {
	case f.closed:
		return &fs.PathError{Op: op, Path: f.name, Err: fs.ErrClosed}
	case need == needRead && !f.canRead, need == needWrite && !f.canWrite:
		return &fs.PathError{Op: op, Path: f.name, Err: fs.ErrPermission}
	}
	return nil
}

func (f *memFile) ReadAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("read", needRead); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, &fs.PathError{Op: "read", Path: f.name, Err: fs.ErrInvalid}
	}
	if off >= int64(len(f.ino.data)) {
		return 0, io.EOF
	}
	n := copy(p, f.ino.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (f *memFile) WriteAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("write", needWrite); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, &fs.PathError{Op: "write", Path: f.name, Err: fs.ErrInvalid}
	}
	if end := off + int64(len(p)); end > int64(len(f.ino.data)) {
		f.ino.data = append(f.ino.data, make([]byte, end-int64(len(f.ino.data)))...)
	}
	return copy(f.ino.data[off:], p), nil
}

func (f *memFile) Sync() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("sync", needOpen); err != nil {
		return err
	}
	f.ino.synced = slices.Clone(f.ino.data)
	return nil
}

func (f *memFile) Truncate(size int64) error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("truncate", needWrite); err != nil {
		return err
	}
	if size < 0 {
		return &fs.PathError{Op: "truncate", Path: f.name, Err: fs.ErrInvalid}
	}
	if size <= int64(len(f.ino.data)) {
		f.ino.data = f.ino.data[:size:size]
	} else {
		f.ino.data = append(f.ino.data, make([]byte, size-int64(len(f.ino.data)))...)
	}
	return nil
}

func (f *memFile) Stat() (fs.FileInfo, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("stat", needOpen); err != nil {
		return nil, err
	}
	return memInfo{name: filepath.Base(f.name), size: int64(len(f.ino.data))}, nil
}

func (f *memFile) Close() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.closed {
		return &fs.PathError{Op: "close", Path: f.name, Err: fs.ErrClosed}
	}
	f.closed = true
	return nil
}

type memInfo struct {
	name string
	size int64
}

func (i memInfo) Name() string       { return i.name }
func (i memInfo) Size() int64        { return i.size }
func (i memInfo) Mode() fs.FileMode  { return 0o644 }
func (i memInfo) ModTime() time.Time { return time.Time{} }
func (i memInfo) IsDir() bool        { return false }
func (i memInfo) Sys() any           { return nil }
