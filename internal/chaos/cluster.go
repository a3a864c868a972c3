package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tenurelog/tenure/internal/chaos/check"
	"github.com/tenurelog/tenure/internal/freeport"
	"github.com/tenurelog/tenure/pkg/journal/journaltest"
	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
	"github.com/tenurelog/tenure/services/lease"
	"github.com/tenurelog/tenure/services/promoter"
	"github.com/tenurelog/tenure/services/replica"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// sessionTTL is the replicas' lease session TTL: etcd's minimum here, so
// lease-expiry faults (pause, partition) resolve in seconds.
const sessionTTL = 2 * time.Second

// promoterRefresh is the promoters' range-list refresh (their other
// timings are promoterTimings).
const promoterRefresh = 300 * time.Millisecond

// Cluster is one chaos run's tenure: embedded etcd (one member, or three
// for the etcd kinds), the lease service, replicas r1..rN and promoters
// p1..pM, every node's traffic through one Network and every replica
// observed by one Observer.
type Cluster struct {
	t       testing.TB
	log     *slog.Logger
	net     *Network
	obs     *Observer
	etcd    *etcdCluster
	etcdCli *clientv3.Client
	// lease is the running lease service (nil while killed); leaseAddr
	// stays the same across restarts, since every node was given its URL
	// (empty until the first start binds it).
	lease     *leaseNode
	leaseAddr string
	leaseCli  tenurev1connect.LeaseServiceClient
	replicas  []*replicaNode
	// spares are the replicas started as no member, for reconfigure to
	// add (also in replicas).
	spares    []*replicaNode
	promoters []*promoterNode
	// direct reaches servers around the Network: the harness's own status
	// polls must not be faulted.
	direct *http.Client
	// retentionInterval is every replica's RetentionInterval: how often a
	// leader applies the range's retention policy and re-reads it from
	// the lease service (0: the replica's default).
	retentionInterval time.Duration
	// mu guards each replica node's running server, replica, keeper and
	// incarnation: faults restart nodes while the HWM sampler polls them.
	mu sync.Mutex
}

type replicaNode struct {
	id, dir string
	// listen is the server's address, kept across restarts (empty until
	// the first start binds it).
	listen string
	// jfs holds the journals: a crash keeps only what was fsynced.
	jfs         *journaltest.MemFS
	incarnation int
	keeper      *lease.Keeper
	r           *replica.Replica
	srv         *transport.Server
}

type promoterNode struct {
	id string
	p  *promoter.Promoter
	// srv serves the promoter's status (PromoterService), which the
	// liveness checker compares with the replicas'.
	srv  *transport.Server
	stop func()
}

type leaseNode struct {
	svc *lease.Service
	srv *transport.Server
}

func testLogger() *slog.Logger {
	// TENURE_TEST_LOG=debug|info|warn shows the cluster's logs.
	level := slog.LevelError + 4 // quiet: a chaos run's errors are expected
	if v := os.Getenv("TENURE_TEST_LOG"); v != "" {
		_ = level.UnmarshalText([]byte(v))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// startCluster starts etcd (etcdMembers members), the lease service, n
// replicas, whose leaders apply retention every retentionInterval (0: the
// replica's default), and m promoters.
func startCluster(t testing.TB, seed uint64, n, m, etcdMembers int, retentionInterval time.Duration) *Cluster {
	t.Helper()
	c := &Cluster{t: t, log: testLogger(), net: NewNetwork(seed), obs: newObserver(), direct: transport.NewHTTPClient(),
		retentionInterval: retentionInterval}
	c.obs.install()
	t.Cleanup(c.obs.uninstall)
	c.etcd = startEtcd(t, etcdMembers)
	// Configured as the tenure binaries configure theirs.
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("dial etcd: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	c.etcdCli = cli
	c.startLease()
	c.leaseCli = tenurev1connect.NewLeaseServiceClient(c.direct, c.leaseURL(), transport.ClientOptions()...)
	for i := 1; i <= n; i++ {
		rn := &replicaNode{id: fmt.Sprintf("r%d", i), dir: t.TempDir(), jfs: journaltest.NewMemFS()}
		c.replicas = append(c.replicas, rn)
		c.startReplica(rn)
	}
	for i := 1; i <= m; i++ {
		c.startPromoter(fmt.Sprintf("p%d", i))
	}
	t.Cleanup(c.stopAll)
	return c
}

// nodes lists every node name but the workload's client.
func (c *Cluster) nodes() []string {
	out := []string{"lease"}
	for _, r := range c.replicas {
		out = append(out, r.id)
	}
	for _, p := range c.promoters {
		out = append(out, p.id)
	}
	return out
}

func (c *Cluster) leaseURL() string { return "http://" + c.leaseAddr }

// startLease (re)starts the lease service on etcd, at the same address
// after the first start. Its handler goes through the Network as node
// "lease", so Pause("lease") stops it as SIGSTOP would: requests and
// stream messages wait, and etcd expires the sessions nobody renews.
func (c *Cluster) startLease() {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	svc, err := lease.New(ctx, c.etcdCli, lease.WithLogger(c.log))
	if err != nil {
		c.t.Fatalf("lease service: %v", err)
	}
	ln := c.listen("lease", c.leaseAddr)
	reg := svc.Registration()
	reg.Handler = c.net.Handler("lease", reg.Handler)
	srv := transport.ServeListener(ln, reg)
	c.net.Register("lease", srv.Addr)
	c.mu.Lock()
	c.lease, c.leaseAddr = &leaseNode{svc: svc, srv: srv}, srv.Addr
	c.mu.Unlock()
}

// killLease stops the lease service at once: its streams and connections
// drop, and it releases nothing (it holds no state etcd does not).
func (c *Cluster) killLease() {
	c.mu.Lock()
	l := c.lease
	c.lease = nil
	c.mu.Unlock()
	if l == nil {
		return
	}
	c.net.Resume("lease")
	l.svc.Close()
	l.srv.Close()
}

// listen listens on addr, waiting a little for a port a stopped server
// of the same node may still hold. An empty addr is the node's first
// start: it gets a port below the ephemeral range (internal/freeport). One
// from ":0" could be taken by another test's connection or listener while
// the node was down, and its restart then failed with "address already in
// use" however long it waited.
func (c *Cluster) listen(node, addr string) net.Listener {
	c.t.Helper()
	if addr == "" {
		ln, err := freeport.Listen()
		if err != nil {
			c.t.Fatalf("listen for %s: %v", node, err)
		}
		return ln
	}
	var ln net.Listener
	var err error
	for attempt := 0; attempt < 100; attempt++ {
		ln, err = net.Listen("tcp", addr)
		if err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		c.t.Fatalf("listen for %s: %v", node, err)
	}
	return ln
}

func (c *Cluster) replica(id string) *replicaNode {
	for _, r := range c.replicas {
		if r.id == id {
			return r
		}
	}
	c.t.Fatalf("no replica %q", id)
	return nil
}

// startReplica (re)starts a replica on its data dir, its journals and, after
// the first start, its address, so the range's membership stays true.
func (c *Cluster) startReplica(rn *replicaNode) {
	c.t.Helper()
	leaseClient := tenurev1connect.NewLeaseServiceClient(c.net.Client(rn.id), c.leaseURL(), transport.ClientOptions()...)
	k, err := lease.NewKeeper(leaseClient, rn.id, "", lease.WithSessionTTL(sessionTTL), lease.WithKeeperLogger(c.log))
	if err != nil {
		c.t.Fatalf("keeper for %s: %v", rn.id, err)
	}
	ln := c.listen(rn.id, rn.listen)
	r, err := replica.New(replica.Config{
		ID: rn.id, Address: "http://" + ln.Addr().String(), DataDir: rn.dir, Logger: c.log, Lease: k,
		HTTPClient: c.net.Client(rn.id), FetchWait: 200 * time.Millisecond,
		StoreOptions: logstore.Options{Logger: c.log, JournalFS: rn.jfs},
		// As the replica binary: leaders re-read the policies through the
		// keeper (over the fault network) every retention interval.
		RetentionInterval: c.retentionInterval, Policies: k,
	})
	if err != nil {
		_ = ln.Close()
		c.t.Fatalf("start %s: %v", rn.id, err)
	}
	regs := r.Handlers()
	for i := range regs {
		regs[i].Handler = c.net.Handler(rn.id, regs[i].Handler)
	}
	srv := transport.ServeListener(ln, regs...)
	c.net.Register(rn.id, srv.Addr)
	c.mu.Lock()
	rn.srv, rn.keeper, rn.r, rn.listen = srv, k, r, srv.Addr
	rn.incarnation++
	c.mu.Unlock()
}

// killReplica stops a replica as a power loss does: connections drop at
// once, the lease session is left to expire, its journals keep only what
// was fsynced, and its log store keeps only what its WAL synced, having
// lost Badger's copies of everything since the last checkpoint
// (replica.Crash).
func (c *Cluster) killReplica(rn *replicaNode) {
	c.mu.Lock()
	srv, r, k := rn.srv, rn.r, rn.keeper
	rn.srv, rn.r = nil, nil
	c.mu.Unlock()
	if srv == nil {
		return
	}
	c.net.Resume(rn.id) // a paused node's waiting requests must not outlive it
	srv.Close()
	if err := r.Crash(); err != nil {
		c.t.Errorf("crash %s: %v", rn.id, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = k.Close(ctx) // abandoned: a killed process releases nothing
	rn.jfs = rn.jfs.Crash()
}

func (c *Cluster) startPromoter(id string) {
	c.t.Helper()
	p, err := promoter.New(promoter.Config{
		ID: id, Etcd: c.etcdCli, LeaseURL: c.leaseURL(), Logger: c.log,
		HTTPClient: c.net.Client(id), RefreshInterval: promoterRefresh, SessionTTL: sessionTTL,
		StatusInterval: promoterTimings.StatusInterval, ProbeInterval: promoterTimings.ProbeInterval,
		ProbeTimeout: promoterTimings.ProbeTimeout, ProbeMisses: promoterTimings.ProbeMisses,
		FenceTimeout: promoterTimings.FenceTimeout, RPCTimeout: promoterTimings.RPCTimeout, RetryMax: promoterTimings.RetryMax,
	})
	if err != nil {
		c.t.Fatalf("promoter %s: %v", id, err)
	}
	srv, err := transport.Serve("127.0.0.1:0", p.Handlers()...)
	if err != nil {
		c.t.Fatalf("promoter %s: %v", id, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	c.promoters = append(c.promoters, &promoterNode{id: id, p: p, srv: srv, stop: sync.OnceFunc(func() { cancel(); <-done; srv.Close() })})
}

// handover asks the elected promoter (as an operator would, over the
// fault network) to promote the range now. A failure is part of the run:
// it is logged, and the promoter's own loop carries on.
func (c *Cluster) handover(reason string) {
	for _, q := range c.promoters {
		if !q.p.Elected() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		tr, err := q.p.Promote(ctx, rangeID, "", reason)
		if err != nil {
			c.log.Warn("chaos: handover failed", "promoter", q.id, "err", err)
			return
		}
		c.log.Info("chaos: handover", "promoter", q.id, "epoch", tr.GetEpoch(), "leader", tr.GetLeaderId())
		return
	}
	c.log.Warn("chaos: no elected promoter to ask for a handover")
}

func (c *Cluster) stopAll() {
	for _, p := range c.promoters {
		p.stop()
	}
	for _, r := range c.replicas {
		c.killReplica(r)
	}
	c.killLease()
}

// createRange creates range id on every replica, with retention policy
// retention (nil: the lease service's defaults, which remove nothing
// within a run).
func (c *Cluster) createRange(id string, retention *tenurev1.RetentionPolicy) {
	c.t.Helper()
	var members []*tenurev1.Replica
	for _, r := range c.replicas {
		members = append(members, &tenurev1.Replica{Id: r.id, Address: "http://" + r.listen})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.leaseCli.CreateRange(ctx, connect.NewRequest(&tenurev1.CreateRangeRequest{RangeId: id, Replicas: members, PreferredReplicaId: "r1", Retention: retention})); err != nil {
		c.t.Fatalf("CreateRange(%s): %v", id, err)
	}
}

// status asks a live replica for its status of rangeID, around the
// Network; nil when it does not answer.
func (c *Cluster) status(rn *replicaNode, rangeID string) *tenurev1.RangeStatus {
	c.mu.Lock()
	srv := rn.srv
	c.mu.Unlock()
	if srv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	cl := tenurev1connect.NewReplicaServiceClient(c.direct, srv.URL(), transport.ClientOptions()...)
	resp, err := cl.GetStatus(ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: rangeID}))
	if err != nil || len(resp.Msg.GetRanges()) != 1 {
		return nil
	}
	return resp.Msg.GetRanges()[0]
}

// leader returns the replica acting as rangeID's leader at the highest
// epoch, or nil.
func (c *Cluster) leader(rangeID string) *replicaNode {
	var best *replicaNode
	var bestEpoch uint64
	for _, rn := range c.replicas {
		st := c.status(rn, rangeID)
		if st != nil && st.GetRole() == tenurev1.Role_ROLE_LEADER && st.GetEpoch() == st.GetFencedEpoch() && st.GetEpoch() > bestEpoch {
			best, bestEpoch = rn, st.GetEpoch()
		}
	}
	return best
}

// logStart is the highest log start of rangeID a live replica reports
// (0 when none answers).
func (c *Cluster) logStart(rangeID string) uint64 {
	var start uint64
	for _, rn := range c.replicas {
		if st := c.status(rn, rangeID); st != nil {
			start = max(start, st.GetLogStart())
		}
	}
	return start
}

// waitLeader waits (bounded) for a leader of rangeID.
func (c *Cluster) waitLeader(rangeID string, within time.Duration) *replicaNode {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if l := c.leader(rangeID); l != nil {
			return l
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// sampleHWMs polls every live replica's HWM and log start of rangeID every
// 50ms until ctx is done, and returns the samples.
func (c *Cluster) sampleHWMs(ctx context.Context, rangeID string) []check.HWMSample {
	var out []check.HWMSample
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, rn := range c.replicas {
			c.mu.Lock()
			inc := rn.incarnation
			c.mu.Unlock()
			st := c.status(rn, rangeID)
			c.mu.Lock()
			// A restart between the two reads would credit the old
			// incarnation's HWM to the new one.
			same := inc == rn.incarnation
			c.mu.Unlock()
			if st != nil && same {
				out = append(out, check.HWMSample{Replica: rn.id, Incarnation: inc, Range: rangeID, HWM: st.GetHighWaterMark(),
					LogStart: st.GetLogStart(), At: time.Now()})
				c.obs.fetchTruncations(rn.id, inc, st)
			}
		}
		select {
		case <-ctx.Done():
			return out
		case <-tick.C:
		}
	}
}

// finalLogs stops every replica and reads each one's log of rangeID from
// its store directly: every record, committed or not, its HWM, fence and
// epoch history.
func (c *Cluster) finalLogs(rangeID string) []check.ReplicaLog {
	c.t.Helper()
	for _, p := range c.promoters {
		p.stop()
	}
	var out []check.ReplicaLog
	for _, rn := range c.replicas {
		c.killReplica(rn)
		st, err := logstore.Open(rn.dir, logstore.Options{Logger: c.log, JournalFS: rn.jfs})
		if err != nil {
			c.t.Fatalf("reopen %s: %v", rn.id, err)
		}
		out = append(out, dumpRange(c.t, st, rn.id, rangeID)...)
		if err := st.Close(); err != nil {
			c.t.Fatalf("close %s: %v", rn.id, err)
		}
	}
	return out
}

func dumpRange(t testing.TB, st *logstore.Store, replicaID, rangeID string) []check.ReplicaLog {
	t.Helper()
	r, ok := st.Range(rangeID)
	if !ok {
		return nil // never fenced for this range
	}
	l := check.ReplicaLog{Replica: replicaID, Range: rangeID, LogStart: r.LogStart(), LogEnd: r.LogEnd(), HWM: r.HWM(), FencedEpoch: r.State().FencedEpoch}
	for _, h := range r.History() {
		l.History = append(l.History, check.EpochStart{Epoch: h.Epoch, Start: h.Start})
	}
	for from := l.LogStart; from < l.LogEnd; {
		recs, err := r.Read(from, 0, 0)
		if err != nil {
			t.Fatalf("read %s/%s at %d: %v", replicaID, rangeID, from, err)
		}
		if len(recs) == 0 {
			t.Fatalf("read %s/%s at %d: nothing, log ends at %d", replicaID, rangeID, from, l.LogEnd)
		}
		for _, x := range recs {
			l.Records = append(l.Records, check.Record{Offset: x.GetOffset(), Epoch: x.GetEpoch(), Value: x.GetValue(), EpochStart: x.GetEpochStart()})
		}
		from = recs[len(recs)-1].GetOffset() + 1
	}
	return []check.ReplicaLog{l}
}
