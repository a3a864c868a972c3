package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/internal/chaos/check"
	"github.com/tenurelog/tenure/internal/chaos/workload"
	"github.com/tenurelog/tenure/pkg/leaseclient"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// allScenarios is the default order. Each names one fault kind.
var allScenarios = []string{"kill-leader", "pause-leader", "disconnect-leader", "restart-majority", "corrupt-journal", "pause-lease", "replace-replica", "kill-lease", "kill-etcd-member", "disk-full"}

var scenarioFuncs = map[string]func(*scenario, context.Context) error{
	"kill-leader":       (*scenario).killLeader,
	"pause-leader":      (*scenario).pauseLeader,
	"disconnect-leader": (*scenario).disconnectLeader,
	"restart-majority":  (*scenario).restartMajority,
	"corrupt-journal":   (*scenario).corruptJournal,
	"pause-lease":       (*scenario).pauseLease,
	"replace-replica":   (*scenario).replaceReplica,
	"kill-lease":        (*scenario).killLease,
	"kill-etcd-member":  (*scenario).killEtcdMember,
	"disk-full":         (*scenario).diskFull,
}

// Bounds of the scenario's waits.
const (
	leaderWait   = 60 * time.Second // a range's first leader, or a promotion
	rejoinWait   = 90 * time.Second // a faulted replica following again
	warmup       = 3 * time.Second  // traffic before the fault, at least
	warmupWait   = 30 * time.Second
	afterHeal    = 3 * time.Second // traffic after the rejoin, before the final append
	finalWithin  = 30 * time.Second
	convergeWait = 60 * time.Second
)

type scenario struct {
	cfg         config
	name        string
	stack       *stack
	rangeID     string
	seed        int64
	rng         *rand.Rand
	incarnation map[string]int // shared across scenarios: kills so far per replica

	// replicas has a client of every replica container (allReplicaIDs),
	// members or not.
	replicas map[string]tenurev1connect.ReplicaServiceClient
	// members are the range's members now: replicaIDs at creation, changed
	// by a membership change (replace-replica). Convergence, rejoining and
	// the final logs are judged over them; a removed replica dropped its
	// copy of the range and is no member whose log must agree.
	members []string
	obs     *observer
	// hist is the workload's history: a scenario that must keep serving
	// through its fault counts the appends acknowledged meanwhile.
	hist   *check.History
	faults map[string]int

	expectFailed []string
	unattributed int
	// healed is when the scenario last undid its fault (started, unpaused
	// or reconnected a container): the liveness bound counts from it.
	healed time.Time
}

func (sc *scenario) expect(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	sc.expectFailed = append(sc.expectFailed, msg)
	logf("%s: EXPECTATION FAILED: %s", sc.name, msg)
}

// run runs the scenario and returns what it observed. An error means the
// scenario could not be carried out (a docker call failed, the range never
// got a leader); the Run returned with it, if any, is still judged.
func (sc *scenario) run(ctx context.Context) (*check.Run, error) {
	sc.replicas = newReplicaClients(sc.stack)
	sc.members = append([]string(nil), replicaIDs...)
	sc.faults = map[string]int{}
	if err := sc.createRange(ctx); err != nil {
		return nil, err
	}
	if _, err := sc.waitLeader(ctx, 0, ""); err != nil {
		return nil, err
	}
	// Every member follows before the fault, not only a quorum: a member
	// the promoter could not reach when the range was created (the stack's
	// DNS may not resolve a container for seconds after the previous
	// scenario restarted it) missed the first fence and hosts nothing
	// until the promoter reconciles it. A fault aimed at it before then
	// tests a half-made range, and a planned handover to it is refused,
	// rightly ("does not host the range"): CI's disk-full run of seed
	// 56175925 failed so.
	joining := time.Now()
	if err := sc.waitRejoined(ctx, sc.members...); err != nil {
		return nil, fmt.Errorf("the new range's members never all followed: %w", err)
	}
	logf("%s: %v all follow, %v after the leader", sc.name, sc.members, time.Since(joining).Round(time.Millisecond))

	hist := &check.History{}
	sc.hist = hist
	// Every replica, the spare too: after a membership change the leader
	// may be one the range was not created on.
	urls := map[string]string{}
	for _, id := range allReplicaIDs {
		urls[id] = replicaURL(id)
	}
	w, err := workload.New(workload.Config{
		Range: sc.rangeID, HTTP: sc.stack.httpClient(), History: hist, Replicas: urls,
		Prefix: fmt.Sprintf("s%d", sc.seed), Clients: sc.cfg.clients, Pace: sc.cfg.pace, Seed: uint64(sc.seed),
	})
	if err != nil {
		return nil, err
	}
	sc.obs = newObserver(sc.rangeID, sc.replicas, sc.incarnation)
	obsCtx, stopObs := context.WithCancel(ctx)
	wlCtx, stopWl := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); sc.obs.run(obsCtx, 100*time.Millisecond) }()
	go func() { defer wg.Done(); w.Run(wlCtx) }()
	stopAll := func() { stopWl(); stopObs(); wg.Wait() }

	r := &check.Run{Seed: sc.seed, Faults: sc.faults}
	// Traffic before: at least warmup long and some acknowledged operations.
	warmStart := time.Now()
	for (time.Since(warmStart) < warmup || w.OK() < 20) && time.Since(warmStart) < warmupWait && ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
	}
	r.TrafficBefore = w.OK()
	logf("%s: %d operations ok before the fault", sc.name, r.TrafficBefore)

	faultErr := scenarioFuncs[sc.name](sc, ctx)
	r.TrafficDuring = w.OK() - r.TrafficBefore
	logf("%s: %d operations ok while the fault was active (until the faulted replicas rejoined)", sc.name, r.TrafficDuring)
	if faultErr == nil {
		time.Sleep(afterHeal)
	}
	// Judged whatever the scenario's own waits said: a wedged range is
	// exactly one whose rejoin wait gave up.
	live := sc.checkLiveness(ctx, w, hist)
	logf("%s: liveness: %s", sc.name, live)
	r.Liveness = []check.Liveness{live}
	stopWl()
	if faultErr == nil {
		if err := w.AppendOne(ctx, finalWithin); err != nil {
			logf("%s: final append failed: %v", sc.name, err)
		} else {
			r.FinalAppendOK = true
		}
		sc.waitConverged(ctx)
	}
	stopAll()
	r.History = hist.Ops()

	// The final state, through tenurectl.
	trs, err := transitions(ctx, sc.cfg.tenurectl, sc.stack, sc.rangeID)
	if err != nil {
		return r, errors.Join(faultErr, err)
	}
	for _, t := range trs {
		logf("%s: transition epoch %d: leader %s, reason %q, committed bound %d, %d truncations, %s",
			sc.name, t.GetEpoch(), t.GetLeaderId(), t.GetReason(), t.GetCommittedBound(), len(t.GetTruncations()), (time.Duration(t.GetDurationUs()) * time.Microsecond).Round(time.Millisecond))
	}
	sc.obs.mu.Lock()
	r.HWMs = sc.obs.hwms
	r.Truncations, sc.unattributed = truncationsOf(trs, sc.obs.histories)
	r.Epochs = append(append([]check.EpochEvent(nil), sc.obs.fences...), ackEvents(r.History, trs)...)
	sc.obs.mu.Unlock()
	final, err := sc.finalLogs(ctx)
	r.Final = final
	return r, errors.Join(faultErr, err)
}

func (sc *scenario) createRange(ctx context.Context) error {
	lc := sc.leaseClient()
	req := &tenurev1.CreateRangeRequest{RangeId: sc.rangeID}
	for _, id := range replicaIDs {
		req.Replicas = append(req.Replicas, &tenurev1.Replica{Id: id, Address: replicaURL(id)})
	}
	return retry(ctx, 60*time.Second, "create range "+sc.rangeID, func(ctx context.Context) error {
		_, err := lc.CreateRange(ctx, connect.NewRequest(req))
		if connect.CodeOf(err) == connect.CodeAlreadyExists {
			return nil
		}
		return err
	})
}

// leaseClient is a client of both lease service instances, which fails over
// between them as every tenure process does (pkg/leaseclient): the driver
// reads and creates ranges also while kill-lease has one of them down.
func (sc *scenario) leaseClient() tenurev1connect.LeaseServiceClient {
	lc, err := leaseclient.New(sc.stack.httpClient(), []string{scheme() + "://lease-1:7000", scheme() + "://lease-2:7000"})
	if err != nil {
		panic(err) // two fixed, valid URLs
	}
	return lc
}

// retry calls f until it succeeds or within passes.
func retry(ctx context.Context, within time.Duration, what string, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		err := f(cctx)
		ccancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: gave up after %v: %w", what, within, err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// statuses asks every replica for its status of the range; unreachable
// ones are missing from the map.
func (sc *scenario) statuses(ctx context.Context) map[string]*tenurev1.RangeStatus {
	var mu sync.Mutex
	var wg sync.WaitGroup
	out := map[string]*tenurev1.RangeStatus{}
	for id, c := range sc.replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if st, err := statusOf(ctx, c, sc.rangeID); err == nil {
				mu.Lock()
				out[id] = st
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out
}

// leaderIn is the replica leading at the highest epoch with a live lease.
func leaderIn(sts map[string]*tenurev1.RangeStatus) (string, *tenurev1.RangeStatus) {
	var id string
	var best *tenurev1.RangeStatus
	for rid, st := range sts {
		if st.GetRole() == tenurev1.Role_ROLE_LEADER && st.GetLeaseValid() && st.GetEpoch() == st.GetFencedEpoch() &&
			(best == nil || st.GetEpoch() > best.GetEpoch()) {
			id, best = rid, st
		}
	}
	return id, best
}

// waitLeader waits for a serving leader at an epoch above minEpoch other
// than not, and returns its id.
func (sc *scenario) waitLeader(ctx context.Context, minEpoch uint64, not string) (string, error) {
	var leader string
	err := retry(ctx, leaderWait, fmt.Sprintf("a leader of %s above epoch %d", sc.rangeID, minEpoch), func(ctx context.Context) error {
		id, st := leaderIn(sc.statuses(ctx))
		if st == nil || st.GetEpoch() <= minEpoch || id == not {
			return fmt.Errorf("no leader above epoch %d other than %q yet (best: %q at %d)", minEpoch, not, id, st.GetEpoch())
		}
		leader = id
		return nil
	})
	return leader, err
}

// currentLeader returns the serving leader and its epoch now, waiting for one.
func (sc *scenario) currentLeader(ctx context.Context) (string, uint64, error) {
	id, err := sc.waitLeader(ctx, 0, "")
	if err != nil {
		return "", 0, err
	}
	return id, sc.statuses(ctx)[id].GetEpoch(), nil
}

// waitRejoined waits until every replica in ids acts under the serving
// leader's epoch (leading or following it) and holds the log up to the
// leader's HWM as first seen here: it rejoined and caught up.
func (sc *scenario) waitRejoined(ctx context.Context, ids ...string) error {
	var target uint64
	var haveTarget bool
	return retry(ctx, rejoinWait, fmt.Sprintf("%v rejoining %s", ids, sc.rangeID), func(ctx context.Context) error {
		sts := sc.statuses(ctx)
		lid, l := leaderIn(sts)
		if l == nil {
			return errors.New("no serving leader")
		}
		if !haveTarget {
			target, haveTarget = l.GetHighWaterMark(), true
		}
		for _, id := range ids {
			st := sts[id]
			if st == nil {
				return fmt.Errorf("%s unreachable", id)
			}
			if st.GetEpoch() != l.GetEpoch() || (id != lid && (st.GetRole() != tenurev1.Role_ROLE_FOLLOWER || st.GetLeaderId() != lid)) || st.GetLogEnd() < target {
				return fmt.Errorf("%s: %s at epoch %d following %q, log end %d; leader %s at epoch %d, target %d",
					id, roleOf(st), st.GetEpoch(), st.GetLeaderId(), st.GetLogEnd(), lid, l.GetEpoch(), target)
			}
		}
		return nil
	})
}

func roleOf(st *tenurev1.RangeStatus) string {
	return strings.ToLower(strings.TrimPrefix(st.GetRole().String(), "ROLE_"))
}

// waitConverged waits, with no traffic, until all members hold the same log
// with everything committed: the settled state the final logs are read in.
func (sc *scenario) waitConverged(ctx context.Context) {
	err := retry(ctx, convergeWait, "convergence", func(ctx context.Context) error {
		sts := sc.statuses(ctx)
		for _, id := range sc.members {
			if sts[id] == nil {
				return fmt.Errorf("member %s does not answer for the range", id)
			}
		}
		var desc []string
		same := true
		first := sts[sc.members[0]]
		for _, id := range sc.members {
			st := sts[id]
			desc = append(desc, fmt.Sprintf("%s %s epoch %d end %d hwm %d", id, roleOf(st), st.GetEpoch(), st.GetLogEnd(), st.GetHighWaterMark()))
			same = same && st.GetEpoch() == first.GetEpoch() && st.GetLogEnd() == first.GetLogEnd() && st.GetHighWaterMark() == st.GetLogEnd()
		}
		if !same {
			return errors.New(strings.Join(desc, "; "))
		}
		logf("%s: converged: %s", sc.name, strings.Join(desc, "; "))
		return nil
	})
	if err != nil {
		sc.expect("replicas did not converge: %v", err)
	}
}

// finalLogs stops the members (a clean stop: the store closes, the HWM is
// persisted), copies each one's data directory out, starts them again, and
// reads each copy with tenurectl log dump. A replica removed from the range
// dropped its copy: it has no log of the range to judge.
func (sc *scenario) finalLogs(ctx context.Context) ([]check.ReplicaLog, error) {
	stopping := time.Now()
	if err := sc.eachReplica(ctx, func(ctx context.Context, id string) error {
		_, err := docker(ctx, "stop", "-t", "10", sc.stack.ids[id])
		return err
	}); err != nil {
		return nil, err
	}
	logf("%s: stopped the replicas in %v to copy their data", sc.name, time.Since(stopping).Round(time.Millisecond))
	dir := filepath.Join(sc.cfg.workDir, sc.name)
	copyErr := sc.eachReplica(ctx, func(ctx context.Context, id string) error {
		return sc.stack.copyOut(ctx, id, "/data", filepath.Join(dir, id))
	})
	// Started again whatever happened: later scenarios need them.
	startErr := sc.startReplicas(ctx, sc.members...)
	if err := errors.Join(copyErr, startErr); err != nil {
		return nil, err
	}
	var logs []check.ReplicaLog
	for _, id := range sc.members {
		l, err := finalLog(ctx, sc.cfg.tenurectl, id, filepath.Join(dir, id, "data"), sc.rangeID)
		if err != nil {
			return logs, fmt.Errorf("final log of %s: %w", id, err)
		}
		logf("%s: final log of %s: log start %d, log end %d, HWM %d, fenced epoch %d, epochs %v", sc.name, id, l.LogStart, l.LogEnd, l.HWM, l.FencedEpoch, l.History)
		logs = append(logs, l)
	}
	// The copies are large-ish (Badger preallocates): keep only what a
	// failing run needs to be looked at, which is in the report.
	_ = os.RemoveAll(dir)
	return logs, nil
}

// eachReplica runs f for every member concurrently.
func (sc *scenario) eachReplica(ctx context.Context, f func(context.Context, string) error) error {
	errs := make([]error, len(sc.members))
	var wg sync.WaitGroup
	for i, id := range sc.members {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = f(ctx, id) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// startReplicas starts stopped or killed replicas, re-reads their published
// ports and waits until each answers a status call.
func (sc *scenario) startReplicas(ctx context.Context, ids ...string) error {
	for _, id := range ids {
		if _, err := docker(ctx, "start", sc.stack.ids[id]); err != nil {
			return err
		}
	}
	for _, id := range ids {
		if err := sc.stack.refreshPort(ctx, id, "7100"); err != nil {
			return err
		}
		c := sc.replicas[id]
		if err := retry(ctx, 60*time.Second, id+" answering", func(ctx context.Context) error {
			_, err := c.GetStatus(ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{}))
			return err
		}); err != nil {
			return err
		}
	}
	sc.healed = time.Now()
	return nil
}

// follower picks one of the members other than leader, by the seed.
func (sc *scenario) follower(leader string) string {
	var fs []string
	for _, id := range sc.members {
		if id != leader {
			fs = append(fs, id)
		}
	}
	return fs[sc.rng.IntN(len(fs))]
}

// jitter is d plus up to half of d, by the seed.
func (sc *scenario) jitter(d time.Duration) time.Duration {
	return d + time.Duration(sc.rng.Int64N(int64(d/2)+1))
}
