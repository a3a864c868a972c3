package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A replica whose data directory is removed under it cannot close its
// store (Badger retries the memtable flush forever); SIGTERM still ends the
// process within the stop bound, exiting non-zero and naming the step that
// did not end. It ignored SIGTERM until SIGKILL.
func TestReplicaStopsOnSIGTERMWithItsDataDirGone(t *testing.T) {
	bin := buildTenure(t)
	dir := filepath.Join(t.TempDir(), "r1")
	rep := startServer(t, bin, "replica", filepath.Join(t.TempDir(), "ready"), nil,
		"replica", "--id", "r1", "--listen", "127.0.0.1:0", "--data-dir", dir)
	rep.waitReady(t)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := rep.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-rep.exited:
		if err == nil {
			t.Fatalf("the replica exited 0 although its store could not close; stderr:\n%s", rep.stderr.String())
		}
		if want := "stuck closing the ranges and the store (Badger) in " + dir; !strings.Contains(rep.stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, rep.stderr.String())
		}
	case <-time.After(stopWithin + 20*time.Second):
		t.Fatalf("the replica did not exit within %v of SIGTERM; stderr:\n%s", stopWithin+20*time.Second, rep.stderr.String())
	}
}
