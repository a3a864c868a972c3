package logstore

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A full disk.
//
// A write that fails for want of space leaves its file in an unknown state,
// and a write the store has already handed offsets out for cannot be
// refused any more: followers may hold its records (ReadTail serves them
// from the moment their offsets are assigned), so the store fails whole
// (ErrFailed). Badger is worse: it writes its memtable WAL through a
// mapping of a sparse file, and a page touched there on a full filesystem
// raises SIGBUS, which kills the process. So the store does not wait for
// ENOSPC. It keeps a reserve (Options.DiskReserveBytes): while the
// filesystem's free space is below it, the store is "full" and refuses new
// records (Append, AppendProduced, AppendRecords: ErrDiskFull) before they
// are assigned offsets, so nothing about them is visible anywhere.
// Everything else runs out of the reserve: fences and state (SetState),
// HWMs, RecordEpoch, Truncate, AdvanceLogStart and ResetTo (which free
// space), a new leader's epoch-start record (one empty record, without
// which a fenced range cannot lead again), reads, and the indexing and
// checkpoints of what was already accepted.
//
// The monitor (diskLoop) re-reads the free space every diskCheckInterval,
// and at once when appends accepted since the last reading add up to an
// eighth of the reserve, or a write failed with ENOSPC. Full clears by
// itself once a reading shows the reserve plus an eighth of it free (the
// hysteresis keeps one file deleted or written from flapping the state),
// and, after an ENOSPC, at least diskENOSPCClearBytes.

// ErrDiskFull: the filesystem the store lives on is below its reserve
// (Options.DiskReserveBytes) or a write failed for want of space. New
// records are refused before they get offsets; nothing of them is written.
// The store clears it by itself once space is back. The message names the
// free space and the reserve, or the write that failed.
var ErrDiskFull = errors.New("logstore: disk full")

// diskCheckInterval is how often the monitor reads the free space. At the
// ~450 MB/s this box's disk writes, 500 ms is ~225 MB, under the default
// reserve (256 MiB); appends accepted meanwhile also trigger a reading
// (diskPendingKick). A variable so tests can react faster.
var diskCheckInterval = 500 * time.Millisecond

// diskENOSPCClearBytes is the free space a reading must show before a
// full state caused by a failed write (rather than by the reserve)
// clears, when the reserve is smaller: the write that failed (a WAL
// entry with its zeroing ahead, an index commit of up to indexMaxBytes)
// must fit again.
const diskENOSPCClearBytes = 8 << 20

// DiskStatus is the store's view of the filesystem it lives on.
type DiskStatus struct {
	// Full: new records are refused (ErrDiskFull).
	Full bool
	// Reason says why, when Full: the free space against the reserve, or
	// the write that failed.
	Reason string
	// FreeBytes is the filesystem's free space (available to this user)
	// at the last reading; ReserveBytes is Options.DiskReserveBytes.
	FreeBytes, ReserveBytes uint64
	// UsedBytes is what the store's own files take (DiskUsage().Total()).
	UsedBytes uint64
	// FullSince is when it became full (zero when not full).
	FullSince time.Time
	// RefusedAppends counts the appends refused with ErrDiskFull since
	// Open.
	RefusedAppends uint64
}

// diskState is the store's full-disk state. Its own mutex: the append
// path reads only full, an atomic.
type diskState struct {
	reserve uint64
	free    func() (uint64, error)

	// full is read on every append without a lock; set and cleared under mu.
	full atomic.Bool
	// pending counts value bytes accepted since the last reading: a burst
	// triggers a reading before the interval is up.
	pending atomic.Int64
	refused atomic.Uint64

	mu        sync.Mutex
	freeBytes uint64    // at the last reading
	readErr   string    // the last reading's error, logged once
	reason    string    // why full
	since     time.Time // when it became full
	// enospc: a write failed for want of space and no reading has shown
	// room since (see clearBytesLocked).
	enospc bool

	// used is DiskUsage().Total() as of usedAt: a status call per range
	// (tenurectl status asks each range) lists the directories at most
	// every diskUsedRefresh.
	used   uint64
	usedAt time.Time

	kick chan struct{} // asks the monitor for a reading now
	stop chan struct{}
	done chan struct{}
}

// statfsFree is the default Options.FreeBytes: the space statfs says the
// filesystem of dir has available to an unprivileged user.
func statfsFree(dir string) func() (uint64, error) {
	return func() (uint64, error) {
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			return 0, fmt.Errorf("statfs %s: %w", dir, err)
		}
		return st.Bavail * uint64(st.Bsize), nil
	}
}

// startDiskMonitor takes a first reading (so an Open on a full disk opens
// full) and starts the monitor.
func (s *Store) startDiskMonitor() {
	d := s.disk
	d.kick = make(chan struct{}, 1)
	d.stop = make(chan struct{})
	d.done = make(chan struct{})
	s.readDisk()
	go s.diskLoop()
}

// stopDiskMonitor ends the monitor and waits for it.
func (s *Store) stopDiskMonitor() {
	d := s.disk
	if d.stop == nil {
		return
	}
	close(d.stop)
	<-d.done
}

func (s *Store) diskLoop() {
	d := s.disk
	defer close(d.done)
	t := time.NewTicker(diskCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-t.C:
		case <-d.kick:
		}
		s.readDisk()
	}
}

// kickDisk asks the monitor for a reading now (it never blocks).
func (d *diskState) kickDisk() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// clearBytesLocked is the free space a reading must show for a full state
// to clear: the reserve and an eighth of it, and after an ENOSPC at least
// diskENOSPCClearBytes.
func (d *diskState) clearBytesLocked() uint64 {
	need := d.reserve + d.reserve/8
	if d.enospc {
		need = max(need, diskENOSPCClearBytes)
	}
	return need
}

// readDisk reads the free space and moves the full state: into it when
// below the reserve, out of it when at or above clearBytesLocked.
func (s *Store) readDisk() {
	d := s.disk
	d.pending.Store(0)
	free, err := d.free()
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		// Keep the state as it is: a failed reading says nothing about
		// the space. Logged once per distinct error.
		if msg := err.Error(); msg != d.readErr {
			d.readErr = msg
			s.log.Warn("cannot read the free disk space; the full-disk state stays as it is", "err", err)
		}
		return
	}
	d.readErr = ""
	d.freeBytes = free
	switch {
	case !d.full.Load() && d.reserve > 0 && free < d.reserve:
		s.enterFullLocked(fmt.Sprintf("%d bytes free, below the reserve of %d", free, d.reserve))
	case d.full.Load() && free >= d.clearBytesLocked():
		s.log.Info("disk has room again; accepting appends", "free_bytes", free, "reserve_bytes", d.reserve,
			"was_full_for", s.now().Sub(d.since).Round(time.Millisecond), "was", d.reason)
		d.full.Store(false)
		d.enospc = false
		d.reason, d.since = "", time.Time{}
	}
}

// enterFullLocked makes the store full for reason. d.mu is held.
func (s *Store) enterFullLocked(reason string) {
	d := s.disk
	d.reason = reason
	if d.full.Load() {
		return
	}
	d.full.Store(true)
	d.since = s.now()
	s.log.Warn("disk full: refusing appends until space is back (delete data, or let retention free it)",
		"reason", reason, "free_bytes", d.freeBytes, "reserve_bytes", d.reserve)
}

// noteNoSpace makes the store full if err is a write that failed for want
// of space, and asks for a reading at once. It reports whether it was.
func (s *Store) noteNoSpace(err error) bool {
	if !errors.Is(err, syscall.ENOSPC) {
		return false
	}
	d := s.disk
	d.mu.Lock()
	d.enospc = true
	s.enterFullLocked(fmt.Sprintf("a write failed: %v", err))
	d.mu.Unlock()
	d.kickDisk()
	return true
}

// diskRefusal is ErrDiskFull, with the reason, when the store is full, and
// nil otherwise; op names the refused call. An accepted append's bytes
// count toward an early reading.
func (s *Store) diskRefusal(op, id string, bytes int) error {
	d := s.disk
	if !d.full.Load() {
		if d.reserve > 0 && d.pending.Add(int64(bytes)) >= int64(d.reserve/8) {
			d.pending.Store(0)
			d.kickDisk()
		}
		return nil
	}
	// A store that failed (a write found no space after its records had
	// offsets) answers with its failure, not as a full disk: its caller
	// stops the ranges and reopens the store, where a full disk only
	// refuses. The replica's refusal then says the store reopens by itself.
	if err := s.writeErr(); err != nil {
		return err
	}
	d.refused.Add(1)
	d.mu.Lock()
	reason := d.reason
	d.mu.Unlock()
	return fmt.Errorf("%w: %s on %s refused: %s; appends resume by themselves once space is back", ErrDiskFull, op, id, reason)
}

// diskUsedRefresh bounds how stale DiskStatus's UsedBytes may be.
const diskUsedRefresh = time.Second

// DiskStatus reports the store's full-disk state and space.
func (s *Store) DiskStatus() DiskStatus {
	d := s.disk
	d.mu.Lock()
	defer d.mu.Unlock()
	if now := time.Now(); now.Sub(d.usedAt) >= diskUsedRefresh {
		// Under d.mu: concurrent callers list the directories once.
		d.used, d.usedAt = uint64(max(s.DiskUsage().Total(), 0)), now
	}
	return DiskStatus{
		Full:           d.full.Load(),
		Reason:         d.reason,
		FreeBytes:      d.freeBytes,
		ReserveBytes:   d.reserve,
		UsedBytes:      d.used,
		FullSince:      d.since,
		RefusedAppends: d.refused.Load(),
	}
}
