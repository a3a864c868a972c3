package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A second tenure dev on a data directory another one is using fails at
// once, naming the directory and its lock, and leaves the first alone. It
// printed its header and then blocked in embedded etcd's open of the
// first one's bbolt file: nothing for over a minute, and Ctrl-C only
// ended it through the stop bound ("stuck stopping").
func TestDevRefusesADataDirInUse(t *testing.T) {
	bin := buildTenure(t)
	dir := filepath.Join(t.TempDir(), "data")
	first := startDev(t, bin, "--keep", "--records", "1", "--data-dir", dir)
	// Its etcd holds its files from here on.
	first.waitLine(t, "embedded, data in", 60*time.Second)

	began := time.Now()
	stdout, stderr, status := runTenure(t, bin, "dev", "--base-port", "0", "--data-dir", dir)
	took := time.Since(began)
	lock := filepath.Join(dir, devLockFile)
	if status != 1 || took > 10*time.Second || stdout != "" ||
		!strings.Contains(stderr, "data directory "+dir+" is in use by another process") || !strings.Contains(stderr, lock+" is locked") {
		t.Errorf("a second tenure dev on %s: exit %d after %v, stdout %q, stderr %q; want exit 1 within 10s, nothing on stdout, and the directory and %s named on stderr",
			dir, status, took, stdout, stderr, lock)
	}

	// The first goes on as if nothing happened, and stops cleanly.
	first.waitLine(t, "The cluster keeps running", 60*time.Second)
	if err := first.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := first.wait(t, 30*time.Second); err != nil {
		t.Fatalf("the first tenure dev after Ctrl-C: %v\n%s", err, first.output())
	}
	first.checkCleanedUp(t)
	// Its lock went with it.
	f, err := lockDataDir(dir)
	if err != nil {
		t.Fatalf("lock %s after the first tenure dev stopped: %v", dir, err)
	}
	f.Close()
}
