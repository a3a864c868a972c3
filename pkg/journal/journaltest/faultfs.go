package journaltest

import (
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"sync/atomic"

	"github.com/tenurelog/tenure/pkg/journal"
)

// ErrInjected is the failure the helpers here inject.
var ErrInjected = errors.New("journaltest: injected failure")

// Op names a filesystem operation FaultFS can fail.
type Op int

// The operations, one per method of journal.FS and journal.File.
const (
	OpOpen Op = iota
	OpRead
	OpWrite
	OpSync
	OpTruncate
	OpStat
	OpClose
	OpRename
	OpRemove
	OpSyncDir
)

var opNames = [...]string{"open", "read", "write", "sync", "truncate", "stat", "close", "rename", "remove", "syncdir"}

func (o Op) String() string {
	if o >= 0 && int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", int(o))
}

// Injector decides the fate of one operation on name: nil lets it through,
// an error fails it without performing it. For OpWrite, a *ShortWrite error
// first writes its N leading bytes: a torn write.
type Injector func(op Op, name string) error

// ShortWrite makes an injected write keep only its first N bytes.
type ShortWrite struct{ N int }

func (s *ShortWrite) Error() string {
	return fmt.Sprintf("journaltest: injected short write of %d bytes", s.N)
}

// FailOp fails every op of kind op with err.
func FailOp(op Op, err error) Injector {
	return func(o Op, _ string) error {
		if o == op {
			return err
		}
		return nil
	}
}

// After lets the first n operations through and fails every later one with
// ErrInjected: a power cut after n operations, when paired with
// MemFS.Crash. It is safe for concurrent use.
func After(n int) Injector {
	var seen atomic.Int64
	return func(Op, string) error {
		if seen.Add(1) > int64(n) {
			return ErrInjected
		}
		return nil
	}
}

// FaultFS wraps a journal.FS, failing the operations its Injector chooses and
// counting the fsyncs (file Syncs and SyncDirs) that reach the wrapped FS.
// It is safe for concurrent use.
type FaultFS struct {
	fs     journal.FS
	mu     sync.Mutex
	inject Injector
	syncs  atomic.Int64
}

var _ journal.FS = (*FaultFS)(nil)

// NewFaultFS wraps fsys with no failures.
func NewFaultFS(fsys journal.FS) *FaultFS { return &FaultFS{fs: fsys} }

// SetInjector replaces the injector; nil injects nothing.
func (f *FaultFS) SetInjector(in Injector) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inject = in
}

// Syncs returns how many file Syncs and SyncDirs reached the wrapped FS.
func (f *FaultFS) Syncs() int64 { return f.syncs.Load() }

func (f *FaultFS) fault(op Op, name string) error {
	f.mu.Lock()
	in := f.inject
	f.mu.Unlock()
	if in == nil {
		return nil
	}
	return in(op, name)
}

func (f *FaultFS) OpenFile(name string, flag int, perm fs.FileMode) (journal.File, error) {
	if err := f.fault(OpOpen, name); err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	file, err := f.fs.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &faultFile{File: file, fs: f, name: name}, nil
}

func (f *FaultFS) Rename(oldname, newname string) error {
	if err := f.fault(OpRename, oldname); err != nil {
		return &fs.PathError{Op: "rename", Path: oldname, Err: err}
	}
	return f.fs.Rename(oldname, newname)
}

func (f *FaultFS) Remove(name string) error {
	if err := f.fault(OpRemove, name); err != nil {
		return &fs.PathError{Op: "remove", Path: name, Err: err}
	}
	return f.fs.Remove(name)
}

func (f *FaultFS) SyncDir(dir string) error {
	if err := f.fault(OpSyncDir, dir); err != nil {
		return &fs.PathError{Op: "syncdir", Path: dir, Err: err}
	}
	f.syncs.Add(1)
	return f.fs.SyncDir(dir)
}

// faultFile wraps one open file of a FaultFS.
type faultFile struct {
	journal.File
	fs   *FaultFS
	name string
}

func (f *faultFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.fs.fault(OpRead, f.name); err != nil {
		return 0, &fs.PathError{Op: "read", Path: f.name, Err: err}
	}
	return f.File.ReadAt(p, off)
}

func (f *faultFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.fs.fault(OpWrite, f.name); err != nil {
		n := 0
		if sw, ok := errors.AsType[*ShortWrite](err); ok {
			n, _ = f.File.WriteAt(p[:min(sw.N, len(p))], off)
		}
		return n, &fs.PathError{Op: "write", Path: f.name, Err: err}
	}
	return f.File.WriteAt(p, off)
}

func (f *faultFile) Sync() error {
	if err := f.fs.fault(OpSync, f.name); err != nil {
		return &fs.PathError{Op: "sync", Path: f.name, Err: err}
	}
	f.fs.syncs.Add(1)
	return f.File.Sync()
}

func (f *faultFile) Truncate(size int64) error {
	if err := f.fs.fault(OpTruncate, f.name); err != nil {
		return &fs.PathError{Op: "truncate", Path: f.name, Err: err}
	}
	return f.File.Truncate(size)
}

func (f *faultFile) Stat() (fs.FileInfo, error) {
	if err := f.fs.fault(OpStat, f.name); err != nil {
		return nil, &fs.PathError{Op: "stat", Path: f.name, Err: err}
	}
	return f.File.Stat()
}

// Close always closes the wrapped file, so an injected failure leaks no
// descriptor, and then reports the injected error.
func (f *faultFile) Close() error {
	injected := f.fs.fault(OpClose, f.name)
	err := f.File.Close()
	if injected != nil {
		return &fs.PathError{Op: "close", Path: f.name, Err: injected}
	}
	return err
}
