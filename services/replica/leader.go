package replica

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// leaseRecheck bounds how long a waiting append or read goes without
// rechecking the lease, which changes without telling us.
const leaseRecheck = 100 * time.Millisecond

// journaledEpoch is an epoch whose journal entry (epoch, start) is durable.
// Only journalEpoch makes one, and a leader can only be built from one: that
// is how "the entry is fsynced before anyone can observe the epoch" is written
// in the code's shape rather than in a comment.
type journaledEpoch struct {
	epoch uint64
	start uint64
}

// leader is one active leadership of a range at one epoch.
type leader struct {
	h     *hosted
	epoch uint64
	// epochStart is the offset of this epoch's epoch-start record: the
	// commit rule counts nothing until a quorum holds it.
	epochStart uint64
	// replicas is the range's replica set at this epoch, self included.
	replicas []*tenurev1.Replica
	// voters is how many of them vote: the commit needs a majority of
	// voters (wire.Quorum(voters)); learners never count.
	// Invariant: 1 <= voters <= len(replicas), and the leader is a voter.
	voters int
	// incarnations are the members' incarnations as the replica set
	// records them, by id ("" = not recorded): a fetch from another
	// incarnation is refused (checkMember). Never changes.
	incarnations map[string]string
	// peers are clients of the other members, by id: reads confirm this
	// leadership with them (readindex.go).
	peers map[string]tenurev1connect.ReplicaServiceClient
	// reads batches the confirmation rounds of reads.
	reads confirmer

	// ctx is cancelled, with the reason, when the leadership ends.
	ctx    context.Context
	cancel context.CancelCauseFunc

	// finalHWM is the HWM when the leadership ended, set under h.mu before
	// h.lead is cleared: appends still waiting are acknowledged only up to it.
	finalHWM uint64

	mu sync.Mutex
	// progress is each other member's fetch progress, by replica id.
	progress map[string]*progress
	// waiters are the appends waiting for the HWM to pass their end. The
	// committer wakes exactly those the HWM passed, so an HWM move costs one
	// wake per acknowledged append, not one per waiting append per change
	// of the range (64 clients waiting would be woken ~4 times per commit).
	waiters map[*commitWaiter]struct{}
}

// commitWaiter is one append waiting for the HWM to reach end.
type commitWaiter struct {
	end  uint64
	done chan struct{} // closed by wakeCommitted once the HWM reached end
}

// progress is a leader's view of one follower.
type progress struct {
	// offset is the follower's last fetch offset that passed the fetch
	// check: its durable log end, a prefix of the leader's log. It is what
	// counts toward the commit.
	// Invariant: checked || offset == 0.
	offset  uint64
	checked bool
	// learner: the replica set names this follower a learner. Its fetches
	// are answered, and its offset is never counted (checkedOffsets).
	learner bool
	// sentHWM is the HWM in the last answer sent to this follower: a newer
	// one is worth answering a long poll for even without records.
	sentHWM uint64
	// lastFetch is when the follower last fetched (zero: never).
	lastFetch time.Time
	// inHand counts this follower's fetches being held or answered;
	// answered is when the last of them returned (at first: when the
	// leadership began). Together they say how long the leader has been
	// waiting for the follower's next fetch (status).
	inHand   int
	answered time.Time
	// caughtUp is when a fetch last reached the log end the leader had at
	// the follower's previous fetch (at first: when the leadership began);
	// leaderEnd is the log end at its latest fetch. Kafka's lastCaughtUpTime:
	// under steady appends a follower never holds the leader's current end,
	// but it does reach what the leader had one fetch ago (metrics.go's lag
	// in seconds and under-replication).
	caughtUp  time.Time
	leaderEnd uint64
	// belowAt is 1 + the fetch offset of the last below_log_start answer
	// to this follower (0: none since it last passed the check). A
	// follower that knows the field resets and fetches from the log start
	// next, so a second one at the same offset is a follower older than
	// log starts, which asks again at once: it is held (fetch.go).
	belowAt uint64
}

// newLeader builds the leadership of an epoch already journaled. The caller
// installs it as h.lead under h.mu and then starts its committer.
func (h *hosted) newLeader(je journaledEpoch, replicas []*tenurev1.Replica) *leader {
	ctx, cancel := context.WithCancelCause(h.gen.ctx)
	l := &leader{
		h:          h,
		epoch:      je.epoch,
		epochStart: je.start,
		replicas:   replicas,
		voters:     voterCount(replicas),
		ctx:        ctx,
		cancel:     cancel,
		progress:   map[string]*progress{},
		waiters:    map[*commitWaiter]struct{}{},
		peers:      map[string]tenurev1connect.ReplicaServiceClient{},

		incarnations: map[string]string{},
	}
	now := time.Now()
	for _, r := range replicas {
		l.incarnations[r.GetId()] = r.GetIncarnation()
		if r.GetId() != h.s.cfg.ID {
			l.progress[r.GetId()] = &progress{answered: now, caughtUp: now, learner: r.GetLearner()}
			l.peers[r.GetId()] = tenurev1connect.NewReplicaServiceClient(h.s.httpClient(), r.GetAddress(), transport.ClientOptions(transport.ForReplica(r.GetId()))...)
		}
	}
	return l
}

// endedErr is why the leadership ended.
func (l *leader) endedErr() error {
	if err := context.Cause(l.ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return preconditionf("range %q: leadership at epoch %d ended", l.h.id, l.epoch)
}

// commitLoop raises the HWM to the commit point whenever the store changes
// (the leader's own fsync moving its durable end, its write moving its log
// end). Follower progress is counted by the fetch that reports it, which
// calls advance itself (advanceOrHalt): the acknowledgement of a batch then
// costs no extra goroutine hop. Both only ever raise the HWM (SetHWM
// ignores a lower one), so running concurrently is harmless.
func (l *leader) commitLoop() {
	for {
		changed := l.h.r.Changed()
		// Index commits matter only to a size limit; without one, a nil
		// channel never wakes the loop.
		var grown <-chan struct{}
		if l.h.hasSizeLimit() {
			grown = l.h.r.IndexGrown()
		}
		if !l.advanceOrHalt() {
			return
		}
		for woke := false; !woke; {
			select {
			case <-changed:
				woke = true
			case <-grown:
				// An index commit: the appends it stored may be what
				// passes the size limit, as retention sees it (logstore
				// IndexGrown, checkRetentionSize).
				grown = l.h.r.IndexGrown()
				l.h.checkRetentionSize()
			case <-l.ctx.Done():
				return
			}
		}
	}
}

// advanceOrHalt runs advance and halts the range if it failed; false then.
func (l *leader) advanceOrHalt() bool {
	if err := l.advance(); err != nil {
		l.h.halt(fmt.Errorf("raise HWM at epoch %d: %w", l.epoch, err))
		return false
	}
	return true
}

// advance raises the HWM to the commit point, if it moved, and wakes the
// appends the HWM now passes. h.mu must not be held (it is taken shared).
func (l *leader) advance() error {
	followers := l.checkedOffsets()
	h := l.h
	h.mu.RLock()
	defer h.mu.RUnlock()
	// A deposed leader's HWM must not move after the fence that deposed it:
	// the fence answer reported it, and the promotion planned from it.
	if h.acting() != l {
		return nil
	}
	hwm := h.r.HWM()
	next, ok := commitPoint(h.r.DurableEnd(), followers, l.voters, l.epochStart)
	// Followers receive records before the leader's own write of them has
	// committed (ReadTail), so a quorum of followers can be ahead of what
	// this leader has written: committed records are readable here first.
	next = min(next, h.r.LogEnd())
	// Monotonic: the HWM never steps back (the committed bound may have
	// raised it above what this epoch's quorum has reached so far).
	if ok && next > hwm {
		if err := h.r.SetHWM(next); err != nil {
			return err
		}
		hwm = next
	}
	l.wakeCommitted(hwm)
	// The range grew: past its size limit by more than the slack, the
	// retention loop removes the excess now rather than at its next tick.
	h.checkRetentionSize()
	return nil
}

// wakeCommitted wakes the waiting appends whose batches end at or below hwm.
// They recheck the HWM themselves (committed), so a wake is only a hint.
func (l *leader) wakeCommitted(hwm uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for w := range l.waiters {
		if w.end <= hwm {
			close(w.done)
			delete(l.waiters, w)
		}
	}
}

// addWaiter registers an append waiting for the HWM to reach end, and
// returns a function that unregisters it.
func (l *leader) addWaiter(end uint64) (*commitWaiter, func()) {
	w := &commitWaiter{end: end, done: make(chan struct{})}
	l.mu.Lock()
	l.waiters[w] = struct{}{}
	l.mu.Unlock()
	return w, func() {
		l.mu.Lock()
		delete(l.waiters, w)
		l.mu.Unlock()
	}
}

// checkedOffsets lists the voting followers' checked fetch offsets. A
// learner's copy never counts toward the commit: it is not in the voter
// set whose majority a promotion fences.
func (l *leader) checkedOffsets() []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]uint64, 0, len(l.progress))
	for _, p := range l.progress {
		if p.checked && !p.learner {
			out = append(out, p.offset)
		}
	}
	return out
}

// member reports whether id is another member of the replica set.
func (l *leader) member(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.progress[id]
	return ok
}

// waitCommitted waits until the HWM passes end (the batch [base, end) is on
// a quorum) and returns the HWM then. It fails when the leadership ends
// first (unless the batch had committed before it ended), when the lease is
// lost, or after the append timeout.
func (l *leader) waitCommitted(ctx context.Context, base, end uint64) (uint64, error) {
	h := l.h
	waitCtx, cancel := context.WithTimeout(ctx, h.s.cfg.AppendTimeout)
	defer cancel()
	var tick <-chan time.Time
	if h.s.cfg.Lease != nil {
		t := time.NewTicker(leaseRecheck)
		defer t.Stop()
		tick = t.C
	}
	// Registered before the first check, so a raise between the check and
	// the wait still wakes it.
	w, remove := l.addWaiter(end)
	defer remove()
	for {
		hwm, err := l.committed(end)
		if err != nil || hwm >= end {
			return hwm, err
		}
		select {
		case <-w.done:
		case <-l.ctx.Done():
		case <-tick:
		case <-waitCtx.Done():
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			return 0, deadlinef("range %q: append [%d, %d) not committed within %v (HWM %d); outcome unknown", h.id, base, end, h.s.cfg.AppendTimeout, hwm)
		}
	}
}

// committed reads the HWM that may acknowledge a batch ending at end: the
// live HWM while this leadership lasts, the frozen finalHWM after it ended.
func (l *leader) committed(end uint64) (uint64, error) {
	h := l.h
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.lead != l {
		// Appends that committed before the fence may still be
		// acknowledged; the rest have an unknown outcome.
		if l.finalHWM >= end {
			return l.finalHWM, nil
		}
		return l.finalHWM, l.endedErr()
	}
	if l.ctx.Err() != nil {
		// Ending (Close is stopping the range): the committer has stopped,
		// so the HWM is as final as it gets.
		if hwm := h.r.HWM(); hwm >= end {
			return hwm, nil
		}
		return 0, l.endedErr()
	}
	if !h.leaseValid(l.epoch) {
		return 0, preconditionf("range %q: leader %s lost its lease at epoch %d; not acknowledging", h.id, h.s.cfg.ID, l.epoch)
	}
	return h.r.HWM(), nil
}

// record notes a follower's fetch. A checked offset replaces the previous
// one (not the maximum: a follower that reports less now holds less); a
// diverged follower counts for nothing until it has truncated and fetched
// again. It returns the HWM last sent and whether a checked offset moved
// (the caller then raises the HWM: advance). logEnd is the leader's log end
// answered to this fetch.
func (l *leader) record(id string, offset uint64, checked bool, logEnd uint64, now time.Time) (sentHWM uint64, moved bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.progress[id]
	if p == nil {
		return 0, false
	}
	if !checked {
		offset = 0
	}
	moved = p.checked != checked || p.offset != offset
	p.offset, p.checked, p.lastFetch = offset, checked, now
	if checked {
		p.belowAt = 0
	}
	if checked && offset >= p.leaderEnd {
		p.caughtUp = now
	}
	p.leaderEnd = logEnd
	return p.sentHWM, moved && checked
}

// noteBelow records a below_log_start answer to follower id at offset off
// and says whether the previous one was at the same offset: a follower that
// does not act on it (older than log starts), whose answer is then held for
// its long poll rather than sent at once, so it does not fetch in a loop.
func (l *leader) noteBelow(id string, off uint64) (again bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.progress[id]
	if p == nil {
		return false
	}
	again = p.belowAt == off+1
	p.belowAt = off + 1
	return again
}

// noteSent records the HWM sent to a follower.
func (l *leader) noteSent(id string, hwm uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.progress[id]; p != nil {
		p.sentHWM = max(p.sentHWM, hwm)
	}
}

// fetchBegins marks a fetch of follower id as held or being answered, until
// fetchEnds (no allocation: this is on every fetch).
func (l *leader) fetchBegins(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.progress[id]; p != nil {
		p.inHand++
	}
}

// fetchEnds marks a fetch of follower id answered now.
func (l *leader) fetchEnds(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.progress[id]; p != nil {
		p.inHand--
		p.answered = time.Now()
	}
}

// followers reports each follower's progress for status. logEnd is the
// leader's log end, for the lag.
func (l *leader) followers(logEnd uint64) []*tenurev1.FollowerProgress {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	out := make([]*tenurev1.FollowerProgress, 0, len(l.progress))
	for _, r := range l.replicas {
		p := l.progress[r.GetId()]
		if p == nil {
			continue
		}
		fp := &tenurev1.FollowerProgress{ReplicaId: r.GetId(), FetchOffset: p.offset, Lag: logEnd - min(p.offset, logEnd), Learner: p.learner}
		if !p.lastFetch.IsZero() {
			fp.LastFetchUnixMs = p.lastFetch.UnixMilli()
		}
		if p.inHand == 0 {
			fp.FetchWaitingMs = uint64(max(0, now.Sub(p.answered).Milliseconds()))
		}
		out = append(out, fp)
	}
	return out
}
