package replica

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// hosted is one range this replica hosts: its store, its durable state as
// last persisted, and what it is doing about it (leading, following, or
// nothing).
type hosted struct {
	s  *Replica
	id string
	// gen is the store opening r belongs to; r is used only while it lasts
	// (a reopen replaces every hosted range: reopen.go).
	gen *storeGen
	r   *logstore.Range
	log *slog.Logger

	// mu orders role changes against the data path. Fence, Truncate, Adopt
	// and halt hold it exclusively for their whole effect, fsyncs included,
	// so no append, fetch answer, follower write or HWM raise interleaves
	// with a role change. The data path holds it shared across "check the
	// epoch and role, then act", so the check cannot go stale before the act.
	mu sync.RWMutex
	// st is the range's durable state as last persisted: it changes only
	// after SetState returned nil.
	// Invariant: st.Epoch <= st.FencedEpoch.
	st logstore.State
	// lead is the active leadership.
	// Invariant: lead != nil only if st.Role is LEADER and
	// lead.epoch == st.Epoch == st.FencedEpoch.
	lead *leader
	// follow is the running fetch loop.
	// Invariant: follow != nil only if st.Role is FOLLOWER and
	// follow.epoch == st.Epoch == st.FencedEpoch.
	follow *follower
	// halted is the failure that stopped the range (a safety violation or a
	// store failure). A halted range serves nothing but Fence and reads of
	// its state until the replica restarts: continuing would build on a log
	// that disagrees with a committed record, or on state that did not persist.
	// A quarantined range (its stored data failed its checks at startup:
	// halted wraps logstore.ErrQuarantined) refuses Fence too, and only
	// DropRange ends it (quarantine).
	halted error
	// cuts counts the truncations fetch loops made (status).
	cuts fetchTruncations
	// resets counts the resets to a leader's log start fetch loops made
	// (follower.go), for the log line.
	resets atomic.Uint64
	// dropped is set once the range's data was dropped (membership.go's
	// dropLocked): it is no longer in the replica's ranges, and a fence
	// that finds it looks the range up again.
	dropped bool
	// retention is the range's retention policy as last learned (Adopt as
	// leader, or the lease service: retention.go); nil until then, and
	// then nothing is removed. Only a leadership applies it.
	retention atomic.Pointer[tenurev1.RetentionPolicy]
	// retentionLeft is the indexed bytes the last retention pass left
	// (applyRetention), for checkRetentionSize.
	retentionLeft atomic.Uint64
	// retentionHeld is the log start the last pass wanted when the HWM
	// held it back (it would have removed batches not yet committed), 0
	// when nothing held it: once the HWM passes it, checkRetentionSize
	// counts from the limit again instead of from retentionLeft.
	retentionHeld atomic.Uint64
}

func (s *Replica) newHosted(g *storeGen, r *logstore.Range) *hosted {
	return &hosted{s: s, id: r.ID(), gen: g, r: r, st: r.State(), log: s.log.With("range", r.ID())}
}

// goLoop runs f, a loop on this range's store (a leader's committer, a
// fetch loop), as one Close and a reopen of the store wait for.
func (h *hosted) goLoop(f func()) {
	g := h.gen
	g.loops.Add(1)
	h.s.goLoop(func() {
		defer g.loops.Done()
		f()
	})
}

// resume restores what a range was doing before a restart. Only followers
// resume: a follower's loop needs nothing but its leader's address, while a
// leader's follower progress, lease and group commit died with the process.
func (h *hosted) resume() {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.st
	switch st.Role {
	case tenurev1.Role_ROLE_FOLLOWER:
		// The fence is durable with the role, so a follower resumes at
		// exactly its fenced epoch; anything else is a state no code path
		// writes, and following it could accept a lower epoch's records.
		if st.Epoch != st.FencedEpoch || st.LeaderAddress == "" {
			h.log.Error("not resuming follower: inconsistent state", "epoch", st.Epoch, "fenced_epoch", st.FencedEpoch, "leader_address", st.LeaderAddress)
			return
		}
		h.startFollowerLocked()
		h.log.Info("resumed following", "epoch", st.Epoch, "leader", st.LeaderID, "log_end", h.r.LogEnd(), "hwm", h.r.HWM())
	case tenurev1.Role_ROLE_LEADER:
		h.log.Warn("was leading before the restart: not serving until fenced at a higher epoch and adopted again", "epoch", st.Epoch, "log_end", h.r.LogEnd(), "hwm", h.r.HWM())
	}
}

// acting returns the leadership while it acts: installed and not ending.
// (Close cancels every leadership's context before it takes the range locks
// to clear them; in between, the leadership must already look ended, or its
// waiters would spin on a done context.) h.mu is held.
func (h *hosted) acting() *leader {
	if l := h.lead; l != nil && l.ctx.Err() == nil {
		return l
	}
	return nil
}

// role is the role the range reports: a persisted LEADER that is not
// actively leading (restarted, or its store failed) reports FENCED, because
// like a fenced replica it accepts nothing but a fence.
// h.mu is held.
func (h *hosted) role() tenurev1.Role {
	if h.st.Role == tenurev1.Role_ROLE_LEADER && h.lead == nil {
		return tenurev1.Role_ROLE_FENCED
	}
	return h.st.Role
}

// stopActingLocked ends leadership and following, for a fence, a halt or
// Close. A deposed leader's HWM is frozen first (finalHWM): appends still
// waiting may be acknowledged only up to it, because after this the range's
// HWM may be raised by a later leader whose records sit at those offsets.
// It does not wait for the loops to exit (they need h.mu to notice);
// Replica.Close waits for them. h.mu is held exclusively.
func (h *hosted) stopActingLocked(cause error) {
	if l := h.lead; l != nil {
		l.finalHWM = h.r.HWM()
		h.lead = nil
		h.r.SetSyncOnDemand(false)
		l.cancel(cause)
		if h.s.cfg.Lease != nil {
			h.s.cfg.Lease.Drop(h.id, l.epoch)
		}
	}
	if f := h.follow; f != nil {
		h.follow = nil
		f.cancel(cause)
	}
}

// halt stops the range after a safety violation or a store failure.
// Violating a safety invariant stops the range; it is never a warning.
func (h *hosted) halt(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.haltLocked(err)
}

func (h *hosted) haltLocked(err error) {
	if h.halted != nil {
		return
	}
	if errors.Is(err, logstore.ErrCorrupt) && !errors.Is(err, errSafety) {
		// A read found this copy's stored bytes damaged (a record below
		// the synced point that Open does not check: a follower's fetch or
		// a reader reached it). Halted alone, the copy still answered
		// fences with its whole log end and history, so a promotion could
		// pick it as the candidate again (the most complete log, or the
		// preferred replica on a tie), have its Adopt refused, and retry
		// forever with an intact copy beside it. Quarantined, it answers no
		// fence, as a copy quarantined at startup: the others are promoted
		// if they are a quorum, and 'tenurectl range rebuild' restores it.
		h.halted = fmt.Errorf("%w: %w", logstore.ErrQuarantined, err)
		h.stopActingLocked(err)
		h.log.Error("range HALTED: quarantined, a read found its stored data damaged; it answers no fence and serves nothing; rebuild it from its peers with 'tenurectl range rebuild "+h.id+" --replica "+h.s.cfg.ID+"'",
			"reason", err, "role", h.st.Role, "fenced_epoch", h.st.FencedEpoch, "log_end", h.r.LogEnd(), "hwm", h.r.HWM())
		return
	}
	h.halted = err
	h.stopActingLocked(err)
	h.log.Error("range stopped serving", "err", err, "role", h.st.Role, "fenced_epoch", h.st.FencedEpoch, "log_end", h.r.LogEnd(), "hwm", h.r.HWM())
}

// quarantine halts a range the store quarantined at Open (its stored data
// failed its checks: logstore's quarantine.go), at New, before the range
// is visible to any request. It never resumes: it leads, follows and
// answers fences for nothing until DropRange removes it and a fence after
// the range's rebuild (tenurectl range rebuild) hosts it afresh.
func (h *hosted) quarantine(reason error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.halted = fmt.Errorf("%w: %w", logstore.ErrQuarantined, reason)
	h.log.Error("range HALTED: quarantined, its stored data fails its checks; it answers no fence and serves nothing; rebuild it from its peers with 'tenurectl range rebuild "+h.id+" --replica "+h.s.cfg.ID+"'",
		"reason", reason, "role", h.st.Role, "fenced_epoch", h.st.FencedEpoch)
}

// quarantinedLocked reports whether the range is quarantined. h.mu is held.
func (h *hosted) quarantinedLocked() bool {
	return h.halted != nil && errors.Is(h.halted, logstore.ErrQuarantined)
}

// haltedErr is what a halted range answers. h.mu is held.
func (h *hosted) haltedErr() error {
	if failedForSpace(h.halted) {
		// Nothing new is taken until the store reopens, which it does by
		// itself once space is back: a client should retry (elsewhere,
		// once the range is led elsewhere), not report a bug.
		return diskFullf("replica %s: range %q: disk full: its store failed for want of space and reopens by itself once space is back (the range comes back as after a restart): %v", h.s.cfg.ID, h.id, h.halted)
	}
	return fmt.Errorf("range %q stopped serving: %w", h.id, h.halted)
}

// notLeaderErr names the leader this range knows of. h.mu is held.
func (h *hosted) notLeaderErr() error {
	if h.halted != nil {
		return h.haltedErr()
	}
	d := &tenurev1.NotLeaderDetail{RangeId: h.id, ReplicaId: h.s.cfg.ID, Epoch: h.st.FencedEpoch}
	if h.st.Role == tenurev1.Role_ROLE_FOLLOWER {
		d.LeaderId, d.LeaderUrl, d.Epoch = h.st.LeaderID, h.st.LeaderAddress, h.st.Epoch
		return notLeaderf(d, "range %q: replica %s is not the leader; leader is %s at %s (epoch %d)", h.id, h.s.cfg.ID, h.st.LeaderID, h.st.LeaderAddress, h.st.Epoch)
	}
	if h.st.Role == tenurev1.Role_ROLE_LEADER {
		d.Epoch = h.st.Epoch
		return notLeaderf(d, "range %q: replica %s led at epoch %d but is not serving (restarted or failed); leader unknown until a fence at a higher epoch", h.id, h.s.cfg.ID, h.st.Epoch)
	}
	return notLeaderf(d, "range %q: replica %s is not the leader (fenced at epoch %d); leader unknown", h.id, h.s.cfg.ID, h.st.FencedEpoch)
}

// leaseValid reports whether the leader's lease for epoch is live; always
// true without a lease service.
func (h *hosted) leaseValid(epoch uint64) bool {
	if h.s.cfg.Lease == nil {
		return true
	}
	return h.s.cfg.Lease.Valid(h.id, epoch)
}

// haltedErrShared is haltedErr for a caller that does not hold h.mu.
func (h *hosted) haltedErrShared() error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.haltedErr()
}
