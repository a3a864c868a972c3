package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// diskCounter counts the bytes written to the disk that holds the
// benchmarks' temp dirs: the sectors written of its block device, from
// /sys/dev/block, before the run and after a sync(2) that writes back what
// the run left dirty. The sync is after the run only: a sync just before
// it stalled the fsyncs of the system under test, and a JetStream stream
// lost its leader for half a second at the start of a CI run under -race.
// What the previous run left dirty its own sync wrote back. It is the
// machine's count, not the process's, which is why the benchmarks run
// alone. Where the disk's bandwidth is the limit (256 in flight here),
// records/s is about that bandwidth over this: the floor writes each
// record once per replica, 3 KiB per 1 KiB record. (write_bytes of
// /proc/PID/io is no measure on kernels whose page cache holds large
// folios: it counts a whole folio when a write dirties part of it.)
var diskCounter = counter{
	unit: "disk-bytes/record",
	read: diskWrittenBytes,
	readAfter: func() (uint64, error) {
		unix.Sync()
		return diskWrittenBytes()
	},
}

// tempDirDevice is the /sys/dev/block directory of the block device
// holding os.TempDir() (absent for a tmpfs).
func tempDirDevice() (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(os.TempDir(), &st); err != nil {
		return "", err
	}
	return fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev)), nil
}

// diskWrittenBytes returns the bytes written so far to the block device
// holding os.TempDir().
func diskWrittenBytes() (uint64, error) {
	dev, err := tempDirDevice()
	if err != nil {
		return 0, err
	}
	name := dev + "/stat"
	b, err := os.ReadFile(name)
	if err != nil {
		return 0, fmt.Errorf("the temp dir's disk: %w", err)
	}
	// Field 7 is sectors written, in units of 512 bytes whatever the
	// device's own sector size (Documentation/block/stat.rst).
	f := strings.Fields(string(b))
	if len(f) < 7 {
		return 0, fmt.Errorf("%s: %d fields", name, len(f))
	}
	sectors, err := strconv.ParseUint(f[6], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	return sectors * 512, nil
}

// The disk counter sees the bytes this test writes, unsynced, once its
// after-run read has synced them: at least as many (it counts the whole
// machine).
// Where the temp dir is on no block device (a tmpfs), it says so instead
// of counting, and the benchmarks report the metric unavailable.
func TestDiskWrittenBytes(t *testing.T) {
	before, err := diskWrittenBytes()
	dev, devErr := tempDirDevice()
	if devErr != nil {
		t.Fatal(devErr)
	}
	if _, noDevice := os.Stat(dev); noDevice != nil {
		if err == nil {
			t.Fatalf("the temp dir's device has no /sys/dev/block entry, yet the counter read %d", before)
		}
		t.Logf("counter unavailable, as it should be here: %v", err)
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	const n = 8 << 20
	f, err := os.Create(filepath.Join(t.TempDir(), "data"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	// Not synced here: the counter's own sync, after a run, is what
	// writes back what the run left dirty.
	after, err := diskCounter.readAfter()
	if err != nil {
		t.Fatal(err)
	}
	if after-before < n {
		t.Fatalf("the counter rose by %d bytes, want at least the %d written", after-before, n)
	}
}
