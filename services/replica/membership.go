package replica

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// This file holds who a range's members are, as far as a replica can tell:
// the incarnation check a fence makes before it hosts a range, the range
// generation it is hosted at, the ranges this replica's disk lost, and the
// leader's view of which fetches count.

// maxLostRanges bounds the lost ranges remembered for status: fences name
// them, and a confused promoter must not grow this without bound. Past it
// a fence is still refused and logged, just not listed.
const maxLostRanges = 4096

// maxHostAttempts bounds how often a fence looks the range up again after
// finding it dropped under it (a concurrent DropRange, or a generation bump
// by another fence).
const maxHostAttempts = 3

// hostForFence finds or creates the range a fence names and returns it
// with h.mu held exclusively, after the two identity checks a fence makes
// before it may touch the range:
//
//   - The member's incarnation (FenceRequest.incarnation, as the membership
//     records it) must be this replica's, or empty (a member whose
//     incarnation is not recorded yet, or a promoter from before
//     incarnations). Another one means this disk is not the member's: it
//     was replaced or wiped, and the range's log is not here. Hosting it
//     would answer an empty log, which counts as complete (a history known
//     to be empty), and a promotion could count this replica toward its
//     quorum and lose acknowledged records. Refused before the range is
//     hosted, so nothing is created or changed.
//   - The range's generation (0 = unknown, not checked). Below the one the
//     range is hosted at is refused: the fence is for a deleted range of
//     this id, from a promoter that has not learnt of its deletion. Above
//     it, the data here belongs to a deleted range of the same id, and is
//     dropped before the range is hosted afresh; a range hosted at
//     generation 0 (before generations) adopts the fence's.
func (s *Replica) hostForFence(ctx context.Context, m *tenurev1.FenceRequest) (*hosted, error) {
	id := m.GetRangeId()
	if inc := m.GetIncarnation(); inc != "" {
		if !validIncarnation(inc) {
			return nil, invalidf("fence incarnation %q is not %d lowercase hex digits", inc, 2*incarnationBytes)
		}
		if inc != s.incarnation {
			s.noteLost(id, inc)
			return nil, preconditionf("range %q: fence refused: the membership records replica %s as incarnation %s, but this replica is incarnation %s: its disk was replaced or wiped and lost the range; rebuild it from its peers: tenurectl range rebuild %s --replica %s",
				id, s.cfg.ID, inc, s.incarnation, id, s.cfg.ID)
		}
	}
	s.mu.Lock()
	_, hosted := s.ranges[id]
	s.mu.Unlock()
	if !hosted {
		// A fence creates the range: only one the lease service lists this
		// replica in (control.go).
		if err := s.checkHostable(ctx, id); err != nil {
			return nil, err
		}
	}
	gen := m.GetRangeGeneration()
	for range maxHostAttempts {
		h, err := s.host(id)
		if err != nil {
			return nil, err
		}
		h.mu.Lock()
		if h.dropped {
			h.mu.Unlock()
			continue
		}
		if err := h.quarantineRefusalLocked(gen); err != nil {
			h.mu.Unlock()
			return nil, err
		}
		again, err := h.checkGenerationLocked(gen)
		if err != nil {
			h.mu.Unlock()
			return nil, err
		}
		if again {
			h.mu.Unlock()
			continue
		}
		s.forgetLost(id)
		return h, nil
	}
	return nil, coded(connect.CodeUnavailable, "range %q: dropped while a fence was hosting it, %d times; retry", id, maxHostAttempts)
}

// quarantineRefusalLocked refuses a fence of a quarantined range: its
// stored data failed its checks, so its log end and history are not known,
// and an answer with them (or with the empty log it reports) could count
// as a known history toward a promotion's quorum and lose acknowledged
// records. The promoter reads FailedPrecondition as "not fenced" and goes
// on with the other replicas. One exception: a fence for a newer
// generation than the one the range's (still readable) state records
// names a range created again under the id, and dropping the old
// generation's data is what checkGenerationLocked does anyway, damaged or
// not. h.mu is held exclusively.
func (h *hosted) quarantineRefusalLocked(gen uint64) error {
	if !h.quarantinedLocked() {
		return nil
	}
	if stored := h.st.Generation; stored > 0 && gen > stored {
		return nil
	}
	return preconditionf("range %q: fence refused: replica %s's copy of the range is quarantined, its history is not known (%v); rebuild it from its peers: tenurectl range rebuild %s --replica %s",
		h.id, h.s.cfg.ID, h.halted, h.id, h.s.cfg.ID)
}

// checkGenerationLocked applies a fence's range generation gen to h (see
// hostForFence). again says h was dropped (its data belonged to an older
// generation) and the fence must host the range afresh. h.mu is held
// exclusively.
func (h *hosted) checkGenerationLocked(gen uint64) (again bool, err error) {
	stored := h.st.Generation
	switch {
	case gen == 0 || gen == stored:
		return false, nil
	case gen < stored:
		// Generations only grow (the lease service's revision at
		// creation): a lower one names a range of this id that was deleted.
		return false, preconditionf("range %q: fence for generation %d refused: hosted at generation %d (the fence is for a deleted range of this id)", h.id, gen, stored)
	case stored == 0:
		// First time this replica learns the generation of the range it
		// hosts (created before generations, or by a fence without one).
		next := h.st
		next.Generation = gen
		if err := h.r.SetState(next); err != nil {
			return false, h.storeFailedLocked(fmt.Errorf("persist generation %d: %w", gen, err))
		}
		h.st = next
		h.log.Info("range generation recorded", "generation", gen)
		return false, nil
	}
	// gen > stored > 0: the range of this id this replica holds was
	// deleted and created again; its records, fence and history are not
	// the new range's, and answering them would make them count.
	h.log.Warn("fence for a newer generation of the range: dropping the old generation's data first", "stored_generation", stored, "generation", gen, "log_end", h.r.LogEnd(), "fenced_epoch", h.st.FencedEpoch)
	if err := h.dropLocked(); err != nil {
		return false, err
	}
	return true, nil
}

// dropLocked stops the range acting, deletes its log, journal and state
// from the store (crash-atomically: logstore.DropRange) and forgets it.
// Whoever still holds h finds it dropped (h.dropped) and halted with
// NotFound. h.mu is held exclusively.
func (h *hosted) dropLocked() error {
	gone := notFoundf("range %q was dropped from replica %s", h.id, h.s.cfg.ID)
	h.stopActingLocked(gone)
	if _, err := h.gen.store.DropRange(h.id); err != nil {
		return h.storeFailedLocked(fmt.Errorf("drop: %w", err))
	}
	h.dropped = true
	h.halted = gone
	h.s.mu.Lock()
	if h.s.ranges[h.id] == h {
		delete(h.s.ranges, h.id)
	}
	h.s.mu.Unlock()
	h.log.Info("range dropped", "fenced_epoch", h.st.FencedEpoch, "generation", h.st.Generation)
	return nil
}

// noteLost remembers that a fence named this replica, for range id, as a
// member of another incarnation, and logs it at Error the first time.
func (s *Replica) noteLost(id, memberIncarnation string) {
	s.mu.Lock()
	l, known := s.lost[id]
	first := !known || l.GetMemberIncarnation() != memberIncarnation
	if first && (known || len(s.lost) < maxLostRanges) {
		s.lost[id] = &tenurev1.LostRange{RangeId: id, MemberIncarnation: memberIncarnation, SinceUnixMs: time.Now().UnixMilli()}
	}
	s.mu.Unlock()
	if first {
		s.log.Error("a fence names this replica a member of the range under another incarnation: this disk lost the range (replaced or wiped); not hosting it until it is rebuilt from its peers (tenurectl range rebuild RANGE --replica ID: removed, then added again)",
			"range", id, "member_incarnation", memberIncarnation, "incarnation", s.incarnation)
	}
}

// forgetLost forgets a lost range: a fence for this incarnation (or none)
// hosts it, or a drop removed this replica from it.
func (s *Replica) forgetLost(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.lost, id)
}

// lostRanges lists the lost ranges (only rangeID's, if set), sorted by id.
func (s *Replica) lostRanges(rangeID string) []*tenurev1.LostRange {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*tenurev1.LostRange
	for id, l := range s.lost {
		if rangeID == "" || id == rangeID {
			out = append(out, &tenurev1.LostRange{RangeId: l.GetRangeId(), MemberIncarnation: l.GetMemberIncarnation(), SinceUnixMs: l.GetSinceUnixMs()})
		}
	}
	slices.SortFunc(out, func(a, b *tenurev1.LostRange) int { return strings.Compare(a.GetRangeId(), b.GetRangeId()) })
	return out
}

// validateMembers checks what an Adopt's replica set says about members:
// incarnations well formed, at least one voter, a leader that is a voter
// (its own copy counts toward the HWM), and this replica named under its
// own incarnation if under any (the fence checked the same).
func (s *Replica) validateMembers(m *tenurev1.AdoptRequest) error {
	voters := 0
	for _, r := range m.GetReplicas() {
		inc := r.GetIncarnation()
		if inc != "" && !validIncarnation(inc) {
			return invalidf("replica %s: incarnation %q is not %d lowercase hex digits", r.GetId(), inc, 2*incarnationBytes)
		}
		if !r.GetLearner() {
			voters++
		}
		if r.GetId() == m.GetLeaderId() && r.GetLearner() {
			return invalidf("leader %s is a learner; a leader must be a voter", r.GetId())
		}
		if r.GetId() == s.cfg.ID && inc != "" && inc != s.incarnation {
			return preconditionf("range %q: adopt refused: the replica set names replica %s as incarnation %s, but this replica is incarnation %s (its disk was replaced or wiped)", m.GetRangeId(), s.cfg.ID, inc, s.incarnation)
		}
	}
	if voters == 0 {
		return invalidf("replica set has no voter")
	}
	return nil
}

// voterCount is how many of a replica set vote: the quorum is a majority of
// them, and learners never count toward it.
func voterCount(replicas []*tenurev1.Replica) int {
	n := 0
	for _, r := range replicas {
		if !r.GetLearner() {
			n++
		}
	}
	return n
}

// checkMember refuses a fetch from a replica whose incarnation is not the
// one the leader's replica set records for its id (both known): it comes
// from a disk that is not the member's, and its offsets say nothing about
// what the member holds. Refused before the fetch is looked at, so it is
// never counted toward the HWM.
func (l *leader) checkMember(m *tenurev1.FetchRequest) error {
	want := l.incarnations[m.GetReplicaId()]
	if got := m.GetIncarnation(); want != "" && got != "" && got != want {
		return preconditionf("range %q: fetch refused: replica %s is incarnation %s, the replica set at epoch %d records incarnation %s (its disk was replaced or wiped)",
			l.h.id, m.GetReplicaId(), got, l.epoch, want)
	}
	return nil
}
