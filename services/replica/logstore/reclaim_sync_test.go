package logstore_test

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tenurelog/tenure/services/replica/logstore"
)

// Segment files a log start freed are deleted while a segment sync is in
// progress (a WAL checkpoint's fdatasync of the last moments' batches
// takes tens of milliseconds on a busy disk), except a file that sync is
// using: that one goes once the sync is over.
func TestReclaimDoesNotWaitForASegmentSync(t *testing.T) {
	defer logstore.SetSegmentBytes(4 << 10)()
	o, s, a := committedInSmallSegments(t)
	defer closeStore(t, s)
	files := o.segmentFiles()
	if len(files) < 5 {
		t.Fatalf("%d segment files, want at least 5", len(files))
	}
	// A sync of the newest file and of the oldest, which the advance
	// frees, is in progress until released.
	first, newest := uint32(1), uint32(len(files))
	release := sync.OnceFunc(s.HoldSegmentSync(first, newest))
	defer release()

	// Batches at 0 (epoch start), 1, 3, ..., 23: keep the last two.
	if got, err := a.AdvanceLogStart(21); err != nil || got != 21 {
		t.Fatalf("AdvanceLogStart(21) = %d, %v", got, err)
	}
	gone := func(f string) bool { _, err := os.Stat(f); return os.IsNotExist(err) }
	// Deleted without the sync ending: every freed file but the first.
	deadline := time.Now().Add(10 * time.Second)
	for !gone(segmentFile(o, 2)) {
		if time.Now().After(deadline) {
			t.Fatalf("segment 2, freed, not deleted within 10s while a segment sync of 1 and %d runs: %v", newest, o.segmentFiles())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if gone(segmentFile(o, first)) {
		t.Fatal("segment 1 deleted while a sync was using it")
	}
	release()
	if _, err := s.ReclaimNow(); err != nil {
		t.Fatalf("ReclaimNow() = %v", err)
	}
	for !gone(segmentFile(o, first)) {
		if time.Now().After(deadline) {
			t.Fatalf("segment 1 not deleted within 10s once the sync ended: %v", o.segmentFiles())
		}
		time.Sleep(5 * time.Millisecond)
	}
	checkFilesLive(t, o, s)
	checkStoredBytes(t, s, a)
	if recs := readAll(t, a); len(recs) != 4 || recs[0].GetOffset() != 21 {
		t.Fatalf("a reads %d records after advancing to 21, want 4 from 21", len(recs))
	}
}

// A segment file is closed when it is deleted: an unlinked file's blocks
// are freed only once its last descriptor closes, and a descriptor kept
// to the next reclaim pass kept them allocated until then, however far
// off that was.
func TestDeletedSegmentsAreClosed(t *testing.T) {
	defer logstore.SetSegmentBytes(4 << 10)()
	o, s, a := committedInSmallSegments(t)
	defer closeStore(t, s)
	readAll(t, a) // every file open, written or read
	before := len(o.segmentFiles())
	if got, err := a.AdvanceLogStart(21); err != nil || got != 21 {
		t.Fatalf("AdvanceLogStart(21) = %d, %v", got, err)
	}
	// The background pass the release kicked deletes them; no other runs.
	deadline := time.Now().Add(10 * time.Second)
	for len(o.segmentFiles()) > 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d segment files left 10s after the log start freed all but 2 batches", len(o.segmentFiles()), before)
		}
		time.Sleep(time.Millisecond)
	}
	if open := deletedOpen(t, filepath.Join(o.dir, "segments")); len(open) > 0 {
		t.Fatalf("deleted segment files still open: %v", open)
	}
}

// deletedOpen lists the files under dir this process holds open after
// they were unlinked.
func deletedOpen(t *testing.T, dir string) []string {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("ReadDir(/proc/self/fd) = %v: the store runs on Linux only (statfs, fdatasync), and this check needs it", err)
	}
	var out []string
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if path, ok := strings.CutSuffix(target, " (deleted)"); err == nil && ok && strings.HasPrefix(path, dir+"/") {
			out = append(out, path)
		}
	}
	return out
}

// committedInSmallSegments opens a store with range "a" led at epoch 1
// holding 12 committed batches of ~1.4 KiB, two to a segment file (the
// caller set 4 KiB segments first).
func committedInSmallSegments(t *testing.T) (*opener, *logstore.Store, *logstore.Range) {
	t.Helper()
	o := newOpener(t)
	s := o.open()
	a := mustRange(t, s, "a")
	lead(t, a, 1)
	appendBig(t, s, a, 12)
	if err := a.SetHWM(a.LogEnd()); err != nil {
		t.Fatal(err)
	}
	return o, s, a
}
