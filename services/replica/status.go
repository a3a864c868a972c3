package replica

import (
	"context"
	"errors"
	"os"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/journal"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// GetStatus reports one hosted range, or all of them sorted by id.
func (s *Replica) GetStatus(ctx context.Context, req *connect.Request[tenurev1.ReplicaServiceGetStatusRequest]) (*connect.Response[tenurev1.ReplicaServiceGetStatusResponse], error) {
	return respond(s.status(req.Msg))
}

func (s *Replica) status(m *tenurev1.ReplicaServiceGetStatusRequest) (*tenurev1.ReplicaServiceGetStatusResponse, error) {
	var hs []*hosted
	if id := m.GetRangeId(); id != "" {
		h, err := s.lookup(id)
		if lost := s.lostRanges(id); err != nil && len(lost) > 0 {
			// Not hosted because this disk lost it: say so.
			return s.statusHeader(lost), nil
		}
		if err != nil {
			return nil, err
		}
		hs = []*hosted{h}
	} else {
		var err error
		if hs, err = s.hostedRanges(); errors.Is(err, errStoreReopening) {
			// A moment without ranges: the replica itself still answers
			// (its disk says why).
			return s.statusHeader(s.lostRanges("")), nil
		}
		if err != nil {
			return nil, err
		}
	}
	out := s.statusHeader(s.lostRanges(m.GetRangeId()))
	for _, h := range hs {
		out.Ranges = append(out.Ranges, h.status())
	}
	return out, nil
}

// statusHeader is what GetStatus says of the replica itself.
func (s *Replica) statusHeader(lost []*tenurev1.LostRange) *tenurev1.ReplicaServiceGetStatusResponse {
	return &tenurev1.ReplicaServiceGetStatusResponse{ReplicaId: s.cfg.ID, Incarnation: s.incarnation, LostRanges: lost,
		Pid: int64(os.Getpid()), StartedUnixMs: s.started.UnixMilli(), Disk: diskStatusWire(s.diskStatus())}
}

// diskStatusWire is the store's full-disk state on the wire.
func diskStatusWire(d logstore.DiskStatus) *tenurev1.DiskStatus {
	out := &tenurev1.DiskStatus{Full: d.Full, Reason: d.Reason, FreeBytes: d.FreeBytes, ReserveBytes: d.ReserveBytes, UsedBytes: d.UsedBytes}
	if !d.FullSince.IsZero() {
		out.FullSinceUnixMs = d.FullSince.UnixMilli()
	}
	return out
}

// status reports the range's state.
func (h *hosted) status() *tenurev1.RangeStatus {
	h.mu.RLock()
	defer h.mu.RUnlock()
	logEnd := h.r.LogEnd()
	st := &tenurev1.RangeStatus{
		RangeId:       h.id,
		Role:          h.role(),
		FencedEpoch:   h.st.FencedEpoch,
		Epoch:         h.st.Epoch,
		LogStart:      h.r.LogStart(),
		LogEnd:        logEnd,
		HighWaterMark: h.r.HWM(),
		LeaderId:      h.st.LeaderID,
		LeaderAddress: h.st.LeaderAddress,
		LastEpoch:     h.r.LastEpoch(),
		StoredBytes:   h.r.StoredBytes(),
		Retention:     h.retentionInForceLocked(),
		// Without a lease service a leader's lease is always valid.
		LeaseValid: h.s.cfg.Lease == nil,
	}
	if l := h.lead; l != nil {
		st.Followers = l.followers(logEnd)
		st.LeaseValid = h.leaseValid(l.epoch)
	}
	if h.halted != nil {
		st.Halted = h.halted.Error()
	}
	h.cuts.report(st)
	return st
}

// GetEpochHistory returns one range's epoch history, log end and HWM.
func (s *Replica) GetEpochHistory(ctx context.Context, req *connect.Request[tenurev1.GetEpochHistoryRequest]) (*connect.Response[tenurev1.GetEpochHistoryResponse], error) {
	return respond(s.epochHistory(req.Msg))
}

func (s *Replica) epochHistory(m *tenurev1.GetEpochHistoryRequest) (*tenurev1.GetEpochHistoryResponse, error) {
	h, err := s.lookup(m.GetRangeId())
	if err != nil {
		return nil, err
	}
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.quarantinedLocked() {
		// Its history is not known: an empty one would read as complete.
		return nil, h.haltedErr()
	}
	return &tenurev1.GetEpochHistoryResponse{
		History:       journal.ToWire(h.r.History()),
		LogEnd:        h.r.LogEnd(),
		HighWaterMark: h.r.HWM(),
	}, nil
}
