// Package chaos breaks a whole in-process tenure on purpose and checks what
// survives. One run (RunOne) starts embedded etcd, the lease service, three
// (or five) replicas and two promoters, runs the workload (package
// workload) against one range, injects faults of one kind at seeded times
// and targets, heals, requires a final append to succeed, stops everything,
// reads every replica's log from its store, and judges the run with package
// check: acknowledged records lost, duplicates, inconsistent offsets,
// divergent committed prefixes, HWM regressions, stale-epoch acceptances,
// truncations of acknowledged records, and linearizability (porcupine).
//
// Fault kinds (Kinds):
//
//	kill       the leader loses power (journals and WAL keep what was synced) and restarts
//	pause      the leader stops handling anything past its lease, then resumes (the zombie)
//	partition  the leader is cut from replicas, lease service and promoters; clients may still reach it
//	flaky      every link drops and delays requests for a while; meanwhile an operator asks for a handover
//	majority   a majority of replicas crash together and restart one after the other
//	promoter   the elected promoter and the leader die together
//	cascade    the leader dies; its successor dies as it comes back, so the
//	           next promotion fences the first one's stale tail and truncates it
//	lease-pause     the lease service handles nothing for a while around the
//	                replica lease TTL (the first episode 1.1-2.5 x TTL, where
//	                issue 31's wedge was found), then resumes
//	lease-kill      the lease service dies and restarts on its address
//	etcd-pause      one of three etcd members (the raft leader half the time)
//	                is cut from its peers and its clients' bytes are held
//	etcd-partition  one of three etcd members is cut from its peers (its
//	                clients still reach it), healed; then two are, so no
//	                side has a quorum
//	reconfigure     a random voter is replaced by a new replica (r4, r5, ...)
//	                through the elected promoter's ChangeReplicas, and the
//	                leader is killed or paused at a random step of it
//	wipe            a third member is cut from the other replicas (it lags),
//	                a replica loses its data directory and restarts empty
//	                under its id (a new incarnation), then the leader dies:
//	                the lagging and the wiped one must not lead (issue 24's
//	                hole); once healed the wiped one is removed and added again
//	retention       the range keeps only retentionPolicy's few KiB (its
//	                leader applies it every retentionInterval), so its log
//	                start advances many times a run; each episode is one of
//	                retentionFaults, chosen by the seed: followers fall
//	                below the leader's log start and reset to it, and
//	                promotions happen across trimmed logs. The checkers
//	                take what is below a reported log start as deleted on
//	                purpose (check.Report.Trimmed) and everything above it
//	                as owed
//
// After each episode heals, the liveness checker (checkLiveness) requires
// the range to serve an acknowledged append and a read, and the elected
// promoter's view to agree with the replicas', within livenessBound; a
// range that does not is stuck, and a stuck run fails whatever its safety
// columns say.
//
// Limits, on purpose: faults are in the HTTP traffic between nodes and at
// their servers (Network), and in etcd's raft traffic and client port for
// the etcd kinds only (etcdCluster); a paused node's timers keep
// running. A crash is a power loss: journals keep only their fsynced bytes
// (journaltest.MemFS), and the log store (replica.Crash,
// logstore.Store.PowerLoss) keeps only what its WAL fdatasynced, with
// Badger's copies of everything since the last WAL checkpoint dropped, so
// every restart recovers through the WAL's replay. Badger's own files are
// otherwise left as the process left them.
package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/tenurelog/tenure/internal/chaos/check"
	"github.com/tenurelog/tenure/internal/chaos/workload"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// Kind is a fault kind.
type Kind string

// Kinds are every fault kind, in the scoreboard's order.
var Kinds = []Kind{"kill", "pause", "partition", "flaky", "majority", "promoter", "cascade",
	"lease-pause", "lease-kill", "etcd-pause", "etcd-partition", "reconfigure", "wipe", "retention"}

// The retention kind's range keeps at most retentionPolicy's bytes of
// batches: a small record's batch takes some tens of bytes, so with a few
// hundred appends a run the log start moves every retention pass once
// the first few KiB are written. The leaders apply it every
// retentionInterval (the replica's default, 30 s, would never run in a
// run of a few seconds).
var retentionPolicy = &tenurev1.RetentionPolicy{MaxBytes: 4 << 10}

const retentionInterval = 100 * time.Millisecond

// retentionFaults are the faults a retention run's episodes choose from:
// each leaves a replica behind the others (killed, cut off, or the first
// of a cascade) while the leader keeps trimming, so it comes back below
// the leader's log start, and each promotes a new leader over trimmed
// logs.
var retentionFaults = []Kind{"kill", "partition", "majority", "cascade"}

// etcdMembers is how many etcd members a run of kind needs: three for the
// etcd kinds, which fault one member or a majority, else one (cheaper).
func etcdMembers(kind Kind) int {
	if kind == "etcd-pause" || kind == "etcd-partition" {
		return 3
	}
	return 1
}

// RunConfig configures one run.
type RunConfig struct {
	Seed     int64
	Kind     Kind
	Replicas int // 3 (default) or 5
	// Episodes is how many faults are injected one after another (default:
	// 1 or 2, chosen by the seed).
	Episodes int
}

const rangeID = "chaos"

// RunOne runs one seeded chaos run and returns what it observed. The caller
// checks it (check.Check).
func RunOne(t testing.TB, rc RunConfig) check.Run {
	t.Helper()
	if rc.Replicas == 0 {
		rc.Replicas = 3
	}
	rng := rand.New(rand.NewPCG(uint64(rc.Seed), uint64(len(rc.Kind))))
	if rc.Episodes == 0 {
		rc.Episodes = 1 + rng.IntN(2)
	}
	if rc.Kind == "etcd-partition" {
		// One episode is two faults already (a member, then a majority).
		rc.Episodes = 1
	}
	var retention *tenurev1.RetentionPolicy
	var interval time.Duration
	if rc.Kind == "retention" {
		retention, interval = retentionPolicy, retentionInterval
	}
	run := check.Run{Seed: rc.Seed, Faults: map[string]int{}}
	c := startCluster(t, uint64(rc.Seed), rc.Replicas, 2, etcdMembers(rc.Kind), interval)
	c.createRange(rangeID, retention)
	if c.waitLeader(rangeID, 20*time.Second) == nil {
		t.Fatalf("seed %d: no first leader within 20s", rc.Seed)
	}

	c.addSpares(rc.Kind, rc.Episodes)

	hist := &check.History{}
	urls := map[string]string{}
	for _, rn := range c.replicas {
		urls[rn.id] = "http://" + rn.listen
	}
	// Appends give up after 750 ms, well under the 2 s lease: a client
	// stuck on an isolated leader moves to the new one while the old one
	// may still answer the sticky reader, which is the window in which a
	// deposed leader's stale read shows up.
	w, err := workload.New(workload.Config{Range: rangeID, Replicas: urls, HTTP: c.net.Client("client"), History: hist,
		Prefix: fmt.Sprintf("s%d", rc.Seed), Seed: uint64(rc.Seed), OpTimeout: 750 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stopLoad := context.WithCancel(context.Background())
	loadDone := make(chan struct{})
	go func() { w.Run(wctx); close(loadDone) }()
	defer func() { stopLoad(); <-loadDone }()

	var hwms []check.HWMSample
	sctx, stopSampling := context.WithCancel(context.Background())
	sampleDone := make(chan struct{})
	go func() { hwms = c.sampleHWMs(sctx, rangeID); close(sampleDone) }()
	defer func() { stopSampling(); <-sampleDone }()

	// Traffic before the first fault.
	waitUntil(15*time.Second, func() bool { return w.OK() >= 20 })
	run.TrafficBefore = w.OK()
	if retention != nil {
		// The faults are to hit a trimmed log: wait (bounded) for the
		// first retention pass that removes something. A run where it
		// never does fails TestChaos's proof that retention ran.
		waitUntil(15*time.Second, func() bool { return c.logStart(rangeID) > 0 })
	}

	for ep := 0; ep < rc.Episodes; ep++ {
		okBefore := w.OK()
		c.inject(rc.Kind, ep, rng)
		run.Faults[string(rc.Kind)]++
		// Traffic during a fault is what succeeded between breaking and
		// healing; the run's figure is the least of its episodes, so every
		// fault must have seen some.
		during := w.OK() - okBefore
		if ep == 0 || during < run.TrafficDuring {
			run.TrafficDuring = during
		}
		// Healed: the range must serve again and the promoter agree,
		// within the liveness bound, after every episode (a range wedged
		// by one episode and freed by the next is still a wedge). The
		// last episode's liveness append is the run's final append.
		live := c.checkLiveness(w, time.Now())
		if rc.Episodes > 1 && live.Stuck() {
			live.Detail = fmt.Sprintf("after episode %d of %d: %s", ep+1, rc.Episodes, live.Detail)
		}
		t.Logf("seed %d kind %s: episode %d: %s", rc.Seed, rc.Kind, ep+1, live)
		run.Liveness = append(run.Liveness, live)
		run.FinalAppendOK = live.Appended
		if ep < rc.Episodes-1 {
			// Settle: traffic goes on before the next fault.
			time.Sleep(time.Second)
		}
	}
	stopLoad()
	<-loadDone
	stopSampling()
	<-sampleDone

	run.History = hist.Ops()
	run.Epochs, run.Truncations = c.obs.results()
	run.Final = c.markVoters(c.finalLogs(rangeID))
	run.HWMs = hwms
	return run
}

// inject runs fault episode ep of kind: break, hold, heal. It returns once
// healed.
func (c *Cluster) inject(kind Kind, ep int, rng *rand.Rand) {
	target := c.waitLeader(rangeID, 10*time.Second)
	if target == nil {
		target = c.replicas[rng.IntN(len(c.replicas))]
	}
	hold := func(lo, hi time.Duration) { time.Sleep(lo + time.Duration(rng.Int64N(int64(hi-lo)))) }
	restart, kill := c.startReplica, c.killReplica
	switch kind {
	case "kill":
		kill(target)
		hold(300*time.Millisecond, 2*time.Second)
		restart(target)
	case "pause":
		// Past the lease: the promoter may only act once it expired.
		c.net.Pause(target.id)
		hold(sessionTTL+time.Second, sessionTTL+2500*time.Millisecond)
		c.net.Resume(target.id)
	case "partition":
		others := c.nodes()
		if rng.IntN(2) == 0 {
			others = append(others, "client")
		}
		c.net.Isolate(target.id, others)
		hold(sessionTTL+time.Second, sessionTTL+2500*time.Millisecond)
		c.net.Heal()
	case "flaky":
		c.net.Flaky(0.05+0.25*rng.Float64(), time.Duration(rng.Int64N(int64(60*time.Millisecond))))
		hold(time.Second, 2*time.Second)
		// Lost requests alone no longer depose a leader that renews its
		// lease (a lost probe is a miss), so promote on purpose: an
		// operator's handover over the flaky links has every promotion
		// step (grant, fence, truncate, adopt, bind) lose requests and
		// answers, and retries of it race the range's own recovery.
		c.handover("chaos: planned handover over flaky links")
		hold(time.Second, 2*time.Second)
		c.net.Heal()
	case "majority":
		// A majority (two of three, three of five), the leader among them
		// half the time.
		victims := []*replicaNode{}
		for _, rn := range rng.Perm(len(c.replicas)) {
			victims = append(victims, c.replicas[rn])
		}
		victims = victims[:len(c.replicas)/2+1]
		if rng.IntN(2) == 0 && !slices.Contains(victims, target) {
			victims[0] = target
		}
		for _, v := range victims {
			kill(v)
		}
		hold(300*time.Millisecond, 1500*time.Millisecond)
		// Rolling restart: after the first one a quorum is back and the
		// range must recover while the rest are still down.
		for _, v := range victims {
			restart(v)
			hold(time.Second, 2*time.Second)
		}
	case "promoter":
		// The elected promoter's process and the leader die together; the
		// other promoter must win the election and promote.
		p := c.promoters[0]
		for _, q := range c.promoters {
			if q.p.Elected() {
				p = q
			}
		}
		p.stop()
		kill(target)
		hold(500*time.Millisecond, 2*time.Second)
		restart(target)
		c.promoters = slices.DeleteFunc(c.promoters, func(q *promoterNode) bool { return q == p })
		c.startPromoter(p.id)
	case "cascade":
		// The first leader dies holding an uncommitted tail; once a
		// successor leads, it dies too and the first comes back: the next
		// promotion fences the first with its old-epoch tail, which a
		// later epoch overwrote, and must truncate it, never an
		// acknowledged record.
		kill(target)
		next := c.waitLeader(rangeID, 10*time.Second)
		hold(100*time.Millisecond, 600*time.Millisecond)
		if next != nil && next != target {
			kill(next)
		}
		restart(target)
		hold(time.Second, 2*time.Second)
		if next != nil && next != target {
			restart(next)
		}
	case "lease-pause":
		// Issue 31's wedge came from outages of 1.1-2.5 x TTL (a leader's
		// renewal fails, the promoter re-adopts it, and its keeper then
		// drops the session the new bind lands on): the first episode
		// holds in that window, later ones anywhere from half a TTL to
		// three and a half.
		c.net.Pause("lease")
		if ep == 0 {
			hold(sessionTTL*11/10, sessionTTL*5/2)
		} else {
			hold(sessionTTL/2, sessionTTL*7/2)
		}
		c.net.Resume("lease")
	case "lease-kill":
		// Streams drop at once (the promoters' lease watches, keep-alives
		// in flight); renewals are refused until it is back.
		c.killLease()
		// From half a TTL (leases outlive it: traffic goes on) to past
		// the wedge window's end.
		hold(sessionTTL/2, sessionTTL*5/2)
		c.startLease()
	case "etcd-pause":
		m := c.etcdVictim(rng)
		c.etcd.Pause(m)
		hold(sessionTTL, sessionTTL*5/2)
		c.etcd.Heal()
	case "etcd-partition":
		// One member alone: a minority, whose clients' quorum calls fail
		// there until they move on.
		m := c.etcdVictim(rng)
		c.etcd.Isolate(m)
		hold(sessionTTL, sessionTTL*5/2)
		c.etcd.Heal()
		time.Sleep(time.Second)
		// Then a majority: two members cut from every other, so no side
		// holds a quorum: nothing in etcd changes (no renewal, no grant,
		// no expiry) until healed.
		for _, i := range rng.Perm(len(c.etcd.members))[:len(c.etcd.members)/2+1] {
			c.etcd.Isolate(c.etcd.members[i])
		}
		hold(sessionTTL/2, sessionTTL*3/2)
		c.etcd.Heal()
	case "reconfigure":
		c.reconfigure(ep, rng)
	case "wipe":
		c.wipe(rng)
	case "retention":
		f := retentionFaults[rng.IntN(len(retentionFaults))]
		c.t.Logf("retention: episode %d is a %s fault, log start %d", ep+1, f, c.logStart(rangeID))
		c.inject(f, ep, rng)
	default:
		c.t.Fatalf("unknown fault kind %q", kind)
	}
}

// etcdVictim picks the etcd member to fault: the raft leader half the
// time (clients and followers lose it, an election follows), else a
// follower.
func (c *Cluster) etcdVictim(rng *rand.Rand) *etcdMember {
	ms := c.etcd.members
	l := c.etcd.leader()
	if l != nil && rng.IntN(2) == 0 {
		return l
	}
	var followers []*etcdMember
	for _, m := range ms {
		if m != l {
			followers = append(followers, m)
		}
	}
	return followers[rng.IntN(len(followers))]
}

func waitUntil(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}
