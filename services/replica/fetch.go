package replica

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// Fetch is a follower's long poll: check its position against this
// leader's history, count it if it passed, and answer records from it, or
// wait up to max_wait_ms for something new (records or a newer HWM).
func (s *Replica) Fetch(ctx context.Context, req *connect.Request[tenurev1.FetchRequest]) (*connect.Response[tenurev1.FetchResponse], error) {
	return respond(s.fetch(ctx, req.Msg))
}

func (s *Replica) fetch(ctx context.Context, m *tenurev1.FetchRequest) (*tenurev1.FetchResponse, error) {
	if err := wire.ValidateRangeID(m.GetRangeId()); err != nil {
		return nil, err
	}
	if err := wire.ValidateRangeID(m.GetReplicaId()); err != nil {
		return nil, invalidf("fetching replica id: %v", err)
	}
	if m.GetEpoch() == 0 {
		return nil, invalidf("fetch epoch must be positive")
	}
	if m.GetMaxWaitMs() > wire.MaxFetchWaitMillis {
		return nil, invalidf("max_wait_ms %d is above the limit %d", m.GetMaxWaitMs(), wire.MaxFetchWaitMillis)
	}
	_, maxBytes := readBounds(0, m.GetMaxBytes())
	h, err := s.lookup(m.GetRangeId())
	if err != nil {
		return nil, err
	}
	l, err := h.leaderAt(m.GetEpoch())
	if err != nil {
		return nil, err
	}
	if m.GetReplicaId() == s.cfg.ID || !l.member(m.GetReplicaId()) {
		return nil, preconditionf("range %q: replica %s is not a follower in the replica set at epoch %d", h.id, m.GetReplicaId(), l.epoch)
	}
	if start := h.r.LogStart(); m.GetFetchOffset() < start {
		return nil, outOfRangef("range %q: fetch offset %d is below the log start %d", h.id, m.GetFetchOffset(), start)
	}
	wait := time.NewTimer(time.Duration(m.GetMaxWaitMs()) * time.Millisecond)
	defer wait.Stop()
	expired := false
	for {
		changed := h.r.Changed()
		a, ready, err := l.answerFetch(m, maxBytes)
		if se := (*storeError)(nil); errors.As(err, &se) {
			h.halt(err)
		}
		if err != nil || ready || expired {
			return a, err
		}
		select {
		case <-changed:
		case <-wait.C:
			expired = true
		case <-l.ctx.Done():
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// leaderAt returns the active leadership if it is at exactly epoch: a
// follower fetches only from the leader of the epoch it follows. h.mu is
// taken shared.
func (h *hosted) leaderAt(epoch uint64) (*leader, error) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	l := h.acting()
	if l == nil {
		return nil, h.notLeaderErr()
	}
	switch {
	case epoch < l.epoch:
		// A follower of a deposed leadership; it must be fenced and
		// adopted at this epoch before its offsets mean anything here.
		return nil, preconditionf("range %q: fetch at epoch %d is stale: leader %s is at epoch %d", h.id, epoch, h.s.cfg.ID, l.epoch)
	case epoch > l.epoch:
		// The follower was fenced at a later epoch than this leadership:
		// this leader is being deposed. Only a fence stops it; the fetch
		// is refused so nothing of the later epoch is counted here.
		return nil, preconditionf("range %q: fetch at epoch %d is ahead of leader %s at epoch %d (a later epoch exists)", h.id, epoch, h.s.cfg.ID, l.epoch)
	}
	return l, nil
}

// answerFetch serves one fetch pass: check the follower's position, count
// it if it passed, and read what follows. ready is false when there is
// nothing new for the follower (no records, no newer HWM), so the caller may
// hold the long poll.
func (l *leader) answerFetch(m *tenurev1.FetchRequest, maxBytes int) (a *tenurev1.FetchResponse, ready bool, err error) {
	h := l.h
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.acting() != l {
		return nil, false, l.endedErr()
	}
	// Read the HWM before the log end: both only grow and HWM <= log end,
	// so the answer never carries an HWM beyond its own log end.
	hwm := h.r.HWM()
	logEnd := h.r.LogEnd()
	hist := h.r.History()
	if len(hist) == 0 {
		// A leader always holds at least its own epoch's entry; an empty
		// history means the journal broke. Checking against it would tell
		// every follower to truncate to 0.
		return nil, false, &storeError{fmt.Errorf("range %q: leader's epoch history became unreadable at epoch %d", h.id, l.epoch)}
	}
	now := time.Now()
	if d := checkFetch(hist, logEnd, m.GetLastFetchedEpoch(), m.GetFetchOffset()); d != nil {
		// Not counted: this follower's offset includes bytes we lack.
		l.record(m.GetReplicaId(), 0, false, now)
		return &tenurev1.FetchResponse{Epoch: l.epoch, HighWaterMark: hwm, LogEnd: logEnd, Diverging: d}, true, nil
	}
	var recs []*tenurev1.Record
	if off := m.GetFetchOffset(); logEnd > off {
		// Records up to the log end, durable here or not: followers fsync
		// in parallel with the leader's own group commit.
		n := min(uint64(wire.MaxBatchRecords), logEnd-off)
		recs, err = h.r.Read(off, int(n), maxBytes)
		if err != nil {
			return nil, false, &storeError{fmt.Errorf("range %q: read from %d for %s: %w", h.id, off, m.GetReplicaId(), err)}
		}
	}
	sent := l.record(m.GetReplicaId(), m.GetFetchOffset(), true, now)
	ready = len(recs) > 0 || hwm > sent
	if ready {
		l.noteSent(m.GetReplicaId(), hwm)
	}
	return &tenurev1.FetchResponse{Epoch: l.epoch, Records: recs, HighWaterMark: hwm, LogEnd: logEnd}, ready, nil
}
