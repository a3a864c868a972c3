package logstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/pkg/journal/journaltest"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// A WAL entry write that fails with ENOSPC (its records had offsets
// already, so it cannot be refused whole) fails the store; Failed names
// the want of space and no failed fsync, status says full, and a reopen of
// the same directory holds every record made durable before, and takes
// appends again.
func TestWALWriteENOSPCFailsStoreReopenHolds(t *testing.T) {
	var noSpace atomic.Bool
	var free fakeFree
	free.n.Store(1 << 20) // under the 8 MiB an ENOSPC needs to clear
	o := newOpener(t)
	o.opts.FreeBytes = free.free
	o.opts.WALWriteFault = func() error {
		if noSpace.Load() {
			return fmt.Errorf("staged: %w", syscall.ENOSPC)
		}
		return nil
	}
	s := o.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	appendN(t, r, 1, 10)
	waitDurable(t, r, r.LogEnd())
	if err, syncFailed := s.Failed(); err != nil || syncFailed {
		t.Fatalf("Failed() of a healthy store = %v, %v; want nil, false", err, syncFailed)
	}

	noSpace.Store(true)
	base, err := r.Append(1, false, [][]byte{[]byte("lost")})
	if err == nil {
		// The offset was handed out before the write: it fails at the WAL.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = r.WaitDurable(ctx, base+1)
		cancel()
	}
	if !errors.Is(err, logstore.ErrFailed) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Append with the WAL write failing = %v, want ErrFailed wrapping ENOSPC", err)
	}
	err, syncFailed := s.Failed()
	if !errors.Is(err, logstore.ErrFailed) || !errors.Is(err, syscall.ENOSPC) || syncFailed {
		t.Fatalf("Failed() = %v, %v; want ErrFailed wrapping ENOSPC, no failed fsync", err, syncFailed)
	}
	if st := s.DiskStatus(); !st.Full {
		t.Fatalf("DiskStatus() after the ENOSPC = %+v, want full", st)
	}
	// An append after the failure is refused with the failure, not as a
	// full disk: the replica answers the two differently (stop the ranges
	// and reopen the store; refuse and keep leading). Before, the full
	// disk was checked first, and a replica whose ranges had not yet been
	// stopped answered "disk full" for a store that had failed.
	if _, err := r.Append(1, false, [][]byte{[]byte("after")}); !errors.Is(err, logstore.ErrFailed) || errors.Is(err, logstore.ErrDiskFull) {
		t.Fatalf("Append on the failed store = %v, want its failure (ErrFailed), not ErrDiskFull", err)
	}
	_ = s.Close() // reports the failure

	noSpace.Store(false)
	free.n.Store(1 << 30)
	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	if got := len(readAll(t, r)); got != 11 {
		t.Fatalf("reopened: read %d records, want the 11 made durable before the failure", got)
	}
	appendN(t, r, 1, 1)
	waitDurable(t, r, r.LogEnd())
	if err, _ := s.Failed(); err != nil {
		t.Fatalf("Failed() after the reopen = %v", err)
	}
}

// A failed fsync is remembered (syncFailed), whatever its errno: after it
// the page cache may hold bytes the disk does not, and a reopen in the same
// process would count them durable.
func TestFailedRemembersFailedFsync(t *testing.T) {
	o := newOpener(t)
	ffs := journaltest.NewFaultFS(journal.OSFS{})
	o.opts.JournalFS = ffs
	s := o.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	ffs.SetInjector(journaltest.FailOp(journaltest.OpSync, syscall.ENOSPC))
	if err := r.RecordEpoch(2, r.LogEnd()); !errors.Is(err, logstore.ErrFailed) {
		t.Fatalf("RecordEpoch with a failing fsync = %v, want ErrFailed", err)
	}
	err, syncFailed := s.Failed()
	if !errors.Is(err, syscall.ENOSPC) || !syncFailed || !errors.Is(err, logstore.ErrSyncFailed) {
		t.Fatalf("Failed() = %v, %v; want the ENOSPC of a failed fsync, syncFailed", err, syncFailed)
	}
	_ = s.Close()
}
