package logstore_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// smallFSBytes is the size of the small filesystem the test fills.
const smallFSBytes = 64 << 20

// smallFS returns a directory on a filesystem of smallFSBytes and a
// FreeBytes seam for it: as root, a tmpfs of that size mounted for the
// test (and nil: the store reads statfs itself); otherwise a temporary
// directory whose free space the seam computes as smallFSBytes minus the
// bytes allocated under it, which is how a filesystem of that size would
// count.
func smallFS(t *testing.T) (dir string, free func() (uint64, error)) {
	dir = t.TempDir()
	if os.Geteuid() == 0 {
		if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64m"); err == nil {
			t.Cleanup(func() {
				if err := syscall.Unmount(dir, 0); err != nil {
					t.Errorf("unmount %s: %v", dir, err)
				}
			})
			t.Logf("on a real %d MiB tmpfs at %s", smallFSBytes>>20, dir)
			return dir, nil
		} else {
			t.Logf("root, but mounting a tmpfs failed (%v): through the FreeBytes seam instead", err)
		}
	} else {
		t.Logf("not root: no tmpfs; a %d MiB filesystem through the FreeBytes seam", smallFSBytes>>20)
	}
	return dir, func() (uint64, error) {
		var used int64
		_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil
			}
			if fi, err := d.Info(); err == nil {
				used += fi.Sys().(*syscall.Stat_t).Blocks * 512
			}
			return nil
		})
		return uint64(max(smallFSBytes-used, 0)), nil
	}
}

// On a small real filesystem, appends run until the reserve refuses them,
// never into ENOSPC; every acknowledged record is readable and a fence is
// written while full; freeing space (a filler file removed, and retention)
// resumes appends without a restart, and a reopen holds everything
// acknowledged.
func TestDiskFullOnSmallFilesystem(t *testing.T) {
	const reserve = 12 << 20
	dir, free := smallFS(t)
	filler := filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, make([]byte, 16<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	restore := logstore.SetWALSizes(1<<20, 64<<10)
	defer restore()
	o := &opener{t: t, dir: filepath.Join(dir, "store"), opts: logstore.Options{
		Logger: testLogger(t), DiskReserveBytes: reserve, FreeBytes: free, SegmentBytes: 1 << 20}}
	s := o.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)

	// 64 KiB per append: the monitor is asked for a reading after every
	// reserve/8 of them, and the reserve holds dozens.
	val := make([]byte, 64<<10)
	var acked uint64
	refused := false
	for i := 0; i < 2000 && !refused; i++ {
		for j := range 8 {
			val[j] = byte(i >> (8 * j))
		}
		_, err := r.Append(1, false, [][]byte{val})
		switch {
		case err == nil:
			acked++
		case errors.Is(err, logstore.ErrDiskFull):
			refused = true
		default:
			t.Fatalf("Append %d = %v, want success or ErrDiskFull (never a failed store)", i, err)
		}
	}
	if !refused {
		t.Fatalf("appended %d records of 64 KiB on a %d MiB filesystem, none refused", acked, smallFSBytes>>20)
	}
	end := r.LogEnd()
	waitDurable(t, r, end)
	st := s.DiskStatus()
	t.Logf("refused after %d records: %+v", acked, st)
	if !st.Full || st.FreeBytes >= reserve {
		t.Fatalf("DiskStatus() = %+v, want full below the reserve", st)
	}
	if got := readAll(t, r); uint64(len(got)) != end || end != acked+1 {
		t.Fatalf("read %d records, log end %d, want %d (the epoch-start record and every acknowledged one)", len(got), end, acked+1)
	}
	if err := r.SetState(logstore.State{FencedEpoch: 2, Epoch: 1, Role: tenurev1.Role_ROLE_FOLLOWER}); err != nil {
		t.Fatalf("SetState (a fence) while full = %v", err)
	}
	if err := r.SetHWM(end); err != nil {
		t.Fatal(err)
	}

	// Free space: the filler goes, and retention removes half the log.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if _, err := r.AdvanceLogStart(end / 2); err != nil {
		t.Fatalf("AdvanceLogStart(%d) while full = %v", end/2, err)
	}
	if _, err := s.ReclaimNow(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the store to clear full once space is back", func() bool { return !s.DiskStatus().Full })
	if err := r.RecordEpoch(2, end); err != nil {
		t.Fatal(err)
	}
	if err := r.SetState(logstore.State{FencedEpoch: 2, Epoch: 2, Role: tenurev1.Role_ROLE_LEADER}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Append(2, true, [][]byte{{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Append(2, false, [][]byte{val}); err != nil {
		t.Fatalf("Append once space is back = %v", err)
	}
	end = r.LogEnd()
	waitDurable(t, r, end)
	closeStore(t, s)

	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	got := readAll(t, r)
	if r.LogEnd() != end || r.LogStart() != (end-2)/2 || uint64(len(got)) != end-r.LogStart() {
		t.Fatalf("after reopen [%d, %d) with %d records, want [%d, %d)", r.LogStart(), r.LogEnd(), len(got), (end-2)/2, end)
	}
	checkConsistent(t, r)
}
