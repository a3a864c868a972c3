package promoter

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/leaseclient"
	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/lease/leasetest"
)

// Issue 27: two lease service instances on one etcd, every replica's keeper
// and the promoter given both. Lease instance 1 dies while a leader is
// acknowledging appends. The leader must keep acknowledging: its keeper
// renews the same session (the same etcd lease) through instance 2, so its
// lease never lapses. Then the leader dies, and the promoter, through
// instance 2, must still promote another replica, which acknowledges.
//
// With one lease URL each (before the change) the keeper cannot renew once
// instance 1 is gone: the leader stops acknowledging within the session's
// validity (1.8 s of its 2 s TTL) and never resumes, and the promoter can
// neither see the lease lapse nor grant an epoch.
func TestLeaseInstanceDiesDuringAppends(t *testing.T) {
	const ttl = 2 * time.Second // the keepers' session TTL (cluster.start)
	lease1 := leasetest.Start(t)
	lease2 := leasetest.StartOn(t, lease1.Etcd)
	urls := []string{lease1.Server.URL(), lease2.Server.URL()}
	kc, err := leaseclient.New(transport.NewHTTPClient(), urls)
	if err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, &cluster{fetchWait: 200 * time.Millisecond, lease: lease1, keeperLease: kc}, 3)
	const rangeID = "lease-failover"
	c.createRange(rangeID, "r1")
	c.newPromoter("p1", true, func(cfg *Config) { cfg.LeaseURLs = urls[1:] })
	leaderID, epoch := c.leader(rangeID, 1, 20*time.Second)
	leader := c.byID[leaderID]
	session := leader.keeper.SessionID()

	// Appends, one after another, for the rest of the test, to whichever
	// replica acknowledges; each ack with when it arrived. (The URLs are
	// taken now: c.stop clears a stopped replica's server, which this
	// goroutine must not read.)
	var replicaURLs []string
	for _, tr := range c.replicas {
		replicaURLs = append(replicaURLs, tr.srv.URL())
	}
	appendAny := func(value string) (acked, bool) {
		for _, u := range replicaURLs {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			resp, err := c.log_(u).Append(ctx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: rangeID, Records: [][]byte{[]byte(value)}}))
			cancel()
			if err == nil {
				return acked{resp.Msg.GetBaseOffset(), value}, true
			}
		}
		return acked{}, false
	}
	var mu sync.Mutex
	var acks []acked
	var ackedAt []time.Time
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 100_000; i++ {
			select {
			case <-stop:
				return
			default:
			}
			a, ok := appendAny(fmt.Sprintf("v%d", i))
			if !ok {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			mu.Lock()
			acks, ackedAt = append(acks, a), append(ackedAt, time.Now())
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	}()
	stopAppends := sync.OnceFunc(func() { close(stop); <-done })
	t.Cleanup(stopAppends)
	acksSince := func(since time.Time) (n int, maxGap time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		prev := since
		for _, at := range ackedAt {
			if at.Before(since) {
				continue
			}
			n++
			maxGap = max(maxGap, at.Sub(prev))
			prev = at
		}
		return n, max(maxGap, time.Since(prev))
	}
	waitFor(t, "appends acknowledged before the fault", 10*time.Second, func() bool { n, _ := acksSince(time.Time{}); return n >= 20 })

	// Instance 1 dies: its connections drop, its port refuses.
	killed := time.Now()
	lease1.Server.Close()
	lease1.Service.Close()

	// Four TTLs: far past the 1.8 s the leader's lease would stay valid
	// without a renewal.
	time.Sleep(4 * ttl)
	n, gap := acksSince(killed)
	t.Logf("after lease instance 1 died: %d appends acknowledged in %v, longest gap %v", n, time.Since(killed).Round(time.Millisecond), gap.Round(time.Millisecond))
	// The bound is the lease TTL: a longer gap means the leader stopped
	// acknowledging as long as a lapsed lease would have made it (an
	// append's own retries take milliseconds here).
	if gap >= ttl {
		t.Errorf("the leader stopped acknowledging for %v after lease instance 1 died; want under the lease TTL %v (its session renewed through instance 2)", gap, ttl)
	}
	if n == 0 {
		t.Fatalf("no append acknowledged in the %v after lease instance 1 died", 4*ttl)
	}
	if got := leader.keeper.SessionID(); got != session {
		t.Errorf("the leader's keeper session is %d after the failover, want %d: the same etcd lease, renewed through the other instance", got, session)
	}
	if got := kc.Current(); got != urls[1] {
		t.Errorf("the keepers' lease client calls %s first, want %s (the instance that answered)", got, urls[1])
	}
	if id, e := c.leader(rangeID, 1, 5*time.Second); id != leaderID || e != epoch {
		t.Errorf("leader %s at epoch %d after the lease instance died, want %s still at %d: nothing needed promoting", id, e, leaderID, epoch)
	}

	// A promotion through instance 2: the leader dies.
	c.stop(leader)
	next, nextEpoch := c.leader(rangeID, epoch+1, 30*time.Second)
	if next == leaderID {
		t.Fatalf("%s still leads after it was stopped", next)
	}
	after := time.Now()
	waitFor(t, "appends acknowledged by the promoted leader "+next, 15*time.Second, func() bool { n, _ := acksSince(after); return n >= 5 })
	stopAppends()
	t.Logf("promoted %s at epoch %d through lease instance 2", next, nextEpoch)

	// The promoted leader's lease is live, bound through instance 2, on its
	// keeper's session.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := lease2.Client.GetLease(ctx, connect.NewRequest(&tenurev1.GetLeaseRequest{RangeId: rangeID}))
	if err != nil {
		t.Fatal(err)
	}
	if l := resp.Msg.GetLease(); l.GetHolderId() != next || l.GetEpoch() != nextEpoch || l.GetSessionId() != c.byID[next].keeper.SessionID() || !l.GetLive() {
		t.Errorf("lease after the promotion = %v; want %s's live lease of epoch %d on its session %d", l, next, nextEpoch, c.byID[next].keeper.SessionID())
	}
	mu.Lock()
	all := append([]acked(nil), acks...)
	mu.Unlock()
	c.checkAcked(rangeID, all)
}
