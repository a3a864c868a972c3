package replica

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// A leader confirms it still leads before it answers a read: the Raft
// ReadIndex rule (Raft thesis section 6.4), not a lease.
//
// The lease cannot guard reads here. The promoter deposes a leader that
// misses its probes without waiting for the TTL (fencing, not the lease, keeps
// appends safe), so a leader cut off from the promoter and its followers can
// still hold a lease it believes valid for up to a TTL while a newer epoch
// commits records elsewhere; a read it answered would miss them. The chaos
// suite caught exactly that (flaky, seed 1 in the CI run of 8df12fc: a read
// answered HWM 46 after later records had been acknowledged).
//
// The rule: take the HWM h, then run a round that starts after that moment
// and asks every follower its fenced epoch. If a quorum, counting this
// leader, is fenced at no more than this leader's epoch E at some instant
// after the round started, and this leader still acts at E afterwards, then
// no epoch above E had committed anything when h was taken: committing under
// E' > E needs a quorum fenced at E' first, fences only rise, and two
// quorums share a replica. Every record acknowledged before h was taken is
// below h (E's own appends are acknowledged only once the HWM passes them;
// earlier epochs' are below E's epoch-start record, which readableLeader
// requires committed). So the read is linearizable at the instant h was read.
//
// Concurrent reads share rounds: a read waits for the first round that
// starts after it asked, so under load a round costs one round trip per
// follower for every batch of reads, not per read.

// confirmTimeout bounds one confirmation round; a read whose round finds no
// quorum in time fails with Unavailable and the client retries.
const confirmTimeout = time.Second

// confirmRound is one confirmation round; err is set before done is closed.
type confirmRound struct {
	done chan struct{}
	err  error
}

// confirmer runs a leadership's confirmation rounds one at a time.
type confirmer struct {
	mu sync.Mutex
	// running is the round in flight (nil: none); next is the round every
	// read that asked after running started waits for (nil: none asked).
	running, next *confirmRound
}

// confirm returns once a confirmation round that started after the call
// found a quorum fenced at no more than l.epoch, or fails. The caller must
// have read what it answers (the HWM) before calling, and must check that
// this leadership still acts after it returns.
func (l *leader) confirm(ctx context.Context) error {
	if wire.Quorum(l.voters) <= 1 {
		return nil // a quorum of one is this leader itself
	}
	c := &l.reads
	c.mu.Lock()
	var r *confirmRound
	switch {
	case c.running == nil:
		// No round in flight: start one now; it starts after this call.
		r = &confirmRound{done: make(chan struct{})}
		c.running = r
		go l.runConfirm(r)
	case c.next == nil:
		// The round in flight may have asked before this read's HWM was
		// taken, so it proves nothing for it: wait for the next one.
		r = &confirmRound{done: make(chan struct{})}
		c.next = r
	default:
		r = c.next
	}
	c.mu.Unlock()
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	case <-l.ctx.Done():
		return l.endedErr()
	}
}

// runConfirm runs round r and then whatever round was queued behind it.
func (l *leader) runConfirm(r *confirmRound) {
	for r != nil {
		r.err = l.confirmOnce()
		close(r.done)
		c := &l.reads
		c.mu.Lock()
		r, c.next = c.next, nil
		c.running = r
		c.mu.Unlock()
	}
}

// confirmOnce asks every follower for its fenced epoch of this range and
// returns nil once enough of them, with this leader, make a quorum fenced at
// no more than l.epoch.
func (l *leader) confirmOnce() error {
	// A quorum of voters: only a voter quorum can elect a later leader, so
	// only voters' answers say none did. Counting learners' would let a
	// leader cut off from its voters confirm on its learners' word while
	// the voters follow a newer leader, and serve a stale read; counting
	// them in the size made one learner down fail reads a voter quorum
	// would serve.
	need := wire.Quorum(l.voters) - 1 // this leader counts itself
	learners := make(map[string]bool)
	for _, r := range l.replicas {
		if r.GetLearner() {
			learners[r.GetId()] = true
		}
	}
	ctx, cancel := context.WithTimeout(l.ctx, confirmTimeout)
	defer cancel()
	type answer struct {
		id  string
		err error
	}
	answers := make(chan answer, len(l.peers))
	for id, client := range l.peers {
		go func() {
			resp, err := client.GetStatus(ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: l.h.id}))
			if err == nil {
				err = l.checkPeerFence(id, resp.Msg)
			}
			answers <- answer{id, err}
		}()
	}
	var failures []string
	for range l.peers {
		a := <-answers
		if a.err == nil && learners[a.id] {
			continue // answered, and counts for nothing
		}
		if a.err == nil {
			if need--; need == 0 {
				return nil
			}
			continue
		}
		if se := (*statusError)(nil); errors.As(a.err, &se) && se.code == connect.CodeFailedPrecondition {
			// A later epoch exists: this leadership is over, whatever
			// the other answers say.
			return a.err
		}
		failures = append(failures, fmt.Sprintf("%s: %v", a.id, a.err))
	}
	return coded(connect.CodeUnavailable, "range %q: leader %s at epoch %d could not confirm with a quorum that it still leads; not serving the read (%s)",
		l.h.id, l.h.s.cfg.ID, l.epoch, strings.Join(failures, "; "))
}

// checkPeerFence checks one follower's status answer: fenced at no more than
// this leader's epoch. A follower fenced below it (one the promotion did not
// reach yet) is no member of any quorum of a later epoch either.
func (l *leader) checkPeerFence(id string, m *tenurev1.ReplicaServiceGetStatusResponse) error {
	for _, st := range m.GetRanges() {
		if st.GetRangeId() != l.h.id {
			continue
		}
		if f := st.GetFencedEpoch(); f > l.epoch {
			// Name the leader the peer knows of, so a client can go there.
			leader := "leader unknown"
			if st.GetLeaderId() != "" {
				leader = fmt.Sprintf("leader is %s at %s (epoch %d)", st.GetLeaderId(), st.GetLeaderAddress(), st.GetEpoch())
			}
			return preconditionf("range %q: replica %s is fenced at epoch %d, above leader %s's epoch %d: a later epoch exists; %s; not serving reads",
				l.h.id, id, f, l.h.s.cfg.ID, l.epoch, leader)
		}
		return nil
	}
	return fmt.Errorf("status answer does not report range %q", l.h.id)
}
