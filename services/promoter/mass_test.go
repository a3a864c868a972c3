package promoter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// massRanges is how many ranges the mass failover spreads over three
// replicas: 1,000 as the issue asks, 200 under the race detector, where one
// process hosting 3,000 range replicas on two cores measures the detector.
func massRanges() int {
	if raceEnabled {
		return 200
	}
	return 1000
}

// Mass failover: a replica leading most of 1,000 ranges is killed; every range gets a
// new leader, promotions run in parallel with a bounded fan-out, and none is
// lost or done twice.
func TestMassFailover(t *testing.T) {
	c := newClusterWait(t, 3, time.Second)
	ids := make([]string, massRanges())
	for i := range ids {
		ids[i] = fmt.Sprintf("m%04d", i)
		c.createRange(ids[i], "r1")
	}
	// Creating a thousand ranges' journals and state at once is a burst of
	// fsyncs on a two-core box shared with other test packages: give the
	// fence and each RPC room, so the test measures the failover, not
	// timeouts tuned for a quiet machine.
	p := c.newPromoter("p1", true, func(cfg *Config) {
		cfg.FenceTimeout, cfg.RPCTimeout = 10*time.Second, 10*time.Second
	})
	// r1 is preferred, but a promotion proceeds once a quorum has answered
	// (plus a short grace), so under load a few ranges may start on r2.
	waitFor(t, "every range to have a leader", 120*time.Second, func() bool {
		return len(c.ledBy("r1", 1))+len(c.ledBy("r2", 1))+len(c.ledBy("r3", 1)) == massRanges()
	})
	victims := c.ledBy("r1", 1)
	if len(victims) < massRanges()/2 {
		t.Fatalf("r1 leads only %d of %d ranges", len(victims), massRanges())
	}

	c.stop(c.byID["r1"])
	killed := time.Now()
	c.waitReled(victims, "r1")
	t.Logf("mass failover: the %d ranges of the killed leader re-led %v after the kill", len(victims), time.Since(killed))

	// None lost or done twice: every range of the killed leader moved
	// exactly once, from epoch 1 to 2; every other range did not move. The
	// record is written just after adoption, so give it a moment.
	ctx := context.Background()
	var bad []string
	deadline := time.Now().Add(60 * time.Second)
	for {
		bad = bad[:0]
		for _, id := range ids {
			trs, err := p.transitions(ctx, id, 10)
			if err != nil {
				t.Fatal(err)
			}
			var got []uint64
			for _, tr := range trs {
				got = append(got, tr.GetEpoch())
			}
			// A victim has exactly one promotion after epoch 1 (an attempt
			// that failed for want of a quorum under load leaves no record,
			// so its epoch may be above 2); any other range none.
			ok := len(got) == 1 && got[0] == 1
			if victims[id] {
				ok = len(got) == 2 && got[1] == 1 && got[0] >= 2
			}
			if !ok {
				bad = append(bad, fmt.Sprintf("%s (victim %v): epochs %v", id, victims[id], got))
			}
		}
		if len(bad) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(bad) > 0 {
		t.Errorf("transition records after 60s: %v", bad)
	}
}

// ledBy is the set of ranges replica id leads at exactly epoch.
func (c *cluster) ledBy(id string, epoch uint64) map[string]bool {
	led := map[string]bool{}
	for r, e := range c.leading(id) {
		if e == epoch {
			led[r] = true
		}
	}
	return led
}

// leading maps each range replica id leads to the epoch it leads at.
func (c *cluster) leading(id string) map[string]uint64 {
	tr := c.byID[id]
	led := map[string]uint64{}
	if tr.srv == nil {
		return led
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.replicaClient(tr.srv.URL()).GetStatus(ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{}))
	if err != nil {
		return led
	}
	for _, st := range resp.Msg.GetRanges() {
		if st.GetRole() == tenurev1.Role_ROLE_LEADER {
			led[st.GetRangeId()] = st.GetEpoch()
		}
	}
	return led
}

// waitReled waits until every range in victims is led, at an epoch above 1,
// by a replica other than the killed one.
//
// It polls every 200ms, not waitFor's 20ms: each poll is a full GetStatus of
// every surviving replica (a thousand ranges each), and polling at 50 Hz
// was itself a large share of the CPU the failover it measured had to share.
// How long the failover took is read from the transition records
// (massBreakdown), not from when this poll happened to notice.
func (c *cluster) waitReled(victims map[string]bool, killed string) {
	c.t.Helper()
	deadline := time.Now().Add(120 * time.Second)
	for {
		n := 0
		for _, tr := range c.replicas {
			if tr.id == killed {
				continue
			}
			for r, e := range c.leading(tr.id) {
				if victims[r] && e >= 2 {
					n++
				}
			}
		}
		if n == len(victims) {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("after 2m only %d of the killed replica's %d ranges have a new leader", n, len(victims))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
