package replica

import (
	"context"
	"fmt"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// This file holds the promoter's commands: Fence, Truncate, Adopt. Each runs
// with the range's lock held exclusively for its whole effect, so no append,
// fetch answer or follower write interleaves with it, and each persists its
// state change before it answers.

// respond turns a handler's result into a Connect response, mapping errors
// through toConnect.
func respond[T any](a *T, err error) (*connect.Response[T], error) {
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(a), nil
}

// Fence durably records fenced epoch E, stops the range acting under any
// lower epoch, and answers its log in the same response.
func (s *Replica) Fence(ctx context.Context, req *connect.Request[tenurev1.FenceRequest]) (*connect.Response[tenurev1.FenceResponse], error) {
	return respond(s.fence(ctx, req.Msg))
}

func (s *Replica) fence(ctx context.Context, m *tenurev1.FenceRequest) (*tenurev1.FenceResponse, error) {
	if err := wire.ValidateRangeID(m.GetRangeId()); err != nil {
		return nil, err
	}
	if m.GetEpoch() == 0 {
		return nil, invalidf("fence epoch must be positive (0 means no grant yet)")
	}
	if len(m.GetFencerId()) > wire.MaxRangeIDBytes {
		return nil, invalidf("fencer id is %d bytes, at most %d", len(m.GetFencerId()), wire.MaxRangeIDBytes)
	}
	// A fence is what brings a replica into a range: the range is created
	// (durably) on the first fence that names it, once the member's
	// incarnation and the range's generation are checked (membership.go).
	h, err := s.hostForFence(ctx, m)
	if err != nil {
		return nil, err
	}
	defer h.mu.Unlock()
	e, cur := m.GetEpoch(), h.st.FencedEpoch
	// Invariant 4: a replica fenced at E never accepts a command from an
	// epoch below E. The promotion at the lower epoch must be abandoned.
	if e < cur {
		s.metrics.fenceRefusals.Inc()
		return nil, preconditionf("range %q: fence at epoch %d refused: already fenced at epoch %d", h.id, e, cur)
	}
	// Far above the current fence, the epoch must be one the lease service
	// granted: one fence at 2^64-1 would otherwise brick the range.
	if err := s.checkFenceJump(ctx, h.id, cur, e); err != nil {
		return nil, err
	}
	if e == cur {
		// A repeat (a retrying promoter): the fence is already durable, and
		// nothing changes. previous_role is then the current role: the role
		// before the first fence at e is not kept.
		if err := h.r.WaitDurable(ctx, h.r.LogEnd()); err != nil {
			return nil, err
		}
		return h.fenceAnswerLocked(h.role(), false), nil
	}
	prev := h.st.Role
	// Read before stopActingLocked ends the leadership: a leader that
	// restarted persisted LEADER but has no leadership in memory, and its
	// HWM may lag what it acknowledged (FenceResponse.acting_leader).
	acting := h.acting() != nil
	// The answer says everything below the log end is durable: a deposed
	// leader's last batches may still be in its group commit. The wait
	// comes before the range stops acting, so that a fence whose wait
	// fails (the caller's deadline, on a slow disk) changes nothing: it
	// used to stop the fetch loop first and return, leaving a follower
	// that reported FOLLOWER with no loop, counted by nobody, until a
	// higher fence. Waiting first is as strict: h.mu is held exclusively,
	// so no append is assigned, no fetch answered, no fetched record
	// written and no HWM raised meanwhile (each takes h.mu shared), and
	// the log end waited for is the one answered. And a range that goes on
	// acting after a failed wait keeps invariant 4: the fence at e is
	// neither persisted nor answered, so the range is still fenced at cur,
	// and acting at exactly cur is what a fence at cur allows; the
	// promoter counts only replicas whose fence answer it received, so
	// none relied on this one having stopped.
	if err := h.r.WaitDurable(ctx, h.r.LogEnd()); err != nil {
		return nil, fmt.Errorf("range %q: wait for the log to be durable before fencing at %d: %w", h.id, e, err)
	}
	// Stop acting under the lower epoch before the fence is recorded: from
	// here no append is acknowledged beyond what already committed, no
	// fetch is answered, no fetched record is written.
	h.stopActingLocked(preconditionf("range %q: fenced at epoch %d; leader unknown", h.id, e))
	next := h.st
	next.FencedEpoch = e
	next.Role = tenurev1.Role_ROLE_FENCED
	// Whoever led below e is not the leader at e; the promoter names the
	// new one with Adopt.
	next.LeaderID, next.LeaderAddress = "", ""
	if err := h.r.SetState(next); err != nil {
		return nil, h.storeFailedLocked(fmt.Errorf("persist fence at epoch %d: %w", e, err))
	}
	// The fence is durable: only now is it answered.
	h.st = next
	h.log.Info("fenced", "epoch", e, "fencer", m.GetFencerId(), "previous_role", prev, "log_end", h.r.LogEnd(), "hwm", h.r.HWM())
	return h.fenceAnswerLocked(prev, acting), nil
}

// fenceAnswerLocked reports the range as of its durable fence.
//
// A halted range (a safety violation or a store failure: haltLocked) is
// fenced like any other and answers its log as it stands, and says it is
// halted. Its facts are not hidden: it may hold the only copy of committed
// records (the leader that drove it to a violation may be the wrong one),
// and its HWM and history let the promotion detect a candidate that lacks
// them or disagrees with them (DataLoss). But it refuses Truncate and Adopt
// until the replica restarts, so the promotion must not make it the
// candidate, count it toward the quorum or plan a truncation of it: chosen
// again at every epoch, its refused Adopt (or Truncate) left the range
// leaderless with an intact quorum beside it. A quarantined range never
// gets here (quarantineRefusalLocked): its log is not known at all.
func (h *hosted) fenceAnswerLocked(prev tenurev1.Role, acting bool) *tenurev1.FenceResponse {
	var halted string
	if h.halted != nil {
		halted = forClient(h.halted).Error()
	}
	return &tenurev1.FenceResponse{
		ReplicaId:     h.s.cfg.ID,
		FencedEpoch:   h.st.FencedEpoch,
		LogStart:      h.r.LogStart(),
		LogEnd:        h.r.LogEnd(),
		HighWaterMark: h.r.HWM(),
		History:       journal.ToWire(h.r.History()),
		PreviousRole:  prev,
		Incarnation:   h.s.incarnation,
		ActingLeader:  acting,
		Halted:        halted,
	}
}

// storeFailedLocked stops the range after its store failed to persist a
// command's effect: the durable state is unknown, so acting on the
// in-memory one could contradict it after a restart. h.mu is held.
func (h *hosted) storeFailedLocked(err error) error {
	err = fmt.Errorf("range %q: store failed: %w", h.id, err)
	h.haltLocked(err)
	return err
}

// Truncate cuts a fenced replica's log back to the target offset.
func (s *Replica) Truncate(ctx context.Context, req *connect.Request[tenurev1.TruncateRequest]) (*connect.Response[tenurev1.TruncateResponse], error) {
	return respond(s.truncate(req.Msg))
}

func (s *Replica) truncate(m *tenurev1.TruncateRequest) (*tenurev1.TruncateResponse, error) {
	if err := wire.ValidateRangeID(m.GetRangeId()); err != nil {
		return nil, err
	}
	if m.GetEpoch() == 0 {
		return nil, invalidf("truncate epoch must be positive")
	}
	h, err := s.lookup(m.GetRangeId())
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.halted != nil {
		return nil, h.haltedErr()
	}
	// Exactly the fenced epoch: a lower one is a deposed promoter's late
	// command; a higher one was never fenced here, so its plan did not see
	// this replica's answer.
	if e := m.GetEpoch(); e != h.st.FencedEpoch {
		return nil, preconditionf("range %q: truncate at epoch %d refused: fenced at epoch %d", h.id, e, h.st.FencedEpoch)
	}
	// Only while fenced, between the fence and the adoption, which is when a
	// promotion reconciles. Never as leader: a leader's log is the reference
	// others truncate to (and a range that led at this epoch and restarted
	// must be fenced higher first). Never as follower: its leader counts the
	// fetch offsets it reported toward the commit, and a cut from outside
	// the fetch loop would turn a counted offset into bytes it lacks; its
	// own fetch check truncates whatever diverged.
	if h.st.Role != tenurev1.Role_ROLE_FENCED {
		return nil, preconditionf("range %q: truncate refused: replica %s is %s at epoch %d; only a fenced replica is truncated", h.id, s.cfg.ID, h.st.Role, h.st.Epoch)
	}
	target, hwm, logEnd := m.GetTargetOffset(), h.r.HWM(), h.r.LogEnd()
	// Invariant 3: never below the HWM. Everything below it is committed;
	// a plan that cuts it comes from a replica that disagrees with us about
	// a committed record.
	if target < hwm {
		return nil, preconditionf("range %q: truncate to %d refused: below the high-water mark %d (committed records)", h.id, target, hwm)
	}
	var removed uint64
	// Beyond the log end there is nothing to cut. At exactly the log end
	// the store still drops journal entries of epochs that start there
	// (wrote nothing), as the protocol says.
	if target <= logEnd {
		removed, err = h.r.Truncate(target)
		if err != nil {
			return nil, h.storeFailedLocked(fmt.Errorf("truncate to %d: %w", target, err))
		}
		h.log.Info("truncated", "epoch", m.GetEpoch(), "from", logEnd, "to", target, "removed", removed, "hwm", hwm)
	}
	return &tenurev1.TruncateResponse{LogEnd: h.r.LogEnd(), RecordsRemoved: removed, History: journal.ToWire(h.r.History())}, nil
}

// Adopt tells a fenced replica its role at exactly its fenced epoch.
func (s *Replica) Adopt(ctx context.Context, req *connect.Request[tenurev1.AdoptRequest]) (*connect.Response[tenurev1.AdoptResponse], error) {
	return respond(s.adopt(req.Msg))
}

func (s *Replica) adopt(m *tenurev1.AdoptRequest) (*tenurev1.AdoptResponse, error) {
	if err := s.validateAdopt(m); err != nil {
		return nil, err
	}
	h, err := s.lookup(m.GetRangeId())
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	// Closing, or this range's store is being reopened (errStoreReopening):
	// no loop may start on it any more.
	if h.gen.ctx.Err() != nil {
		return nil, context.Cause(h.gen.ctx)
	}
	if h.halted != nil {
		return nil, h.haltedErr()
	}
	e := m.GetEpoch()
	// Exactly the fenced epoch, for the same reasons as Truncate.
	if e != h.st.FencedEpoch {
		return nil, preconditionf("range %q: adopt at epoch %d refused: fenced at epoch %d", h.id, e, h.st.FencedEpoch)
	}
	want := s.adoptedState(m)
	// The generation is the range's, not the adoption's: it stays.
	want.Generation = h.st.Generation
	if h.st.Role != tenurev1.Role_ROLE_FENCED {
		// Already adopted at e. The same adoption again is a retry; while
		// the range still acts on it, answer as the first time did.
		acting := h.acting() != nil || h.follow != nil
		if acting && sameAdoption(h.st, want) {
			return h.adoptAnswerLocked(), nil
		}
		return nil, preconditionf("range %q: adopt at epoch %d refused: already adopted at epoch %d as %s (leader %s); a new role needs a new fence",
			h.id, e, h.st.Epoch, h.st.Role, h.st.LeaderID)
	}
	if m.GetRole() == tenurev1.Role_ROLE_LEADER {
		// Before the leadership starts, so its first retention pass applies
		// the range's policy (none carried: keep the one known).
		if p := m.GetRetention(); p != nil {
			h.setRetention(p)
		}
		err = h.adoptLeaderLocked(want, m.GetCommittedBound())
	} else {
		err = h.adoptFollowerLocked(want)
	}
	if err != nil {
		return nil, err
	}
	s.metrics.leaderChanges.Inc()
	return h.adoptAnswerLocked(), nil
}

// validateAdopt checks an Adopt request's shape.
func (s *Replica) validateAdopt(m *tenurev1.AdoptRequest) error {
	if err := wire.ValidateRangeID(m.GetRangeId()); err != nil {
		return err
	}
	if m.GetEpoch() == 0 {
		return invalidf("adopt epoch must be positive")
	}
	role := m.GetRole()
	if role != tenurev1.Role_ROLE_LEADER && role != tenurev1.Role_ROLE_FOLLOWER {
		return invalidf("adopt role must be ROLE_LEADER or ROLE_FOLLOWER, not %s", role)
	}
	if err := wire.ValidateReplicas(m.GetReplicas()); err != nil {
		return err
	}
	if err := wire.ValidateID("leader id", m.GetLeaderId()); err != nil {
		return err
	}
	self, leaderListed := false, false
	for _, r := range m.GetReplicas() {
		self = self || r.GetId() == s.cfg.ID
		leaderListed = leaderListed || r.GetId() == m.GetLeaderId()
	}
	if !self {
		return invalidf("replica set does not include this replica %s", s.cfg.ID)
	}
	if !leaderListed {
		return invalidf("leader %s is not in the replica set", m.GetLeaderId())
	}
	if err := s.validateMembers(m); err != nil {
		return err
	}
	if err := validateAdoptRetention(m); err != nil {
		return err
	}
	if role == tenurev1.Role_ROLE_LEADER && m.GetLeaderId() != s.cfg.ID {
		return invalidf("adopt as leader names leader %s, but this replica is %s", m.GetLeaderId(), s.cfg.ID)
	}
	if role == tenurev1.Role_ROLE_FOLLOWER {
		if m.GetLeaderId() == s.cfg.ID {
			return invalidf("adopt as follower names this replica %s as its own leader", s.cfg.ID)
		}
		if m.GetLeaderAddress() == "" {
			return invalidf("adopt as follower needs the leader's address")
		}
	}
	return nil
}

// adoptedState is the durable state an Adopt request asks for.
func (s *Replica) adoptedState(m *tenurev1.AdoptRequest) logstore.State {
	addr := m.GetLeaderAddress()
	if m.GetRole() == tenurev1.Role_ROLE_LEADER && addr == "" {
		addr = s.cfg.Address
	}
	return logstore.State{
		FencedEpoch:   m.GetEpoch(),
		Epoch:         m.GetEpoch(),
		Role:          m.GetRole(),
		LeaderID:      m.GetLeaderId(),
		LeaderAddress: addr,
		Replicas:      m.GetReplicas(),
	}
}

// sameAdoption reports whether two adopted states say the same thing.
func sameAdoption(a, b logstore.State) bool {
	if a.FencedEpoch != b.FencedEpoch || a.Epoch != b.Epoch || a.Role != b.Role ||
		a.LeaderID != b.LeaderID || a.LeaderAddress != b.LeaderAddress || len(a.Replicas) != len(b.Replicas) {
		return false
	}
	member := make(map[string]*tenurev1.Replica, len(a.Replicas))
	for _, r := range a.Replicas {
		member[r.GetId()] = r
	}
	for _, r := range b.Replicas {
		got, ok := member[r.GetId()]
		if !ok || got.GetAddress() != r.GetAddress() || got.GetIncarnation() != r.GetIncarnation() || got.GetLearner() != r.GetLearner() {
			return false
		}
	}
	return true
}

// adoptLeaderLocked makes the range the leader at want.Epoch. The order is
// the protocol: journal the epoch (fsynced), write the epoch-start record,
// raise the HWM to the committed bound, persist the role, hold the lease,
// and only then install the leadership that appends and fetches can see.
// h.mu is held exclusively throughout, so none of them observes the epoch
// half-adopted.
func (h *hosted) adoptLeaderLocked(want logstore.State, committedBound uint64) error {
	e := want.Epoch
	// Where this epoch starts: the log end, or where a previous attempt of
	// this same adoption already journaled it.
	start, resumed := h.r.LogEnd(), false
	if hist := h.r.History(); len(hist) > 0 && hist[len(hist)-1].Epoch == e {
		start, resumed = hist[len(hist)-1].Start, true
	}
	// The prefix up to the committed bound is exactly what was committed:
	// a candidate whose log (before its own epoch) ends below it lacks
	// committed records, and leading from it would lose them.
	if committedBound > start {
		return preconditionf("range %q: adopt as leader at epoch %d refused: committed bound %d is beyond this replica's log end %d (it lacks committed records)", h.id, e, committedBound, start)
	}
	je, err := h.journalEpoch(e, start, resumed)
	if err != nil {
		return h.storeFailedLocked(err)
	}
	if err := h.writeEpochStart(je, resumed); err != nil {
		return h.storeFailedLocked(err)
	}
	// Readers never see the HWM step back across the promotion.
	if committedBound > h.r.HWM() {
		if err := h.r.SetHWM(committedBound); err != nil {
			return h.storeFailedLocked(fmt.Errorf("raise HWM to the committed bound %d: %w", committedBound, err))
		}
	}
	if err := h.r.SetState(want); err != nil {
		return h.storeFailedLocked(fmt.Errorf("persist leadership at epoch %d: %w", e, err))
	}
	h.st = want
	if h.s.cfg.Lease != nil {
		h.s.cfg.Lease.Hold(h.id, e)
	}
	l := h.newLeader(je, want.Replicas)
	h.lead = l
	// When the quorum needs a follower's copy, this replica's own counts
	// only beside one, so its syncs wait for a fetch to take the records
	// (sync on demand, logstore/commit.go). A leader alone syncs at once.
	h.r.SetSyncOnDemand(wire.Quorum(voterCount(want.Replicas)) > 1)
	h.goLoop(l.commitLoop)
	h.log.Info("adopted as leader", "epoch", e, "epoch_start", je.start, "committed_bound", committedBound, "hwm", h.r.HWM(), "replicas", len(want.Replicas))
	return nil
}

// journalEpoch records (epoch, start) in the journal, fsynced, and returns
// the proof that it is durable. A resumed adoption (the journal already ends
// with this very entry, from an attempt that failed after it) records
// nothing: the entry is durable already.
func (h *hosted) journalEpoch(epoch, start uint64, resumed bool) (journaledEpoch, error) {
	if resumed {
		return journaledEpoch{epoch: epoch, start: start}, nil
	}
	if err := h.r.RecordEpoch(epoch, start); err != nil {
		return journaledEpoch{}, fmt.Errorf("journal epoch %d at %d: %w", epoch, start, err)
	}
	return journaledEpoch{epoch: epoch, start: start}, nil
}

// writeEpochStart writes the epoch's epoch-start record at je.start: one
// record with no client data that the commit rule waits for (Raft section
// 5.4.2). A retried adoption finds it already written.
func (h *hosted) writeEpochStart(je journaledEpoch, resumed bool) error {
	if end := h.r.LogEnd(); resumed && end > je.start {
		got, err := h.r.EpochAt(je.start)
		if err != nil {
			return fmt.Errorf("read the epoch-start record at %d: %w", je.start, err)
		}
		if got != je.epoch {
			return fmt.Errorf("record at %d has epoch %d, want epoch %d's epoch-start record", je.start, got, je.epoch)
		}
		return nil
	}
	base, err := h.r.Append(je.epoch, true, [][]byte{{}})
	if err != nil {
		return fmt.Errorf("append the epoch-start record of epoch %d: %w", je.epoch, err)
	}
	if base != je.start {
		return fmt.Errorf("epoch-start record of epoch %d landed at %d, journaled at %d", je.epoch, base, je.start)
	}
	return nil
}

// adoptFollowerLocked makes the range a follower of want.LeaderID at
// want.Epoch and starts its fetch loop. h.mu is held exclusively.
func (h *hosted) adoptFollowerLocked(want logstore.State) error {
	// Drop journal entries of epochs that wrote nothing here (a leader that
	// journaled its epoch and failed before its epoch-start record): the
	// follower's history must mirror the leader's, and a phantom epoch would
	// read as a divergence point to the next promotion.
	if hist := h.r.History(); len(hist) > 0 && hist[len(hist)-1].Start >= h.r.LogEnd() {
		if _, err := h.r.Truncate(h.r.LogEnd()); err != nil {
			return h.storeFailedLocked(fmt.Errorf("drop empty epochs at the log end %d: %w", h.r.LogEnd(), err))
		}
	}
	if err := h.r.SetState(want); err != nil {
		return h.storeFailedLocked(fmt.Errorf("persist following %s at epoch %d: %w", want.LeaderID, want.Epoch, err))
	}
	h.st = want
	h.startFollowerLocked()
	h.log.Info("adopted as follower", "epoch", want.Epoch, "leader", want.LeaderID, "leader_address", want.LeaderAddress, "log_end", h.r.LogEnd(), "hwm", h.r.HWM())
	return nil
}

// adoptAnswerLocked reports the range after adopting.
func (h *hosted) adoptAnswerLocked() *tenurev1.AdoptResponse {
	return &tenurev1.AdoptResponse{LogEnd: h.r.LogEnd(), HighWaterMark: h.r.HWM(), History: journal.ToWire(h.r.History())}
}
