package promoter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// probeState is what the probes know of one replica address.
type probeState struct {
	// misses counts consecutive failed probes; Config.ProbeMisses of them
	// make the address's leaderships suspect.
	misses int
	// busy is set while a probe of the address is out, so a slow replica
	// gets one probe at a time, not one per interval.
	busy bool
	// lastFull is when the last full status of the address was read.
	lastFull time.Time
	// refused is set while the last probe of the address showed that no
	// process serves there (peerGone). Slow or lost answers do not set
	// it; see quorumAnswering.
	refused bool
	// answeredAs is the replica id the last answer from the address gave
	// ("" when the last probe got no answer, or the replica is older than
	// ids in its status). The probes ask as nobody in particular, so a
	// replica answers whoever it is; a member whose address answers as
	// another replica is misdirected there: every call meant for it is
	// refused (transport.RequireReplica), a fence included, so it counts
	// as down in quorumAnswering like a refused connection.
	answeredAs string
	// probed is closed once the first probe of the address has ended,
	// whatever its outcome (awaitFirstProbes); first says it is not yet.
	probed chan struct{}
	first  bool
}

func newProbeState() *probeState {
	return &probeState{probed: make(chan struct{}), first: true}
}

// probeLoop probes every replica address every ProbeInterval. It promotes a
// range whose leader is gone (peerGone: refused connections and the like),
// misses ProbeMisses probes in a row while its lease is no longer live, or
// no longer leads at the range's epoch (a restarted leader does not serve
// until told again), and reconciles members that are not following
// the current leader at the current epoch. A leader that leads at the
// epoch but reports its lease not valid (it refuses appends and reads) is
// given its lease again, and then promoted away if that does not help
// (observeServing). Fencing keeps all of this safe: a wrong suspicion costs
// an epoch, never a record.
//
// Most probes only ask whether the replica answers: the status of one range
// it hosts. Every StatusInterval a probe reads its full status instead (every
// range it hosts), which is what finds a leader not serving at its epoch and
// members to reconcile. A full status of a replica hosting a thousand ranges
// every 100ms, three replicas, was a steady load of its own, paid mostly by
// the survivors of a mass failover while they were busiest; liveness, which
// is what a failover waits for, still takes one ProbeInterval to notice.
func (p *Promoter) probeLoop(ctx context.Context) {
	t := time.NewTicker(p.cfg.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.probeAll(ctx)
	}
}

func (p *Promoter) probeAll(ctx context.Context) {
	p.mu.Lock()
	addrs := map[string]bool{}
	for _, rs := range p.ranges {
		for _, r := range rs.replicas {
			addrs[r.GetAddress()] = true
		}
	}
	p.mu.Unlock()
	for addr := range addrs {
		p.mu.Lock()
		ps := p.probes[addr]
		if ps == nil {
			ps = newProbeState()
			p.probes[addr] = ps
		}
		busy := ps.busy
		ps.busy = true
		p.mu.Unlock()
		if busy {
			continue
		}
		go p.probe(ctx, addr)
	}
}

func (p *Promoter) probe(ctx context.Context, addr string) {
	started := time.Now()
	p.mu.Lock()
	full := started.Sub(p.probes[addr].lastFull) >= p.cfg.StatusInterval
	one := ""
	if !full {
		one = p.hostedAtLocked(addr)
		full = one == ""
	}
	p.mu.Unlock()
	ask := func() (*connect.Response[tenurev1.ReplicaServiceGetStatusResponse], error) {
		cctx, cancel := context.WithTimeout(ctx, p.cfg.ProbeTimeout)
		defer cancel()
		return p.replica(addr).GetStatus(cctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: one}))
	}
	resp, err := ask()
	if err != nil && connect.CodeOf(err) != connect.CodeUnavailable && connectionLost(err) && ctx.Err() == nil {
		// The connection broke under the probe (reset, broken pipe, EOF):
		// the process may just have died, mid-probe. Ask again at once, on
		// a new connection. A dead process refuses it, which is acted on
		// now; one missed probe would otherwise wait a probe interval for
		// the next to be refused (seen: a kill's first probe failing with
		// a broken pipe, the failover starting ~100 ms later).
		resp, err = ask()
	}
	if !full && connect.CodeOf(err) == connect.CodeNotFound {
		// The replica answered: it is alive, it only does not host that
		// range (yet).
		err = nil
	}
	p.mu.Lock()
	ps := p.probes[addr]
	ps.busy = false
	if ps.first {
		ps.first = false
		close(ps.probed)
	}
	if ctx.Err() != nil {
		p.mu.Unlock()
		return
	}
	ps.refused = peerGone(err)
	switch {
	case resp != nil && err == nil:
		ps.answeredAs = resp.Msg.GetReplicaId()
	case err != nil:
		ps.answeredAs = ""
	}
	// Otherwise the replica answered NotFound for the range asked about:
	// alive, and who it is was read by an earlier probe (a full probe
	// rereads it every StatusInterval).
	if err == nil && !full {
		ps.misses = 0
		p.mu.Unlock()
		return
	}
	if err != nil {
		ps.misses++
		// A process that is gone is gone: no reason to wait for more misses.
		refused := ps.refused
		down := refused || ps.misses >= p.cfg.ProbeMisses
		type suspect struct {
			rangeID, leader string
			epoch           uint64
		}
		var suspects []suspect
		if down {
			for id, rs := range p.ranges {
				if rs.leaderID != "" && rs.address(rs.leaderID) == addr && !p.inflight[id] {
					suspects = append(suspects, suspect{id, rs.leaderID, rs.epoch})
				}
			}
		}
		p.mu.Unlock()
		for _, sus := range suspects {
			// Missed probes alone are weak evidence: a leader busy with a
			// burst (the survivors of a mass failover) answers late but
			// still renews its lease. Promote on misses only if the lease
			// service no longer sees that leader's lease as live; a refused
			// connection is strong evidence and acts at once.
			if !refused && p.leaseLive(ctx, sus.rangeID, sus.epoch) {
				continue
			}
			// The reason names the leader: it lands in the transition
			// record and the trace, where an address alone says little.
			p.schedule(ctx, sus.rangeID, sus.epoch, "leader "+sus.leader+" unreachable: "+err.Error())
		}
		return
	}
	ps.misses, ps.lastFull = 0, started
	byRange := make(map[string]*tenurev1.RangeStatus, len(resp.Msg.GetRanges()))
	for _, s := range resp.Msg.GetRanges() {
		byRange[s.GetRangeId()] = s
	}
	type action struct {
		rangeID    string
		epoch      uint64
		generation uint64
		replica    *tenurev1.Replica
		leader     *tenurev1.Replica
		members    []*tenurev1.Replica
		promote    string // non-empty: promote with this reason
		rebind     string // non-empty: bind the lease to this leader; else reconcile replica
	}
	var actions []action
	replicaID := resp.Msg.GetReplicaId()
	for id, rs := range p.ranges {
		// A range whose leader this promoter does not know (another promoter
		// adopted it and died before recording or binding) learns it from
		// the replica that leads at exactly the range's epoch.
		if st := byRange[id]; rs.leaderID == "" && !p.inflight[id] && st.GetRole() == tenurev1.Role_ROLE_LEADER &&
			st.GetEpoch() == rs.epoch && rs.epoch > 0 && rs.address(replicaID) == addr {
			rs.leaderID, rs.changed = replicaID, time.Now()
			continue
		}
		// Skip ranges being promoted, without a leader yet, or whose state
		// changed after this probe was sent.
		if p.inflight[id] || rs.leaderID == "" || rs.changed.After(started) {
			continue
		}
		if replicaID != "" && replicaID != rs.leaderID && rs.address(rs.leaderID) == addr {
			// The leader's address answers as another replica (its
			// address was set to another member's, or another replica now
			// serves there): every call meant for the leader is refused
			// there as misdirected, appends and fetches included, so the
			// range is unavailable as surely as with the leader dead,
			// while the leader may still renew its lease elsewhere. Only a
			// promotion, which counts the misdirected leader as down
			// (quorumAnswering), gives the range a reachable leader.
			actions = append(actions, action{rangeID: id, epoch: rs.epoch, promote: fmt.Sprintf(
				"leader %s unreachable: its address %s answers as replica %s", rs.leaderID, addr, replicaID)})
			continue
		}
		if rs.address(replicaID) != addr {
			continue
		}
		st := byRange[id]
		if st.GetFencedEpoch() > rs.epoch {
			// The replica is ahead of us: another promotion happened. The
			// lease events and refresh will catch us up.
			continue
		}
		// The member as stored: its recorded incarnation goes with the
		// fence, so another disk under its id refuses rather than joins.
		member := rs.member(replicaID)
		leader := &tenurev1.Replica{Id: rs.leaderID, Address: rs.address(rs.leaderID)}
		if replicaID == rs.leaderID {
			// The leader must lead at exactly the range's epoch. A restarted
			// leader comes back not serving; a fenced one lost its epoch.
			if st == nil || st.GetRole() != tenurev1.Role_ROLE_LEADER || st.GetEpoch() != rs.epoch {
				actions = append(actions, action{rangeID: id, epoch: rs.epoch, promote: fmt.Sprintf("leader %s not serving at epoch %d", replicaID, rs.epoch)})
				continue
			}
			bound := p.notServingAfter()
			switch rs.observeServing(st.GetLeaseValid(), started, bound) {
			case serveRebind:
				actions = append(actions, action{rangeID: id, epoch: rs.epoch, rebind: rs.leaderID})
			case servePromote:
				actions = append(actions, action{rangeID: id, epoch: rs.epoch, promote: fmt.Sprintf(
					"leader %s not serving at epoch %d: its lease not valid for at least %v, and a rebind did not help", replicaID, rs.epoch, 2*bound)})
			}
			continue
		}
		// A member must follow the current leader at the current epoch.
		if st == nil || st.GetEpoch() != rs.epoch || st.GetRole() != tenurev1.Role_ROLE_FOLLOWER || st.GetLeaderId() != rs.leaderID {
			actions = append(actions, action{rangeID: id, epoch: rs.epoch, generation: rs.generation, replica: member, leader: leader, members: rs.replicas})
		}
	}
	p.mu.Unlock()
	for _, a := range actions {
		if a.promote != "" {
			p.schedule(ctx, a.rangeID, a.epoch, a.promote)
			continue
		}
		if a.rebind != "" {
			p.log.Warn("leader not serving with its lease not valid; binding the lease to it again", "range", a.rangeID, "epoch", a.epoch, "leader", a.rebind)
			go p.rebind(ctx, a.rangeID, a.epoch, a.rebind)
			continue
		}
		p.reconcile(ctx, a.rangeID, a.epoch, a.generation, a.replica, a.leader, a.members)
	}
}

// awaitFirstProbes waits until every address of rangeID's members has been
// probed once, starting the probes of addresses never probed, for at most
// twice ProbeTimeout (a probe may ask twice). Until an address was probed,
// quorumAnswering cannot know that it refuses connections or answers as
// another replica, and an attempt would spend an epoch learning it from its
// fence round: a new range whose addresses were swapped spent an epoch per
// attempt until the first probes were in. Probed addresses (every address
// of a range the promoter knew before its leader failed) cost nothing.
func (p *Promoter) awaitFirstProbes(ctx context.Context, rangeID string) {
	p.mu.Lock()
	var members []*tenurev1.Replica
	if rs := p.ranges[rangeID]; rs != nil {
		members = append(members, rs.replicas...)
		if rs.change != nil {
			members = append(members, rs.change.GetOldReplicas()...)
		}
	}
	var start []string
	var wait []chan struct{}
	for _, r := range members {
		ps := p.probes[r.GetAddress()]
		if ps == nil {
			// As probeAll would, one interval later.
			ps = newProbeState()
			ps.busy = true
			p.probes[r.GetAddress()] = ps
			start = append(start, r.GetAddress())
		}
		if ps.first {
			wait = append(wait, ps.probed)
		}
	}
	p.mu.Unlock()
	for _, addr := range start {
		go p.probe(ctx, addr)
	}
	if len(wait) == 0 {
		return
	}
	timeout := time.NewTimer(2 * p.cfg.ProbeTimeout)
	defer timeout.Stop()
	for _, ch := range wait {
		select {
		case <-ch:
		case <-timeout.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// peerGone reports whether a probe's error shows that no process serves
// the address, which promotes its leaderships at once, without asking the
// lease service: the connection was refused, the name no longer resolves
// (a stopped container), the connection was reset or closed under the
// probe (a process killed mid-call), or the server itself answered
// Unavailable (closing, or another replica now at the address).
//
// Any other Unavailable, a request or answer lost on the way (a flaky or
// partitioned link, no route to the host), says nothing about the process:
// it is a missed probe, and misses promote only once the leader's lease is
// no longer live. Taking every Unavailable as death promoted healthy leaders
// on every dropped probe: the chaos suite's flaky links ended runs at epochs
// up to 22, each a fence of every replica and an etcd write.
func peerGone(err error) bool {
	if connect.CodeOf(err) != connect.CodeUnavailable {
		return false
	}
	if connect.IsWireError(err) {
		return true
	}
	var dns *net.DNSError
	return errors.Is(err, syscall.ECONNREFUSED) || (errors.As(err, &dns) && dns.IsNotFound) || connectionLost(err)
}

// connectionLost reports whether err is the connection to a peer breaking
// (reset, broken pipe, closed mid-answer), rather than the peer answering
// an error or answering too slowly.
func connectionLost(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// hostedAtLocked names a range whose replica set includes addr, for a
// liveness probe of addr ("" if none). p.mu is held.
func (p *Promoter) hostedAtLocked(addr string) string {
	for id, rs := range p.ranges {
		for _, r := range rs.replicas {
			if r.GetAddress() == addr {
				return id
			}
		}
	}
	return ""
}

// reconcile brings a replica that missed a promotion back: fence it at the
// current epoch (which stops it acting under any older one), then adopt it
// as a follower of the current leader. The leader's fetch check truncates
// whatever diverged, never below the follower's HWM.
func (p *Promoter) reconcile(ctx context.Context, rangeID string, epoch, generation uint64, r, leader *tenurev1.Replica, members []*tenurev1.Replica) {
	key := "reconcile/" + rangeID + "/" + r.GetId()
	if !p.begin(key) {
		return
	}
	go func() {
		defer p.end(key)
		cctx, cancel := context.WithTimeout(ctx, p.cfg.RPCTimeout)
		defer cancel()
		fenced, err := p.batchers(r).fence.call(cctx, &tenurev1.FenceRequest{RangeId: rangeID, Epoch: epoch, FencerId: p.cfg.ID,
			Incarnation: r.GetIncarnation(), RangeGeneration: generation})
		if err == nil && fenced.GetHalted() != "" {
			// It refuses Adopt until its replica restarts; asking at every
			// probe only repeats the refusal.
			p.log.Debug("reconcile: copy halted; not adopting it until its replica restarts", "range", rangeID, "epoch", epoch, "replica", r.GetId(), "halted", fenced.GetHalted())
			return
		}
		if err == nil {
			err = p.adoptFollower(cctx, rangeID, epoch, r, leader, members)
		}
		if err != nil {
			p.log.Debug("reconcile failed; will retry on a later probe", "range", rangeID, "epoch", epoch, "replica", r.GetId(), "err", err)
			return
		}
		p.log.Info("reconciled straggler", "range", rangeID, "epoch", epoch, "replica", r.GetId(), "leader", leader.GetId())
		// A member whose fence answer came after its promotion had decided
		// was never counted, so that promotion did not record its
		// incarnation: record it now, or the member stays "any disk" (a
		// wipe of it undetected) until the range's next promotion, which
		// may be months away.
		if r.GetIncarnation() == "" && fenced.GetIncarnation() != "" {
			p.recordIncarnation(ctx, rangeID, 0, r.GetId(), fenced.GetIncarnation())
		}
	}()
}

// leaseLive reports whether rangeID's lease at epoch is live and held by a
// member (its leader). Errors count as not live: the probe already failed.
func (p *Promoter) leaseLive(ctx context.Context, rangeID string, epoch uint64) bool {
	cctx, cancel := context.WithTimeout(ctx, p.cfg.RPCTimeout)
	defer cancel()
	resp, err := p.lease.GetLease(cctx, connect.NewRequest(&tenurev1.GetLeaseRequest{RangeId: rangeID}))
	if err != nil {
		return false
	}
	l := resp.Msg.GetLease()
	// A lease still held by this promoter's own session (the bind to the
	// new leader has not happened or failed) says nothing about the leader;
	// it is not evidence of death either, so misses alone do not promote
	// then (a refused connection still does, and the refresh loop retries
	// the bind).
	return l.GetLive() && l.GetEpoch() == epoch
}

// stateNotServing is a range's promotion state while its leader leads at
// the range's epoch but reports its lease not valid: it refuses appends and
// reads, so the range is not "healthy" (issue 31: a range called healthy
// for minutes while its leader refused everything).
const stateNotServing = "not-serving"

// notServing is what the probes saw of a leader that does not serve.
type notServing struct {
	// epoch and leader are the range's when it was first seen: a new
	// epoch or leader starts the count again.
	epoch  uint64
	leader string
	// since is when a probe first saw it not serving (when that probe was
	// sent); rebound is when its lease was bound to it again, zero before.
	since, rebound time.Time
}

// serveAction is what observeServing asks for.
type serveAction int

const (
	serveWait serveAction = iota
	serveRebind
	servePromote
)

// notServingAfter is how long a leader at the range's epoch may report its
// lease not valid before the promoter acts: one session TTL. A leader whose
// lease is fine is invalid only for moments: after its adoption, until its
// keeper has seen the bind (a renewal, a third of a TTL), and after a
// renewal that failed, until the next one succeeds (another third). A whole
// TTL is three renewal intervals; a leader still not serving then will not
// by itself. A lease that really ran out expires, and the expiry promotes
// at once without waiting for this. The promoter's own TTL stands for the
// replicas': it is configured alike (default 5 s here, 2 s for replicas).
func (p *Promoter) notServingAfter() time.Duration { return p.cfg.SessionTTL }

// observeServing records whether the leader serves (its lease valid), as a
// full status probe sent at `at` saw it, and says what to do about a leader
// that does not: wait out the first bound; then bind its lease to it again
// (cheap: one etcd transaction, no epoch), which makes a keeper that lost
// track of the lease, or a lease left on a session other than its own,
// valid again at its next renewal; and if it still does not serve a bound
// after the rebind, promote (costs an epoch and a fence round, and fixes
// whatever else keeps it from serving, since adoption starts its lease
// afresh). The range's state is not-serving meanwhile. p.mu is held.
func (rs *rangeState) observeServing(serving bool, at time.Time, bound time.Duration) serveAction {
	ns := &rs.notServing
	if serving {
		*ns = notServing{}
		if rs.state == stateNotServing {
			rs.state = "healthy"
		}
		return serveWait
	}
	if ns.since.IsZero() || ns.epoch != rs.epoch || ns.leader != rs.leaderID {
		*ns = notServing{epoch: rs.epoch, leader: rs.leaderID, since: at}
	}
	// Only a healthy range becomes not-serving: a promotion running, or
	// failing and retrying, says more.
	if rs.state == "healthy" {
		rs.state = stateNotServing
	}
	switch {
	case at.Sub(ns.since) < bound:
		return serveWait
	case ns.rebound.IsZero():
		ns.rebound = at
		return serveRebind
	case at.Sub(ns.rebound) >= bound:
		return servePromote
	}
	return serveWait
}
