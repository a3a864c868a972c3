package main

import (
	"context"
	"errors"
	"time"

	"github.com/tenurelog/tenure/internal/chaos/check"
)

// ownLease is the lease instance each replica names first in its
// TENURE_LEASE (docker-compose.yml): the one its keeper renews through
// until it fails.
var ownLease = map[string]string{"replica-1": "lease-1", "replica-2": "lease-2", "replica-3": "lease-1", "replica-4": "lease-2"}

// etcdMembers are the stack's etcd members.
var etcdMembers = []string{"etcd-1", "etcd-2", "etcd-3"}

// killLease: docker kill the lease service instance the leader renews its
// session through, under traffic. Every replica and promoter names both
// instances (issue 27), so the leader must keep acknowledging past its
// lease TTL, its session renewed through the other one; then the leader is
// killed too, and the promoter must promote through the surviving
// instance. Then both are started again.
func (sc *scenario) killLease(ctx context.Context) error {
	leader, _, err := sc.currentLeader(ctx)
	if err != nil {
		return err
	}
	return sc.killControl(ctx, ownLease[leader], "7000", "lease-kill")
}

// killEtcdMember: docker kill one of the three etcd members, by the seed,
// under traffic. Two keep quorum, and the lease services' and promoters'
// etcd clients name all three: the leader must keep acknowledging past
// its lease TTL, and a promotion (the leader killed too) must still
// succeed. Then both are started again.
func (sc *scenario) killEtcdMember(ctx context.Context) error {
	return sc.killControl(ctx, etcdMembers[sc.rng.IntN(len(etcdMembers))], "", "etcd-kill")
}

// killControl kills svc, a control-plane container (a lease instance or an
// etcd member) of which others remain, and then, while it is down, the
// range's leader:
//
//  1. docker kill svc; for 3 lease TTLs the range must go on acknowledging
//     appends called after the leader's lease would have lapsed without a
//     renewal (one TTL after the kill): the fault must not stop it;
//  2. docker kill the leader; a new leader must be promoted;
//  3. start the old leader (its keeper too must find a live instance),
//     then svc (publishedPort, if any, is looked up again), and wait for
//     the old leader to follow.
func (sc *scenario) killControl(ctx context.Context, svc, publishedPort, fault string) error {
	leader, epoch, err := sc.currentLeader(ctx)
	if err != nil {
		return err
	}
	ttl := sc.cfg.leaseTTL
	logf("%s: docker kill %s (leader %s at epoch %d)", sc.name, svc, leader, epoch)
	if _, err := docker(ctx, "kill", sc.stack.ids[svc]); err != nil {
		return err
	}
	sc.faults[fault]++
	down := time.Now()
	time.Sleep(3 * ttl)
	if n := sc.appendsAcked(down.Add(ttl), time.Now()); n == 0 {
		sc.expect("no append acknowledged from %v to %v after killing %s: the range stopped serving although the rest of the control plane was up",
			ttl, time.Since(down).Round(time.Millisecond), svc)
	} else {
		logf("%s: %d appends acknowledged from %v to %v after killing %s", sc.name, n, ttl, time.Since(down).Round(time.Millisecond), svc)
	}

	logf("%s: docker kill %s (the leader, with %s still down)", sc.name, leader, svc)
	if _, err := docker(ctx, "kill", sc.stack.ids[leader]); err != nil {
		return sc.restartControl(ctx, svc, publishedPort, err)
	}
	sc.faults["kill"]++
	sc.killed(leader)
	killed := time.Now()
	if next, err := sc.waitLeader(ctx, epoch, leader); err != nil {
		sc.expect("no new leader after killing %s with %s down: %v", leader, svc, err)
	} else {
		logf("%s: %s promoted %v after the kill, with %s down", sc.name, next, time.Since(killed).Round(time.Millisecond), svc)
	}
	time.Sleep(sc.jitter(time.Second))
	logf("%s: docker start %s, then %s", sc.name, leader, svc)
	startErr := sc.startReplicas(ctx, leader)
	if err := sc.restartControl(ctx, svc, publishedPort, startErr); err != nil {
		return err
	}
	logf("%s: %s was down %v", sc.name, svc, time.Since(down).Round(time.Millisecond))
	return sc.waitRejoined(ctx, leader)
}

// restartControl starts svc again, whatever happened before (the next
// scenarios need it), and joins its error to prior.
func (sc *scenario) restartControl(ctx context.Context, svc, publishedPort string, prior error) error {
	_, err := docker(context.WithoutCancel(ctx), "start", sc.stack.ids[svc])
	if err == nil && publishedPort != "" {
		err = sc.stack.refreshPort(ctx, svc, publishedPort)
	}
	sc.healed = time.Now()
	return errors.Join(prior, err)
}

// appendsAcked counts the workload's appends called at or after from and
// acknowledged by until.
func (sc *scenario) appendsAcked(from, until time.Time) int {
	n := 0
	for _, op := range sc.hist.Ops() {
		if op.Kind == check.Append && op.Outcome == check.OK && !op.Call.Before(from) && !op.Return.After(until) {
			n++
		}
	}
	return n
}
