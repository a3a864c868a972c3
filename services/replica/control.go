package replica

import (
	"context"
	"errors"
	"slices"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// This file is defence in depth on the control plane: mutual TLS says only
// the promoter may fence, and these checks keep a promoter that is wrong
// (a bug, a stolen certificate, a lease service of another cluster) from
// doing what no correct promotion does.

// RangeSource is the lease service's word on a range.
type RangeSource interface {
	Range(ctx context.Context, rangeID string) (*tenurev1.RangeInfo, error)
}

// fenceJumpUnchecked is how far above a range's current fence a fence is
// taken on the promoter's word. A correct promoter fences at the epoch the
// lease service just granted, and each grant is +1; a replica sees larger
// jumps only for promotions that never reached it (each failed promotion
// burns an epoch, and the promoter stops granting while no quorum answers),
// so a thousand covers a long outage. Beyond it the fence is checked against
// the epoch the lease service has granted: without the check, one
// Fence(R, 2^64-1) bricks the range forever, since every later fence is
// lower and refused (invariant 4).
const fenceJumpUnchecked = 1 << 10

// fenceJumpMax bounds a jump when no RangeSource can check it. 2^32 is far
// beyond any jump a real range makes, and leaves room for 2^32 such jumps
// before an epoch could reach 2^64-1.
const fenceJumpMax = 1 << 32

// rangeCheckTimeout bounds a lease service read on the fence path.
const rangeCheckTimeout = 2 * time.Second

// checkFenceJump refuses a fence at e far above the current fence cur that
// the lease service has not granted. h.mu is held: the check is on a rare
// path, and the fence would stop the range's data path anyway.
func (s *Replica) checkFenceJump(ctx context.Context, rangeID string, cur, e uint64) error {
	if e-cur <= fenceJumpUnchecked {
		return nil
	}
	if s.cfg.Ranges == nil {
		if e-cur > fenceJumpMax {
			return preconditionf("range %q: fence at epoch %d refused: %d above the current fence %d, and no lease service to check it against (at most %d)", rangeID, e, e-cur, cur, uint64(fenceJumpMax))
		}
		return nil
	}
	info, err := s.rangeInfo(ctx, rangeID)
	if err != nil {
		return err
	}
	// Epochs are granted by the lease service alone (invariant 7): a fence
	// above its current epoch is for an epoch nobody was granted.
	if granted := info.GetEpoch(); e > granted {
		return preconditionf("range %q: fence at epoch %d refused: the lease service has granted only up to epoch %d", rangeID, e, granted)
	}
	return nil
}

// checkHostable refuses to host a range that the lease service does not
// list this replica as a member of: a fence that would create it names a
// range that is not ours, and every such range would be a journal, a state
// key and a place in every status forever.
func (s *Replica) checkHostable(ctx context.Context, rangeID string) error {
	if s.cfg.Ranges == nil {
		return nil
	}
	info, err := s.rangeInfo(ctx, rangeID)
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(info.GetReplicas(), func(r *tenurev1.Replica) bool { return r.GetId() == s.cfg.ID }) {
		return preconditionf("range %q: fence refused: the lease service does not list replica %s among its members", rangeID, s.cfg.ID)
	}
	return nil
}

// rangeInfo reads a range from the lease service, mapping its answer to
// what the fence answers: an unknown range is refused, an unreachable lease
// service is Unavailable (the promoter retries; no grant happens without it
// anyway).
func (s *Replica) rangeInfo(ctx context.Context, rangeID string) (*tenurev1.RangeInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, rangeCheckTimeout)
	defer cancel()
	info, err := s.cfg.Ranges.Range(ctx, rangeID)
	var ce *connect.Error
	switch {
	case err == nil:
		return info, nil
	case errors.As(err, &ce) && ce.Code() == connect.CodeNotFound:
		return nil, preconditionf("range %q: fence refused: the lease service has no such range", rangeID)
	default:
		return nil, coded(connect.CodeUnavailable, "range %q: fence not checked: the lease service did not answer: %v", rangeID, err)
	}
}
