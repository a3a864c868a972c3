package replica

import (
	"context"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// DropRange deletes a range's data and state from this replica: the range
// was deleted, or this replica was removed from it. Idempotent: a range not
// hosted answers existed=false.
func (s *Replica) DropRange(ctx context.Context, req *connect.Request[tenurev1.DropRangeRequest]) (*connect.Response[tenurev1.DropRangeResponse], error) {
	return respond(s.dropRange(req.Msg))
}

func (s *Replica) dropRange(m *tenurev1.DropRangeRequest) (*tenurev1.DropRangeResponse, error) {
	id := m.GetRangeId()
	if err := wire.ValidateRangeID(id); err != nil {
		return nil, err
	}
	if m.GetEpoch() == 0 {
		return nil, invalidf("drop epoch must be positive")
	}
	// This replica no longer serves the range, whether it lost it or not.
	s.forgetLost(id)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errClosed
	}
	h := s.ranges[id]
	s.mu.Unlock()
	if h == nil {
		return &tenurev1.DropRangeResponse{}, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.dropped {
		return &tenurev1.DropRangeResponse{}, nil
	}
	// Invariant 4: a replica fenced at E takes no command from below E.
	// A drop from a deposed promoter must not destroy what the current
	// epoch's promotion counted on.
	if e := m.GetEpoch(); e < h.st.FencedEpoch {
		return nil, preconditionf("range %q: drop at epoch %d refused: fenced at epoch %d", h.id, e, h.st.FencedEpoch)
	}
	// A leader's log is the range's reference: it hands leadership over
	// (a fence at a later epoch deposes it) before it may be removed.
	if l := h.acting(); l != nil {
		return nil, preconditionf("range %q: drop refused: replica %s leads at epoch %d; hand leadership over first", h.id, s.cfg.ID, l.epoch)
	}
	if err := h.dropLocked(); err != nil {
		return nil, err
	}
	return &tenurev1.DropRangeResponse{Existed: true}, nil
}
