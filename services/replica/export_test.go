package replica

import (
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// LogForTest returns every record of a range's log, committed or not, so
// tests can compare replicas byte for byte.
func (s *Replica) LogForTest(rangeID string) ([]*tenurev1.Record, error) {
	h, err := s.lookup(rangeID)
	if err != nil {
		return nil, err
	}
	var out []*tenurev1.Record
	// From the log start: records below it were deleted by retention.
	start := h.r.LogStart()
	for end := h.r.LogEnd(); start+uint64(len(out)) < end; {
		recs, err := h.r.Read(start+uint64(len(out)), 0, 0)
		if err != nil {
			return nil, err
		}
		if len(recs) == 0 {
			break
		}
		out = append(out, recs...)
	}
	return out, nil
}

// SyncsOnDemandForTest reports whether a range's store syncs its writes on
// demand (logstore's SetSyncOnDemand).
func (s *Replica) SyncsOnDemandForTest(rangeID string) (bool, error) {
	h, err := s.lookup(rangeID)
	if err != nil {
		return false, err
	}
	return h.r.SyncsOnDemand(), nil
}

// AdvanceLogStartForTest raises a range's log start as retention would
// (helper policy's loop calls the same store method on the leader).
func (s *Replica) AdvanceLogStartForTest(rangeID string, to uint64) (uint64, error) {
	h, err := s.lookup(rangeID)
	if err != nil {
		return 0, err
	}
	return h.r.AdvanceLogStart(to)
}

// SessionMessages is how many messages this replica has received on its
// fetch sessions, heartbeats included.
func (s *Replica) SessionMessages() uint64 {
	return s.sumSessions(func(fs *fetchSession) uint64 { return fs.messages.Load() })
}

// SessionAppliedAnswers is how many fetched answers this replica's fetch
// sessions wrote for their fetch loops, several ranges' in one commit.
func (s *Replica) SessionAppliedAnswers() uint64 {
	return s.sumSessions(func(fs *fetchSession) uint64 { return fs.applied.Load() })
}

func (s *Replica) sumSessions(count func(*fetchSession) uint64) uint64 {
	s.sessions.mu.Lock()
	defer s.sessions.mu.Unlock()
	var n uint64
	for _, fs := range s.sessions.m {
		n += count(fs)
	}
	return n
}

// SetBeforeSessionMessage replaces what a fetch session's sender runs
// before it takes what is ready into a message: answers on the leader's
// side, pulls on the follower's (a nil function keeps the current one).
// restore puts the previous ones back.
func SetBeforeSessionMessage(answers, pulls func(queued func() int)) (restore func()) {
	prevAnswers, prevPulls := beforeAnswers, beforePulls
	if answers != nil {
		beforeAnswers = answers
	}
	if pulls != nil {
		beforePulls = pulls
	}
	return func() { beforeAnswers, beforePulls = prevAnswers, prevPulls }
}
