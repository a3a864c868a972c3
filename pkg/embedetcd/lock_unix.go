//go:build unix

package embedetcd

import (
	"errors"
	"os"
	"syscall"
)

// lockedByOther reports whether another open file of path holds an
// exclusive flock on it, as a running etcd holds its bbolt file. A missing
// file is not locked. The probe's own lock goes with its file descriptor.
func lockedByOther(path string) (bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	// Shared is enough to probe: bbolt's writer holds an exclusive lock,
	// which refuses a shared one, and a shared probe never blocks a reader.
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return true, nil
	}
	return false, err
}
