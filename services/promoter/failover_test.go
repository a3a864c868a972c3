package promoter

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/internal/testlog"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// Kill the leader: a new leader is promoted, appends continue, and no
// acknowledged record is lost.
func TestKillLeaderPromotesNewLeader(t *testing.T) {
	c := newCluster(t, 3)
	c.createRange("orders", "r1")
	c.newPromoter("p1", true)
	first, e1 := c.leader("orders", 1, 20*time.Second)
	if first != "r1" {
		t.Errorf("initial leader = %s, want the preferred r1", first)
	}

	var acks []acked
	for i := range 20 {
		a, err := c.appendOne("orders", fmt.Sprintf("before-%d", i), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		acks = append(acks, a)
	}
	c.stop(c.byID[first])
	killed := time.Now()

	next, e2 := c.leader("orders", e1+1, 20*time.Second)
	if next == first {
		t.Fatalf("leader after kill = %s, the killed replica", next)
	}
	a, err := c.appendOne("orders", "after-0", 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("failover: leader %s killed, %s leads at epoch %d, first append acknowledged after %v", first, next, e2, time.Since(killed))
	acks = append(acks, a)
	for i := 1; i < 10; i++ {
		a, err := c.appendOne("orders", fmt.Sprintf("after-%d", i), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		acks = append(acks, a)
	}
	c.checkAcked("orders", acks)

	// The old leader comes back: the reconcile loop makes it a follower of
	// the new leader at the current epoch.
	c.start(c.byID[first])
	waitFor(t, "the restarted replica to follow the new leader", 20*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err := c.replicaClient(c.byID[first].srv.URL()).GetStatus(ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: "orders"}))
		if err != nil || len(resp.Msg.GetRanges()) != 1 {
			return false
		}
		st := resp.Msg.GetRanges()[0]
		return st.GetRole() == tenurev1.Role_ROLE_FOLLOWER && st.GetLeaderId() == next && st.GetEpoch() >= e2
	})
}

// No quorum: with two of three replicas down nothing is promoted, no epoch
// is spent while they refuse connections, and the promotion succeeds once a
// quorum is back.
func TestNoQuorumThenRecovery(t *testing.T) {
	c := newCluster(t, 3)
	c.createRange("r", "r1")
	// Retries at most 100ms apart: without the quorum check each would
	// grant an epoch.
	var logs testlog.Buffer
	p := c.newPromoter("p1", true, func(cfg *Config) {
		cfg.RetryMax = 100 * time.Millisecond
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	_, e1 := c.leader("r", 1, 20*time.Second)
	a, err := c.appendOne("r", "committed", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.stop(c.byID["r1"])
	c.stop(c.byID["r2"])

	// The promoter keeps trying and keeps failing for want of a quorum.
	waitFor(t, "a failed promotion attempt for want of a quorum", 20*time.Second, func() bool {
		st := promotionOf(p, "r")
		return st.GetAttempts() > 0 && st.GetState() == "unavailable" || st.GetState() == "no-quorum"
	})
	// r3 alone never leads: it is one of three.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	resp, err := c.replicaClient(c.byID["r3"].srv.URL()).GetStatus(ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: "r"}))
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if st := resp.Msg.GetRanges()[0]; st.GetRole() == tenurev1.Role_ROLE_LEADER && st.GetEpoch() > e1 {
		t.Fatalf("r3 leads at epoch %d without a quorum", st.GetEpoch())
	}

	// Once the probes see both refuse connections, the promoter stops
	// granting epochs: it retries without fencing anyone.
	waitFor(t, "the promoter holding back for want of answering replicas", 20*time.Second, func() bool {
		st := promotionOf(p, "r")
		return st.GetState() == "no-quorum" && strings.Contains(st.GetLastError(), "refuse connections (r1, r2)")
	})
	held, tried := c.rangeEpoch("r"), promotionOf(p, "r").GetAttempts()
	time.Sleep(time.Second) // ten retries' worth
	if now := c.rangeEpoch("r"); now != held {
		t.Fatalf("epoch moved from %d to %d while two of three replicas refused connections", held, now)
	}
	// Nothing was tried meanwhile, and status does not count it as tried.
	if st := promotionOf(p, "r"); st.GetAttempts() != tried || st.GetState() != "no-quorum" {
		t.Errorf("after a second held: state %q, attempts %d; want no-quorum and still %d", st.GetState(), st.GetAttempts(), tried)
	}
	// Said once, not once per retry (the probes trigger one every 100ms).
	if n := strings.Count(logs.String(), "refuse connections"); n != 1 {
		t.Errorf("the held promotion was logged at warning level %d times, want once; logs:\n%s", n, logs.String())
	}

	c.start(c.byID["r2"])
	leader, e2 := c.leader("r", e1+1, 20*time.Second)
	if leader == "r1" {
		t.Fatalf("leader = r1, which is down")
	}
	// The retries of the failed attempts end with the success: none
	// promotes again from the new epoch, deposing the new leader.
	time.Sleep(time.Second)
	if now := c.rangeEpoch("r"); now != e2 {
		t.Fatalf("epoch moved from %d to %d after the promotion succeeded", e2, now)
	}
	// The transition record says it was a retry once, however many there
	// were.
	trs, err := p.transitions(context.Background(), "r", 1)
	if err != nil || len(trs) != 1 {
		t.Fatalf("transitions = %v, %v", trs, err)
	}
	if r := trs[0].GetReason(); strings.Count(r, "(retry)") > 1 {
		t.Errorf("transition reason = %q, want at most one retry mark", r)
	}
	b, err := c.appendOne("r", "after", 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.checkAcked("r", []acked{a, b})
}

// rangeEpoch is rangeID's epoch in the lease service.
func (c *cluster) rangeEpoch(rangeID string) uint64 {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.lease.Client.GetRange(ctx, connect.NewRequest(&tenurev1.GetRangeRequest{RangeId: rangeID}))
	if err != nil {
		c.t.Fatalf("GetRange(%s): %v", rangeID, err)
	}
	return resp.Msg.GetRange().GetEpoch()
}

// promotionOf is p's state of rangeID as its GetStatus reports it.
func promotionOf(p *Promoter, rangeID string) *tenurev1.RangePromotionState {
	resp, _ := handler{p}.GetStatus(context.Background(), connect.NewRequest(&tenurev1.PromoterServiceGetStatusRequest{}))
	for _, r := range resp.Msg.GetRanges() {
		if r.GetRangeId() == rangeID {
			return r
		}
	}
	return nil
}

// A retry's reason is marked once however often it is retried: it lands in
// the transition record.
func TestRetryReasonMarksOnce(t *testing.T) {
	r := "leader unreachable: connection refused"
	for range 25 {
		r = retryReason(r)
	}
	if want := "leader unreachable: connection refused (retry)"; r != want {
		t.Fatalf("reason after 25 retries = %q, want %q", r, want)
	}
}
