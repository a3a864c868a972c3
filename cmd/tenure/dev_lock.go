package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// devLockFile is the file in its data directory that a running tenure dev
// holds an exclusive lock on (flock, released when the process ends, however
// it ends), with its pid in it for the message of the one refused.
const devLockFile = "tenure-dev.lock"

// lockDataDir takes dir's lock without waiting, or says which process holds
// it. A second tenure dev on the same --data-dir blocked in embedded etcd's
// open of its bbolt file (etcd waits for that file's lock without a bound)
// after printing its header: silent, deaf to Ctrl-C until the stop bound
// gave up on it, and touching the first one's files on the way (dev.log,
// certs). It now stops before anything in dir is opened.
func lockDataDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, devLockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("--data-dir: lock %s: %w", path, err)
	}
	busy, err := tryLock(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("--data-dir: lock %s: %w", path, err)
	}
	if busy {
		holder := "another process"
		b, _ := io.ReadAll(io.LimitReader(f, 32))
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			holder = fmt.Sprintf("another process (pid %d, another tenure dev?)", pid)
		}
		f.Close()
		return nil, fmt.Errorf("data directory %s is in use by %s: %s is locked; stop that one or give another --data-dir", dir, holder, path)
	}
	// The pid is for the message above only: the lock is what excludes.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}
