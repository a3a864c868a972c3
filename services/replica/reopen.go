package replica

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/services/replica/logstore"
)

// Reopening the store after a want of space.
//
// The store refuses new records below its reserve before they get offsets
// (logstore's disk.go), but a write that finds no space where it cannot be
// refused whole (a WAL entry whose records have offsets, a journal entry,
// a Badger commit, a synced state write) fails the whole store: what
// reached the disk is unknown until Open recovers from it. A restart would
// do that; the replica does it by itself, without exiting. The store
// watcher (storeWatchLoop) notices the failure, logs it once, and while
// the store is failed GetStatus and the metrics report the disk full and
// appends are answered ResourceExhausted. Once the store's own free-space
// monitor reads room again (the reserve and an eighth of it free, and at
// least 8 MiB after an ENOSPC: logstore's clearBytesLocked), it reopens:
//
//  1. Lookups answer Unavailable (errStoreReopening) and every hosted range
//     stops acting: leaderships and fetch loops end, waiting appends fail
//     (their outcome is unknown, as at a crash), leases are dropped. Each
//     old range is marked dropped, so a handler that looked it up before
//     gets Unavailable, or the store's ErrClosed (Unavailable too), and a
//     fence holding it looks the range up again.
//  2. The loops on the old store are waited for, and it is closed.
//  3. logstore.Open of the same directory replays the WAL: every record a
//     completed fdatasync covered, so every acknowledged one, is there.
//  4. The ranges are loaded as New loads them (loadRanges): a range that
//     led comes back FENCED and waits for the promoter, a follower
//     resumes fetching. Only the store and the hosted ranges are replaced;
//     the incarnation, the lease keeper, the metrics, the server and its
//     handlers stay.
//
// Only a failure whose cause is ENOSPC, with no fsync failed at any time
// (logstore's Failed), is reopened. Another failure (EIO, a corrupt byte)
// says the disk itself misbehaves, and an operator must look at it. A
// failed fsync is never recovered this way (fsyncgate): Linux may have
// marked the pages it could not write clean, and a reopen in this process
// would read them back from the page cache and call them durable although
// the disk does not hold them; only a restart of the machine's view of the
// disk (process and page cache) can tell.
//
// Bounded: an Open that fails is retried with a backoff (reopenBackoffMin
// to reopenBackoffMax); so is a reopen after a reopened store failed for
// want of space again within reopenStableAfter (a filesystem that reports
// free bytes but has no free inodes would otherwise loop).

const (
	// reopenBackoffMin and reopenBackoffMax bound the wait before another
	// Open after one failed, or before reopening a store that failed again
	// soon after its reopen.
	reopenBackoffMin = time.Second
	reopenBackoffMax = time.Minute
	// reopenStableAfter: a reopened store that ran this long before
	// failing again is a new incident, reopened without waiting.
	reopenStableAfter = time.Minute
)

// storeWatchInterval is how often the watcher asks the store whether it
// failed. A variable so tests can react faster.
var storeWatchInterval = 200 * time.Millisecond

// errStoreReopening: the replica is closing its failed store and opening
// it again; its ranges are back in a moment.
var errStoreReopening = coded(connect.CodeUnavailable, "replica's store is being reopened after a want of space; retry shortly")

// storeGen is one opening of the store and the loops on its ranges
// (leaders' committers, fetch loops): a reopen cancels ctx, waits for
// loops and only then closes store.
type storeGen struct {
	store *logstore.Store
	// ctx is the parent of every leadership and fetch loop on this
	// store's ranges; cancelled (errStoreReopening) when the store is
	// closed for a reopen, and with the replica's own.
	ctx    context.Context
	cancel context.CancelCauseFunc
	loops  sync.WaitGroup
	// opened is when the store was opened; reopened says it was by a
	// reopen, not by New.
	opened   time.Time
	reopened bool
}

func (s *Replica) newGen(store *logstore.Store) *storeGen {
	ctx, cancel := context.WithCancelCause(s.ctx)
	return &storeGen{store: store, ctx: ctx, cancel: cancel, opened: time.Now()}
}

// currentStore is the store as opened now (closed while a reopen waits to
// open it again: its calls then fail with logstore.ErrClosed).
func (s *Replica) currentStore() *logstore.Store {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen.store
}

// failedForSpace says whether err is a store failure caused by a want of
// space: logstore.ErrFailed whose cause is ENOSPC.
func failedForSpace(err error) bool {
	return errors.Is(err, logstore.ErrFailed) && errors.Is(err, syscall.ENOSPC)
}

// reopenable says whether a store's failure is one a reopen recovers from:
// a want of space, and no fsync ever failed (see the file comment).
func reopenable(err error, syncFailed bool) bool {
	return failedForSpace(err) && !syncFailed
}

// diskStatus is the store's full-disk state as the replica reports it: a
// store failed for want of space is full, whatever its free-space monitor
// reads since, until it is reopened.
func (s *Replica) diskStatus() logstore.DiskStatus {
	st := s.currentStore()
	d := st.DiskStatus()
	if err, syncFailed := st.Failed(); failedForSpace(err) {
		d.Full = true
		if reopenable(err, syncFailed) {
			d.Reason = fmt.Sprintf("the store failed for want of space (%v); it reopens by itself once space is back", err)
		} else {
			d.Reason = fmt.Sprintf("the store failed for want of space and an fsync failed (%v); restart the replica once space is back", err)
		}
	}
	return d
}

// storeWatchLoop watches the store for a failure and reopens it once it
// can (see the file comment). It runs until the replica closes.
func (s *Replica) storeWatchLoop() {
	t := time.NewTicker(storeWatchInterval)
	defer t.Stop()
	var (
		noted     *storeGen // the failed store already logged
		downAt    time.Time // when the store was first seen failed
		bo        = backoff{min: reopenBackoffMin, max: reopenBackoffMax}
		notBefore time.Time
	)
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		g, pending := s.gen, s.reopening
		s.mu.Unlock()
		now := time.Now()
		if pending {
			// An earlier Open failed: the old store is closed.
			if now.Before(notBefore) {
				continue
			}
			if err := s.openAgain(g, downAt); err != nil {
				d := bo.next()
				notBefore = now.Add(d)
				s.log.Warn("reopening the store failed; trying again", "err", err, "in", d.Round(time.Millisecond))
			}
			continue
		}
		err, syncFailed := g.store.Failed()
		if err == nil {
			continue
		}
		if noted != g {
			noted, downAt = g, now
			switch {
			case reopenable(err, syncFailed):
				s.log.Warn("store failed for want of space: ranges stopped, appends refused (ResourceExhausted); reopening it once space is back", "err", err)
				if g.reopened && now.Sub(g.opened) < reopenStableAfter {
					// Failed again soon after a reopen: wait before the
					// next one.
					notBefore = now.Add(bo.next())
				} else {
					bo.reset()
					notBefore = time.Time{}
				}
			case failedForSpace(err):
				s.log.Error("store failed for want of space and an fsync failed: not reopening it in this process (after a failed fsync the page cache may hold what the disk does not); restart the replica once space is back", "err", err)
			default:
				s.log.Error("store failed: not reopening it (only a want of space is recovered by itself); restart the replica after checking the disk", "err", err)
			}
		}
		if !reopenable(err, syncFailed) || now.Before(notBefore) {
			continue
		}
		// The store's monitor clears full once a reading shows the reserve
		// and its margin free (at least 8 MiB after an ENOSPC).
		if g.store.DiskStatus().Full {
			continue
		}
		if err := s.reopenStore(g, downAt); err != nil {
			d := bo.next()
			notBefore = now.Add(d)
			s.log.Warn("reopening the store failed; trying again", "err", err, "in", d.Round(time.Millisecond))
		}
	}
}

// reopenStore closes the failed store g and opens the directory again
// (steps 1 to 4 of the file comment). An error leaves the replica without
// a store (reopening stays set, lookups answer Unavailable) and the
// watcher retries openAgain.
func (s *Replica) reopenStore(g *storeGen, downAt time.Time) error {
	s.mu.Lock()
	if s.closed || s.gen != g {
		s.mu.Unlock()
		return nil
	}
	s.reopening = true
	old := s.ranges
	s.ranges = map[string]*hosted{}
	s.mu.Unlock()

	// Before any range lock, as Close does: an Adopt holding one now
	// started its loops already (waited for below) or will see the
	// cancelled context and start nothing.
	g.cancel(errStoreReopening)
	for _, h := range old {
		h.mu.Lock()
		h.stopActingLocked(errStoreReopening)
		// Whoever still holds h finds it gone: a fence looks the range up
		// again, anything else answers Unavailable.
		h.dropped = true
		h.halted = errStoreReopening
		h.mu.Unlock()
	}
	g.loops.Wait()
	if err := g.store.Close(); err != nil {
		// Expected: a failed store reports its failure.
		s.log.Debug("closed the failed store", "err", err)
	}
	return s.openAgain(g, downAt)
}

// openAgain opens the store's directory after g was closed and installs
// it with its ranges.
func (s *Replica) openAgain(g *storeGen, downAt time.Time) error {
	store, err := logstore.Open(s.cfg.DataDir, s.cfg.StoreOptions)
	if err != nil {
		return fmt.Errorf("replica: reopen store in %s: %w", s.cfg.DataDir, err)
	}
	ng := s.newGen(store)
	ng.reopened = true
	ranges := s.loadRanges(ng)
	// Installed even if Close began meanwhile: Close waits for this
	// goroutine, then closes the store installed last; the ranges' loops
	// end with the replica's context (a reopened range never leads).
	s.mu.Lock()
	s.gen, s.ranges, s.reopening = ng, ranges, false
	s.mu.Unlock()
	s.log.Info("store reopened after a want of space; ranges back as after a restart", "was_out_for", time.Since(downAt).Round(time.Millisecond), "ranges", len(ranges), "quarantined", len(store.Quarantined()))
	return nil
}
