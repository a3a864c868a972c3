package promoter

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tenurelog/tenure/internal/metrics"
	"github.com/tenurelog/tenure/internal/testgate"
	"github.com/tenurelog/tenure/internal/testnet"
	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
	"github.com/tenurelog/tenure/services/lease"
	"github.com/tenurelog/tenure/services/lease/leasetest"
	"github.com/tenurelog/tenure/services/replica"
)

// This file runs a whole tenure cluster in one test: embedded etcd, a real
// lease service, real replicas on HTTP/2 loopback with Badger in temp dirs,
// and real promoters. Nothing is mocked; faults are injected by stopping
// servers and by a gate on a replica's outgoing fetches.

func testLogger() *slog.Logger {
	// TENURE_TEST_LOG=debug|info|warn shows the cluster's logs.
	var level slog.Level
	if err := level.UnmarshalText([]byte(os.Getenv("TENURE_TEST_LOG"))); err == nil && os.Getenv("TENURE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}

type testReplica struct {
	id, dir, listen string
	gate            *testgate.Gate
	keeper          *lease.Keeper
	r               *replica.Replica
	srv             *transport.Server
	// metrics serves the replica's series while it runs (cluster.metrics).
	metrics *metrics.Server
}

type cluster struct {
	t        testing.TB
	lease    *leasetest.Env
	replicas []*testReplica
	byID     map[string]*testReplica
	log      *slog.Logger
	// http is shared by every client the test makes: one connection per
	// server, as a real client would, instead of a pool per call.
	http *http.Client
	// fetchWait is the replicas' long-poll wait (200ms: tests move fast;
	// the mass test uses the 1s default, since 2,000 follower loops
	// polling five times a second would measure the poll, not the failover).
	fetchWait time.Duration
	// older, when set, makes every replica serve as the version before the
	// batched calls: FenceRanges and AdoptRanges answer Unimplemented.
	older bool
	// keeperLease, when set, is the lease client the replicas' keepers use
	// (default lease.Client): several lease instances (lease_failover_test).
	keeperLease tenurev1connect.LeaseServiceClient
	// metrics, when set, serves each replica's metrics on a loopback port
	// (testReplica.metrics), a fresh registry per start, as a process's.
	metrics bool
}

// newCluster starts etcd, the lease service and n replicas (r1..rn).
func newCluster(t testing.TB, n int) *cluster {
	return newClusterWait(t, n, 200*time.Millisecond)
}

func newClusterWait(t testing.TB, n int, fetchWait time.Duration) *cluster {
	return newClusterOf(t, n, fetchWait, false)
}

func newClusterOf(t testing.TB, n int, fetchWait time.Duration, older bool) *cluster {
	t.Helper()
	return startCluster(t, &cluster{fetchWait: fetchWait, older: older}, n)
}

// startCluster starts n replicas, and c's etcd and lease service unless
// c.lease is one the test made.
func startCluster(t testing.TB, c *cluster, n int) *cluster {
	t.Helper()
	if c.lease == nil {
		c.lease = leasetest.Start(t)
	}
	c.t, c.byID, c.log, c.http = t, map[string]*testReplica{}, testLogger(), transport.NewHTTPClient()
	for i := 1; i <= n; i++ {
		tr := &testReplica{id: fmt.Sprintf("r%d", i), dir: t.TempDir(), listen: testnet.FreeAddr(t), gate: testgate.New()}
		c.replicas = append(c.replicas, tr)
		c.byID[tr.id] = tr
		c.start(tr)
	}
	t.Cleanup(func() {
		for _, tr := range c.replicas {
			c.stop(tr)
		}
	})
	return c
}

// start (re)starts a replica on its data dir and, after the first start,
// on the same address, so the range's membership stays true.
func (c *cluster) start(tr *testReplica) {
	c.t.Helper()
	lc := c.lease.Client
	if c.keeperLease != nil {
		lc = c.keeperLease
	}
	k, err := lease.NewKeeper(lc, tr.id, "", lease.WithSessionTTL(2*time.Second), lease.WithKeeperLogger(c.log))
	if err != nil {
		c.t.Fatalf("keeper for %s: %v", tr.id, err)
	}
	var r *replica.Replica
	var srv *transport.Server
	// The old listener's port may take a moment to be reusable. Only that
	// is waited out here: the port is below the ephemeral range
	// (testnet.FreeAddr), so no other test takes it while tr is down.
	for attempt := 0; attempt < 50; attempt++ {
		cfg := replica.Config{ID: tr.id, DataDir: tr.dir, Logger: c.log, Lease: k, HTTPClient: tr.gate, FetchWait: c.fetchWait}
		var reg *prometheus.Registry
		if c.metrics {
			reg = metrics.NewRegistry("replica")
			cfg.Metrics = reg
		}
		if c.older {
			r, srv, err = startOlder(cfg, tr.listen)
		} else {
			r, srv, err = replica.Start(cfg, tr.listen)
		}
		if err == nil && reg != nil {
			if tr.metrics, err = metrics.Serve("127.0.0.1:0", reg, c.log); err != nil {
				c.t.Fatalf("metrics of %s: %v", tr.id, err)
			}
		}
		if err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		c.t.Fatalf("start %s: %v", tr.id, err)
	}
	tr.keeper, tr.r, tr.srv, tr.listen = k, r, srv, srv.Addr
}

// stop kills a replica: its server drops connections at once and its
// lease session is left to expire, as when the process dies.
func (c *cluster) stop(tr *testReplica) {
	if tr.srv == nil {
		return
	}
	tr.srv.Close()
	tr.r.Close()
	if tr.metrics != nil {
		tr.metrics.Close()
		tr.metrics = nil
	}
	// Abandon the keeper without releasing: a killed process releases nothing.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = tr.keeper.Close(ctx)
	tr.srv, tr.r = nil, nil
}

func (c *cluster) members() []*tenurev1.Replica {
	var out []*tenurev1.Replica
	for _, tr := range c.replicas {
		out = append(out, &tenurev1.Replica{Id: tr.id, Address: transport.Scheme() + "://" + tr.listen})
	}
	return out
}

func (c *cluster) createRange(id, preferred string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.lease.Client.CreateRange(ctx, connect.NewRequest(&tenurev1.CreateRangeRequest{RangeId: id, Replicas: c.members(), PreferredReplicaId: preferred}))
	if err != nil {
		c.t.Fatalf("CreateRange(%s): %v", id, err)
	}
}

// newPromoter builds a promoter against the cluster; run starts its loop.
func (c *cluster) newPromoter(id string, run bool, tune ...func(*Config)) *Promoter {
	c.t.Helper()
	// Rebalancing is off unless a test turns it on: a test that fails a
	// range over and then checks who leads must not race a move back.
	cfg := Config{ID: id, Etcd: c.lease.EtcdClient, LeaseURL: c.lease.Server.URL(), Logger: c.log,
		RefreshInterval: 300 * time.Millisecond, NoRebalance: true}
	for _, f := range tune {
		f(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	if run {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { p.Run(ctx); close(done) }()
		stop := func() { cancel(); <-done }
		p.testStop = stop
		c.t.Cleanup(stop)
	}
	return p
}

// stopForTest returns the function that stops a promoter newPromoter ran.
func (p *Promoter) stopForTest() func() { return sync.OnceFunc(p.testStop) }

func (c *cluster) log_(addr string) tenurev1connect.LogServiceClient {
	return tenurev1connect.NewLogServiceClient(c.http, addr, transport.ClientOptions()...)
}

func (c *cluster) replicaClient(addr string) tenurev1connect.ReplicaServiceClient {
	return tenurev1connect.NewReplicaServiceClient(c.http, addr, transport.ClientOptions()...)
}

// leader polls the replicas until one leads rangeID at an epoch of at least
// minEpoch with a live lease and answers as such; it returns its id and epoch.
func (c *cluster) leader(rangeID string, minEpoch uint64, within time.Duration) (string, uint64) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		for _, tr := range c.replicas {
			if tr.srv == nil {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			resp, err := c.replicaClient(tr.srv.URL()).GetStatus(ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: rangeID}))
			cancel()
			if err != nil || len(resp.Msg.GetRanges()) != 1 {
				continue
			}
			st := resp.Msg.GetRanges()[0]
			if st.GetRole() == tenurev1.Role_ROLE_LEADER && st.GetEpoch() >= minEpoch && st.GetEpoch() == st.GetFencedEpoch() {
				return tr.id, st.GetEpoch()
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("no leader of %s at epoch >= %d within %v", rangeID, minEpoch, within)
	return "", 0
}

// acked is one acknowledged append.
type acked struct {
	offset uint64
	value  string
}

// appendOne appends one record to whichever replica leads, retrying (bounded)
// while leadership moves. It returns the acknowledged offset.
func (c *cluster) appendOne(rangeID, value string, within time.Duration) (acked, error) {
	deadline := time.Now().Add(within)
	var last error
	for time.Now().Before(deadline) {
		for _, tr := range c.replicas {
			if tr.srv == nil {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			resp, err := c.log_(tr.srv.URL()).Append(ctx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: rangeID, Records: [][]byte{[]byte(value)}}))
			cancel()
			if err == nil {
				return acked{resp.Msg.GetBaseOffset(), value}, nil
			}
			last = err
		}
		time.Sleep(20 * time.Millisecond)
	}
	return acked{}, fmt.Errorf("append %q not acknowledged within %v: %w", value, within, last)
}

// readAll reads rangeID's committed records from its current leader.
func (c *cluster) readAll(rangeID string) map[uint64]*tenurev1.Record {
	c.t.Helper()
	id, _ := c.leader(rangeID, 1, 10*time.Second)
	out := map[uint64]*tenurev1.Record{}
	// From the log start: records below it were deleted by retention.
	from := c.status(id, rangeID).GetLogStart()
	// A new leader serves reads only once its epoch-start record is
	// committed, a fetch round after its adoption: FailedPrecondition until
	// then, which is retried (bounded: 10 s).
	notYet := time.Now().Add(10 * time.Second)
	for range 10_000 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := c.log_(c.byID[id].srv.URL()).Read(ctx, connect.NewRequest(&tenurev1.ReadRequest{RangeId: rangeID, Offset: from}))
		cancel()
		if connect.CodeOf(err) == connect.CodeFailedPrecondition && time.Now().Before(notYet) {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if err != nil {
			c.t.Fatalf("Read(%s, %d) from %s: %v", rangeID, from, id, err)
		}
		if len(resp.Msg.GetRecords()) == 0 {
			return out
		}
		for _, r := range resp.Msg.GetRecords() {
			out[r.GetOffset()] = r
			from = r.GetOffset() + 1
		}
	}
	c.t.Fatal("readAll did not end")
	return nil
}

// checkAcked asserts every acknowledged record is readable at its offset
// with its bytes (invariant 1).
func (c *cluster) checkAcked(rangeID string, acks []acked) {
	c.t.Helper()
	recs := c.readAll(rangeID)
	for _, a := range acks {
		r, ok := recs[a.offset]
		if !ok {
			c.t.Errorf("acknowledged record %q at offset %d is missing", a.value, a.offset)
			continue
		}
		if string(r.GetValue()) != a.value {
			c.t.Errorf("offset %d holds %q, want the acknowledged %q", a.offset, r.GetValue(), a.value)
		}
	}
}

func waitFor(t testing.TB, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("timed out after %v waiting for %s", within, what)
}
