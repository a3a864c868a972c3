package promoter

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/replica"
)

// A promoter whose replicas and lease service are of the version before the
// batched calls (each answers Unimplemented to them) falls back to
// single-range calls, and a mass failover still moves every range of the
// killed leader exactly once.
func TestMassFailoverOlderServers(t *testing.T) {
	c := newClusterOf(t, 3, time.Second, true)
	// An older lease service: the same service, without the batched calls.
	older, err := transport.Serve("127.0.0.1:0", withoutProcedures(c.lease.Service.Registration(), "GetRanges", "GrantEpochs", "BindLeases"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { older.Close() })
	const n = 40
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("o%02d", i)
		c.createRange(ids[i], "r1")
	}
	p := c.newPromoter("p1", true, func(cfg *Config) {
		cfg.LeaseURL = older.URL()
		cfg.FenceTimeout, cfg.RPCTimeout = 10*time.Second, 10*time.Second
	})
	victim, victims, _ := c.settle(p, ids)
	c.stop(c.byID[victim])
	c.waitReled(victims, victim)

	// Every coalescer that sent a batch learned to send single calls; at
	// least the initial promotions of 40 ranges at once sent batches to the
	// lease service and to each replica.
	if !p.leaseBatch.grant.isUnbatched() {
		t.Error("the grant coalescer never fell back to GrantEpoch")
	}
	for _, tr := range c.replicas {
		b := p.batchers(&tenurev1.Replica{Id: tr.id, Address: "http://" + tr.listen})
		if !b.fence.isUnbatched() {
			t.Errorf("the fence coalescer of %s never fell back to Fence", tr.id)
		}
	}
	ctx := context.Background()
	for id, e := range victims {
		waitFor(t, "the transition record of "+id, 30*time.Second, func() bool {
			trs, err := p.transitions(ctx, id, 1)
			return err == nil && len(trs) == 1 && trs[0].GetEpoch() > e
		})
	}
}

// isUnbatched reports whether the coalescer fell back to single calls.
func (c *coalescer[Req, Resp]) isUnbatched() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.unbatched
}

// withoutProcedures serves reg as a version that lacks the named procedures
// would: a request for one of them is a 404, which Connect clients read as
// Unimplemented.
func withoutProcedures(reg transport.Registration, names ...string) transport.Registration {
	inner := reg.Handler
	reg.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, n := range names {
			if strings.HasSuffix(r.URL.Path, "/"+n) {
				http.NotFound(w, r)
				return
			}
		}
		inner.ServeHTTP(w, r)
	})
	return reg
}

// startOlder is replica.Start for a replica of the version before
// FenceRanges and AdoptRanges.
func startOlder(cfg replica.Config, listen string) (*replica.Replica, *transport.Server, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, nil, err
	}
	cfg.Address = "http://" + ln.Addr().String()
	r, err := replica.New(cfg)
	if err != nil {
		_ = ln.Close()
		return nil, nil, err
	}
	regs := r.Handlers()
	for i := range regs {
		regs[i] = withoutProcedures(regs[i], "FenceRanges", "AdoptRanges")
	}
	return r, transport.ServeListener(ln, regs...), nil
}

// Two calls for one range queued at once (a reconcile's fence beside a
// promotion's) never share a batch: the replica refuses a batch that names
// a range twice, which would fail every range in it. Both are answered, the
// second as the idempotent repeat it is.
func TestCoalescerNeverBatchesARangeTwice(t *testing.T) {
	c := newCluster(t, 1)
	p := c.newPromoter("p1", false)
	fence := p.batchers(&tenurev1.Replica{Id: "r1", Address: "http://" + c.byID["r1"].listen}).fence
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const ranges, repeats = 30, 3
	errs := make(chan error, ranges*repeats)
	for i := range ranges * repeats {
		go func() {
			_, err := fence.call(ctx, &tenurev1.FenceRequest{RangeId: fmt.Sprintf("d%02d", i%ranges), Epoch: 1, FencerId: "p1"})
			errs <- err
		}()
	}
	for range ranges * repeats {
		if err := <-errs; err != nil {
			t.Errorf("fence = %v", err)
		}
	}
}

// A burst of calls that joins while another call is out goes out in full
// batches, not one RPC per free slot: every call of the burst is in flight
// while the first is still out. Before, a mass failover's first grants took
// the free slots alone or in twos, each for a whole etcd round under load,
// and the rest of the 334 waited a second round behind them. (With 400
// calls the coalescer before this change filled its eight slots with
// batches of 1 to 60 in every run of four, and the test failed.)
func TestCoalescerSendsABurstInFullBatches(t *testing.T) {
	type req = tenurev1.GrantEpochRequest
	type resp = tenurev1.GrantEpochResponse
	release := make(chan struct{})
	var releaseOnce sync.Once
	// Released on every way out, so no RPC of the test outlives it.
	releaseAll := func() { releaseOnce.Do(func() { close(release) }) }
	defer releaseAll()
	var mu sync.Mutex
	var sizes []int
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		t.Logf("%d RPCs: %v", len(sizes), sizes)
	}()
	out := func(n int) {
		mu.Lock()
		sizes = append(sizes, n)
		mu.Unlock()
		<-release
	}
	// sent is how many calls went out, in any RPC.
	sent := func() (calls int) {
		mu.Lock()
		defer mu.Unlock()
		for _, n := range sizes {
			calls += n
		}
		return calls
	}
	c := newCoalescer("test-grants", maxInflightLeaseBatches, 10*time.Second, (*req).GetRangeId,
		func(context.Context, *req) (*resp, error) { out(1); return &resp{}, nil },
		func(_ context.Context, rs []*req) ([]outcome[resp], error) {
			out(len(rs))
			return make([]outcome[resp], len(rs)), nil
		})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const burst = 400
	errs := make(chan error, burst+1)
	send := func(i int) {
		_, err := c.call(ctx, &req{RangeId: fmt.Sprintf("b%03d", i)})
		errs <- err
	}
	go send(0)
	waitFor(t, "the first call to go out", 10*time.Second, func() bool { return sent() == 1 })
	for i := 1; i <= burst; i++ {
		go send(i)
	}
	waitFor(t, "the whole burst to go out beside the first call", 10*time.Second, func() bool { return sent() == burst+1 })
	releaseAll()
	for range burst + 1 {
		if err := <-errs; err != nil {
			t.Errorf("call = %v", err)
		}
	}
}
