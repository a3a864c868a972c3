package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/internal/chaos/check"
	"github.com/tenurelog/tenure/pkg/journal/journaltest"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// The membership kinds (issue 24): reconfigure replaces a voter through the
// elected promoter's ChangeReplicas while the leader is killed or paused at
// a random step of the change; wipe loses a replica's whole data directory
// (a replaced disk, a new incarnation under the old id), kills the leader,
// and once healed removes and re-adds the wiped replica.

// changeTimeout bounds one ChangeReplicas call (its catch-up included).
const changeTimeout = 30 * time.Second

// changeAttempts bounds the re-runs of a change that a fault stopped: a
// re-run resumes the step in flight or goes on from where it stands.
const changeAttempts = 8

// addSpares starts the replicas a run of kind will add: one per episode for
// reconfigure (r4, r5, ...), none for the others. They run before the
// workload and the samplers start, so both know them from the beginning,
// as an operator's new machine is up before it joins; until then they host
// nothing.
func (c *Cluster) addSpares(kind Kind, episodes int) {
	if kind != "reconfigure" {
		return
	}
	n := len(c.replicas)
	for i := 1; i <= episodes; i++ {
		rn := &replicaNode{id: fmt.Sprintf("r%d", n+i), dir: c.t.TempDir(), jfs: journaltest.NewMemFS()}
		c.replicas = append(c.replicas, rn)
		c.spares = append(c.spares, rn)
		c.startReplica(rn)
	}
}

// getRange reads the range's membership from the lease service (around the
// Network); nil when it does not answer.
func (c *Cluster) getRange() *tenurev1.RangeInfo {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := c.leaseCli.GetRange(ctx, connect.NewRequest(&tenurev1.GetRangeRequest{RangeId: rangeID}))
	if err != nil {
		return nil
	}
	return resp.Msg.GetRange()
}

// voters are the range's voters in effect: the set the current leader
// counts. A step in flight takes effect only with a promotion above the
// epoch it was made at; until then the leader counts the voters before it.
func voters(rng *tenurev1.RangeInfo) []string {
	members := rng.GetReplicas()
	if ch := rng.GetChange(); ch != nil && rng.GetEpoch() <= ch.GetEpoch() {
		members = ch.GetOldReplicas()
	}
	var out []string
	for _, r := range members {
		if !r.GetLearner() {
			out = append(out, r.GetId())
		}
	}
	return out
}

// markVoters flags every final log of a replica that is not a voter in
// effect at the end (removed, a spare never added, a learner), for the
// checkers' majority (check.ReplicaLog.NotVoter). When the lease service
// does not answer, every log counts as a voter's, as before membership
// changed in runs.
func (c *Cluster) markVoters(logs []check.ReplicaLog) []check.ReplicaLog {
	rng := c.getRange()
	if rng == nil {
		c.t.Logf("final membership unknown (the lease service does not answer): every replica judged as a voter")
		return logs
	}
	vs := voters(rng)
	var others []string
	for i := range logs {
		logs[i].NotVoter = !slices.Contains(vs, logs[i].Replica)
		if logs[i].NotVoter {
			others = append(others, fmt.Sprintf("%s (log [%d,%d), hwm %d)", logs[i].Replica, logs[i].LogStart, logs[i].LogEnd, logs[i].HWM))
		}
	}
	if len(others) > 0 {
		c.t.Logf("final voters %v; judged as no voter: %v", vs, others)
	}
	return logs
}

// elected is the elected promoter, or nil.
func (c *Cluster) elected() *promoterNode {
	for _, q := range c.promoters {
		if q.p.Elected() {
			return q
		}
	}
	return nil
}

// changeReplicas runs one ChangeReplicas on the elected promoter, as
// tenurectl does, calling phase with each phase it reports.
func (c *Cluster) changeReplicas(req *tenurev1.ChangeReplicasRequest, phase func(*tenurev1.ChangeReplicasResponse)) error {
	q := c.elected()
	if q == nil {
		return fmt.Errorf("no elected promoter")
	}
	ctx, cancel := context.WithTimeout(context.Background(), changeTimeout)
	defer cancel()
	return q.p.ChangeReplicas(ctx, req, func(m *tenurev1.ChangeReplicasResponse) error {
		c.log.Info("chaos: membership change", "phase", m.GetPhase(), "detail", m.GetDetail())
		if phase != nil {
			phase(m)
		}
		return nil
	})
}

// changeUntil re-runs req until done says the membership is what it asked
// for (a fault may stop a run between steps, and a re-run refuses while the
// leader's epoch-start record is not committed yet), bounded. It reports
// whether the change took effect.
func (c *Cluster) changeUntil(req *tenurev1.ChangeReplicasRequest, done func(*tenurev1.RangeInfo) bool, phase func(*tenurev1.ChangeReplicasResponse)) bool {
	for attempt := 1; attempt <= changeAttempts; attempt++ {
		if rng := c.getRange(); rng != nil && rng.GetChange() == nil && done(rng) {
			return true
		}
		err := c.changeReplicas(req, phase)
		if err == nil {
			return true
		}
		c.t.Logf("chaos: membership change %v, attempt %d: %v", req, attempt, err)
		// The range may be promoting after the fault: wait for a leader.
		c.waitLeader(rangeID, 10*time.Second)
		if rng := c.getRange(); rng.GetChange() != nil && rng.GetEpoch() <= rng.GetChange().GetEpoch() {
			// A step whose promotion failed stays in flight and takes
			// effect with the next successful promotion; a re-run of an
			// add whose promote-learner step is in flight is refused
			// ("already a voter") rather than resumed, and with a healthy
			// leader no promotion comes by itself. So, as an operator
			// would, ask for one; the promoter then completes the step.
			c.handover("chaos: put the membership step in flight into effect")
		}
		time.Sleep(time.Duration(attempt) * 300 * time.Millisecond)
	}
	rng := c.getRange()
	return rng != nil && rng.GetChange() == nil && done(rng)
}

// reconfigure replaces a random voter by the next spare while the clients
// load the range, and kills or pauses the leader at a random phase of the
// change (the learner added, caught up, made a voter, the old one removed).
// The change is re-run until it took effect.
func (c *Cluster) reconfigure(ep int, rng *rand.Rand) {
	start := c.getRange()
	if start == nil {
		c.t.Fatalf("reconfigure: the lease service does not answer")
	}
	vs := voters(start)
	old := vs[rng.IntN(len(vs))]
	spare := c.spares[ep]
	phases := []string{"add-learner", "catch-up", "promote-learner", "remove"}
	at := phases[rng.IntN(len(phases))]
	pause := rng.IntN(2) == 0
	// Drawn here: the fault runs beside the change, rng is not shared.
	pauseFor := sessionTTL + time.Second + time.Duration(rng.Int64N(int64(1500*time.Millisecond)))
	downFor := 300*time.Millisecond + time.Duration(rng.Int64N(int64(1700*time.Millisecond)))
	c.t.Logf("reconfigure: replace %s by %s, %s the leader at %s", old, spare.id, map[bool]string{true: "pause", false: "kill"}[pause], at)

	fault := make(chan struct{})
	faulted := make(chan struct{})
	go func() {
		defer close(faulted)
		if _, ok := <-fault; !ok {
			return
		}
		leader := c.leader(rangeID)
		if leader == nil {
			c.t.Logf("reconfigure: no leader to fault at %s", at)
			return
		}
		if pause {
			c.net.Pause(leader.id)
			time.Sleep(pauseFor)
			c.net.Resume(leader.id)
			return
		}
		c.killReplica(leader)
		time.Sleep(downFor)
		c.startReplica(leader)
	}()
	fired := false
	fire := func() {
		if !fired {
			fired = true
			fault <- struct{}{}
		}
	}
	req := &tenurev1.ChangeReplicasRequest{RangeId: rangeID, Add: &tenurev1.Replica{Id: spare.id, Address: "http://" + spare.listen},
		RemoveReplicaId: old, CatchUpLag: 16, CatchUpTimeoutMs: 20_000}
	done := func(r *tenurev1.RangeInfo) bool {
		vs := voters(r)
		return slices.Contains(vs, spare.id) && !slices.Contains(vs, old) && member(r, old) == nil
	}
	ok := c.changeUntil(req, done, func(m *tenurev1.ChangeReplicasResponse) {
		if m.GetPhase() == at {
			fire()
		}
	})
	// A change that never reached the phase (it failed before) still
	// gets its fault, so every episode has one.
	fire()
	close(fault)
	<-faulted
	if !ok {
		// The fault may have stopped the last attempt: once healed, the
		// change must go through.
		ok = c.changeUntil(req, done, nil)
	}
	if !ok {
		c.t.Errorf("reconfigure: replacing %s by %s did not take effect within %d attempts (membership %v)", old, spare.id, changeAttempts, c.getRange())
	}
}

// wipe: a third member lags, a replica (the leader half the time) loses
// its whole data directory and journals and restarts empty under its id and
// address (a new incarnation); the leader then loses power and restarts.
// The wiped replica must not count (the promoter and the replica refuse
// it), so the range waits for the leader rather than lose what the lagging
// one lacks. Once healed the wiped replica is removed and added again.
func (c *Cluster) wipe(rng *rand.Rand) {
	// Only a member whose incarnation is recorded is (id, incarnation): one
	// without counts on its first answer, as a new range's members do
	// (design notes, Membership), so wiping it would test nothing. A
	// promotion records those whose fence answers counted; one that
	// answered late is recorded by the next, which a handover makes.
	recorded := func() []string {
		r := c.getRange()
		var out []string
		for _, id := range voters(r) {
			if m := member(r, id); m != nil && m.GetIncarnation() != "" {
				out = append(out, id)
			}
		}
		return out
	}
	var candidates []string
	for attempt := 0; attempt < 3; attempt++ {
		if waitUntil(3*time.Second, func() bool { candidates = recorded(); return len(candidates) == len(voters(c.getRange())) }) {
			break
		}
		c.handover("chaos: a promotion records the members' incarnations")
	}
	if len(candidates) == 0 {
		c.t.Fatalf("wipe: no member's incarnation is recorded (membership %v)", c.getRange())
	}
	// The leader half the time (its successor is then the leader that
	// dies), else another member.
	victim := c.replica(candidates[rng.IntN(len(candidates))])
	if l := c.leader(rangeID); l != nil && slices.Contains(candidates, l.id) {
		others := slices.DeleteFunc(slices.Clone(candidates), func(id string) bool { return id == l.id })
		if rng.IntN(2) == 0 || len(others) == 0 {
			victim = l
		} else {
			victim = c.replica(others[rng.IntN(len(others))])
		}
	}
	leader := c.leader(rangeID)
	// A third member lags: cut from every other replica (not from the
	// promoters), it fetches nothing, so the records acknowledged from now
	// on are held by the leader and one other member only, the victim or
	// (when the victim leads) the successor. That is issue 24's hole:
	// counting the wiped disk's empty log as a complete one would let the
	// lagging member lead without them.
	var lagger *replicaNode
	var others []*replicaNode
	for _, id := range voters(c.getRange()) {
		if rn := c.replica(id); rn != victim && rn != leader {
			others = append(others, rn)
		}
	}
	if len(others) > 0 {
		lagger = others[rng.IntN(len(others))]
		var peers []string
		for _, rn := range c.replicas {
			peers = append(peers, rn.id)
		}
		c.net.Isolate(lagger.id, peers)
		time.Sleep(300*time.Millisecond + time.Duration(rng.Int64N(int64(500*time.Millisecond))))
	}
	lagging := "none"
	if lagger != nil {
		lagging = lagger.id
	}
	c.t.Logf("wipe: %s loses its data directory (the leader: %t); lagging: %s", victim.id, victim == leader, lagging)
	c.killReplica(victim)
	if err := os.RemoveAll(victim.dir); err != nil {
		c.t.Fatal(err)
	}
	if err := os.MkdirAll(victim.dir, 0o755); err != nil {
		c.t.Fatal(err)
	}
	victim.jfs = journaltest.NewMemFS()
	c.startReplica(victim)

	// The leader dies: if the victim led, its successor (elected from the
	// two members left, the lagger fenced but still cut) does. Then the
	// lagger and the wiped replica are the only members up: the range must
	// wait for the dead leader rather than count the wiped one.
	if leader == victim {
		leader = c.waitLeader(rangeID, 10*time.Second)
	}
	if leader != nil && leader != victim {
		c.t.Logf("wipe: the leader %s loses power", leader.id)
		c.killReplica(leader)
		c.net.Heal()
		time.Sleep(300*time.Millisecond + time.Duration(rng.Int64N(int64(1700*time.Millisecond))))
		c.startReplica(leader)
	}
	c.net.Heal()
	if c.waitLeader(rangeID, livenessBound) == nil {
		c.t.Logf("wipe: no leader after the restart")
	}

	// Remove, then add again under the same id and address: only a re-add
	// records the new incarnation as the member.
	if !c.changeUntil(&tenurev1.ChangeReplicasRequest{RangeId: rangeID, RemoveReplicaId: victim.id},
		func(r *tenurev1.RangeInfo) bool { return member(r, victim.id) == nil }, nil) {
		c.t.Errorf("wipe: removing the wiped %s did not take effect (membership %v)", victim.id, c.getRange())
		return
	}
	add := &tenurev1.Replica{Id: victim.id, Address: "http://" + victim.listen}
	if !c.changeUntil(&tenurev1.ChangeReplicasRequest{RangeId: rangeID, Add: add, CatchUpLag: 16, CatchUpTimeoutMs: 20_000},
		func(r *tenurev1.RangeInfo) bool { return slices.Contains(voters(r), victim.id) }, nil) {
		c.t.Errorf("wipe: adding the wiped %s again did not take effect (membership %v)", victim.id, c.getRange())
	}
}

// member returns rng's member id, or nil.
func member(rng *tenurev1.RangeInfo, id string) *tenurev1.Replica {
	for _, r := range rng.GetReplicas() {
		if r.GetId() == id {
			return r
		}
	}
	return nil
}
