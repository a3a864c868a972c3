package replica

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// Fetch is a follower's long poll: check its position against this
// leader's history, count it if it passed, and answer records from it, or
// wait up to max_wait_ms for something new (records or a newer HWM).
func (s *Replica) Fetch(ctx context.Context, req *connect.Request[tenurev1.FetchRequest]) (*connect.Response[tenurev1.FetchResponse], error) {
	return respond(s.fetch(ctx, req.Msg))
}

func (s *Replica) fetch(ctx context.Context, m *tenurev1.FetchRequest) (*tenurev1.FetchResponse, error) {
	return s.fetchUntil(ctx, m, false)
}

// fetchUntil is Fetch's pull. held is a FetchSession's pull: it has no
// deadline of its own (max_wait_ms is ignored) and is held until the range
// has news, now including a newer log start, or ctx ends: the session's
// heartbeat, not each range's answer, tells the follower the leader lives,
// so an idle range costs no message at all.
func (s *Replica) fetchUntil(ctx context.Context, m *tenurev1.FetchRequest, held bool) (*tenurev1.FetchResponse, error) {
	if err := wire.ValidateRangeID(m.GetRangeId()); err != nil {
		return nil, err
	}
	if err := wire.ValidateReplicaID(m.GetReplicaId()); err != nil {
		return nil, err
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
	if err := l.checkMember(m); err != nil {
		return nil, err
	}
	// While this fetch is held, the follower is not overdue (status).
	l.fetchBegins(m.GetReplicaId())
	defer l.fetchEnds(m.GetReplicaId())
	var waitC <-chan time.Time // nil for a held pull: never fires
	if !held {
		wait := time.NewTimer(time.Duration(m.GetMaxWaitMs()) * time.Millisecond)
		defer wait.Stop()
		waitC = wait.C
	}
	var linger <-chan time.Time
	expired := false
	// firstStart is the log start the first pass read: for a held pull a
	// later start is news, or a follower of an idle range under time
	// retention would keep its old records until the next append. (A
	// Fetch with a deadline carries the start in its expiry answer.)
	firstStart, passes := uint64(0), 0
	for {
		changed := h.r.Changed()
		a, news, moved, err := l.answerFetch(m, maxBytes)
		if passes++; passes == 1 {
			firstStart = a.GetLogStart()
		} else if held && news == fetchNothing && a.GetLogStart() > firstStart {
			news = fetchHWM
		}
		if se := (*storeError)(nil); errors.As(err, &se) {
			h.halt(err)
		}
		if moved {
			// The follower's checked offset is its acknowledgement: raise
			// the HWM and answer the appends it commits from here, without
			// a hop through the commit loop.
			l.advanceOrHalt()
		}
		if a.GetBelowLogStart() && !expired && l.noteBelow(m.GetReplicaId(), m.GetFetchOffset()) {
			// The same answer again: this follower does not reset (it is
			// older than log starts). Hold it for the long poll, as for
			// nothing new, instead of answering a loop of fetches.
			news = fetchNothing
		}
		if err != nil || news == fetchRecords || expired {
			if a != nil {
				l.noteSent(m.GetReplicaId(), a.GetHighWaterMark())
			}
			return a, err
		}
		if news == fetchHWM && linger == nil {
			// Only the HWM moved: hold the answer a little for records to
			// carry it. The HWM only serves the follower's own bound (it
			// acknowledges nothing), while with one append in flight an
			// answer per HWM move doubles the fetches, and the next
			// append's records are usually written within this wait.
			t := time.NewTimer(hwmLinger)
			defer t.Stop()
			linger = t.C
		}
		select {
		case <-changed:
		case <-waitC:
			expired = true
		case <-linger:
			expired = true
		case <-l.ctx.Done():
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// hwmLinger is how long a fetch answer that would carry only a newer HWM
// waits for records to carry it: short next to any reader's patience, long
// next to an acknowledgement's round trip and the client's next append.
const hwmLinger = 2 * time.Millisecond

// fetchNews is what a fetch pass has for the follower.
type fetchNews int

const (
	fetchNothing fetchNews = iota // nothing new: hold the long poll
	fetchHWM                      // only a newer HWM
	fetchRecords                  // records, or a divergence to answer
)

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
// it if it passed, and read what follows. news says what is new for the
// follower, so the caller may hold the long poll; moved says the follower's
// counted offset changed, so the caller raises the HWM (advance) once h.mu
// is released; the caller notes the HWM of the answer it sends (noteSent).
func (l *leader) answerFetch(m *tenurev1.FetchRequest, maxBytes int) (a *tenurev1.FetchResponse, news fetchNews, moved bool, err error) {
	h := l.h
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.acting() != l {
		return nil, fetchNothing, false, l.endedErr()
	}
	// Read the HWM before the log end: both only grow and HWM <= log end,
	// so the answer never carries an HWM beyond its own log end. The log
	// end answered is the assigned end: records accepted here, written or
	// still being written (the journal already holds their epoch, so the
	// check below describes them too).
	hwm := h.r.HWM()
	logEnd := h.r.AssignedEnd()
	hist := h.r.History()
	if len(hist) == 0 {
		// A leader always holds at least its own epoch's entry; an empty
		// history means the journal broke. Checking against it would tell
		// every follower to truncate to 0.
		return nil, fetchNothing, false, &storeError{fmt.Errorf("range %q: leader's epoch history became unreadable at epoch %d", h.id, l.epoch)}
	}
	// The log start is read after the history: both move only forward (the
	// start up, the history's front trimmed to the entry in force at the
	// start), so the history read is at least as complete as the start
	// needs, and the start is at most the HWM read above (retention removes
	// only committed records).
	start := min(h.r.LogStart(), hwm)
	now := time.Now()
	d, below := checkFetchFrom(hist, start, logEnd, m.GetLastFetchedEpoch(), m.GetFetchOffset())
	if below {
		return l.belowLogStart(m, start, logEnd, now), fetchRecords, false, nil
	}
	if d != nil {
		// Not counted: this follower's offset includes bytes we lack.
		l.record(m.GetReplicaId(), 0, false, logEnd, now)
		return &tenurev1.FetchResponse{Epoch: l.epoch, HighWaterMark: hwm, LogEnd: logEnd, LogStart: start, Diverging: d}, fetchRecords, false, nil
	}
	var recs []*tenurev1.Record
	if off := m.GetFetchOffset(); logEnd > off {
		// Records up to the assigned end, written and durable here or not:
		// followers write and fsync in parallel with the leader's own group
		// commit, from the moment the leader accepted the batch. Only
		// durable copies count toward the HWM (commitPoint), the leader's
		// own once its fsync returned.
		n := min(uint64(wire.MaxBatchRecords), logEnd-off)
		recs, err = h.r.ReadTail(off, int(n), maxBytes)
		if errors.Is(err, logstore.ErrBelowLogStart) {
			// Retention moved the log start past off since it was read
			// above (it runs beside fetches): the follower lacks only
			// committed records now deleted, the answer a fetch from below
			// the start gets. Not a store failure.
			// Unclamped: the start is at most the HWM now, which may be
			// above the HWM read before it.
			start = max(start, h.r.LogStart())
			return l.belowLogStart(m, start, logEnd, now), fetchRecords, false, nil
		}
		if err != nil {
			return nil, fetchNothing, false, &storeError{fmt.Errorf("range %q: read from %d for %s: %w", h.id, off, m.GetReplicaId(), err)}
		}
	}
	sent, moved := l.record(m.GetReplicaId(), m.GetFetchOffset(), true, logEnd, now)
	switch {
	case len(recs) > 0:
		news = fetchRecords
	case hwm > sent:
		news = fetchHWM
	}
	return &tenurev1.FetchResponse{Epoch: l.epoch, Records: recs, HighWaterMark: hwm, LogEnd: logEnd, LogStart: start}, news, moved, nil
}

// belowLogStart is the answer to a follower this leader cannot serve from
// its log: it lacks records below the log start, or its last epoch precedes
// the trimmed history. Not counted: its offset says nothing this leader can
// check. The answer's HWM is 0: a follower older than log starts does not
// know below_log_start and reads this as "nothing new, your position
// checked", raising its HWM to min(HWM, its log end), which would mark
// records the leader never checked as committed. With 0 it raises nothing
// and asks again.
func (l *leader) belowLogStart(m *tenurev1.FetchRequest, start, logEnd uint64, now time.Time) *tenurev1.FetchResponse {
	l.record(m.GetReplicaId(), 0, false, logEnd, now)
	return &tenurev1.FetchResponse{Epoch: l.epoch, LogEnd: logEnd, LogStart: start, BelowLogStart: true}
}
