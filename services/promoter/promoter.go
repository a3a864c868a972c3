// Package promoter changes a range's leader safely (docs/design.md "Promotion"):
// grant a new epoch, fence every replica and read its log in one round trip,
// count only fenced replicas, decide the candidate and truncations with the
// pure Decide, reconcile while fenced, adopt, bind the lease to the new leader
// and record the transition in etcd.
//
// The promoter acts on the lease service's expiry events and on direct
// evidence (a leader refusing connections or missing several probes in a
// row). Safety never depends on either: fencing is what stops a deposed
// leader. Promoters run as an etcd-elected group; only the elected one acts.
package promoter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenurelog/tenure/internal/metrics"
	"github.com/tenurelog/tenure/pkg/leaseclient"
	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// Config configures a promoter. Zero durations take the documented defaults.
type Config struct {
	// ID names this promoter in elections, leases and transition records.
	ID string
	// URL is the base URL other promoters reach this one at (its advertised
	// address). While elected it is published with the election, and a
	// standby forwards operators' requests there (forward.go). Empty: this
	// promoter is never forwarded to; standbys refuse, naming it.
	URL string
	// Etcd holds the election and the transition records.
	Etcd *clientv3.Client
	// Prefix of every etcd key ("/tenure/" by default); the lease service
	// must use the same one.
	Prefix string
	// LeaseURL is the lease service's base URL.
	LeaseURL string
	// LeaseURLs are more instances of the same lease service (over the
	// same etcd), tried after LeaseURL when it does not answer
	// (pkg/leaseclient says which calls are sent again). Optional.
	LeaseURLs []string
	// HTTPClient reaches the lease service and replicas; a seam for fault
	// injection. Default transport.NewHTTPClient().
	HTTPClient *http.Client
	Logger     *slog.Logger

	// FenceTimeout bounds the fence round (default 1s): a replica that has
	// not answered by then does not count.
	FenceTimeout time.Duration
	// FenceGrace is how long to wait for stragglers once a quorum of fenced
	// replicas with known history is in (default 20ms): more answers mean
	// fewer replicas left to the reconcile loop, but never more safety.
	FenceGrace time.Duration
	// RPCTimeout bounds each truncate, adopt and lease call (default 2s).
	RPCTimeout time.Duration
	// ProbeInterval is how often each replica is probed (default 100ms).
	ProbeInterval time.Duration
	// StatusInterval is how often a probe reads a replica's full status
	// (every range it hosts) instead of only checking that it answers
	// (default 1s). The full status is what finds a leader that no longer
	// leads at its epoch and members to reconcile.
	StatusInterval time.Duration
	// ProbeTimeout bounds one probe (default 300ms). It is longer than the
	// interval on purpose: a leader busy with a burst of work (a mass
	// failover lands thousands of fences on the survivors) answers slowly,
	// and promoting it away for that only moves the load around. A dead
	// process is found faster anyway: its connections are refused.
	ProbeTimeout time.Duration
	// ProbeMisses is how many consecutive failed probes of a leader trigger a
	// promotion once the lease service no longer sees its lease live
	// (default 3). A refused connection triggers one at once.
	ProbeMisses int
	// MaxParallel bounds concurrent promotions (default 1024). It bounds the
	// promoter's own work (goroutines, plans in memory), not the calls the
	// promotions make: those go through the coalescers (batch.go), at most
	// two batched calls of at most wire.MaxRangesPerBatch ranges in flight
	// per server and kind (or 64 single-range calls to a server without the
	// batched calls). A replica that led a thousand ranges is so promoted
	// away in one wave of large batches (BenchmarkMassFailover: ~800 ranges
	// re-led in 1.7-2.1 s at 1024, 2.5-2.8 s at 256, whose waves of 256
	// each paid every round trip in turn). A call may wait for the batches
	// ahead of it (at most four rounds at 1,000 ranges), which counts
	// against its deadline: a fence of a range not yet hosted (bootstrap)
	// is slow, and FenceTimeout bounds the wait too.
	MaxParallel int
	// SessionTTL is the promoter's own lease session TTL (default 5s).
	SessionTTL time.Duration
	// RefreshInterval is how often the range list is re-read from the lease
	// service (default 2s); lease events make most refreshes redundant.
	RefreshInterval time.Duration
	// RetryMax bounds the backoff between failed promotion attempts
	// (default 2s); attempts start at 50ms and double, with jitter.
	RetryMax time.Duration
	// KeepTransitions bounds the transition records kept per range
	// (default 100, at least recordedHWMs): writing a range's record at
	// epoch e deletes its records below epoch e-KeepTransitions+1, in the
	// same transaction. Every record has an epoch of its own, so at most
	// KeepTransitions remain, the newest; fewer when epochs were granted
	// without a transition (a promotion that failed after its grant).
	KeepTransitions int
	// Metrics, when set, receives the promoter's series (metrics.go); nil:
	// they are kept but not exported.
	Metrics prometheus.Registerer
	// HandoverCatchUp bounds how long a planned handover waits, before it
	// fences anything, for its target to hold every committed record
	// (default 5s); then it is refused and nothing changed (handover.go).
	HandoverCatchUp time.Duration
	// NoRebalance turns leader rebalancing off (rebalance.go). It is on by
	// default, like Kafka's auto.leader.rebalance.enable.
	NoRebalance bool
	// RebalanceInterval is how often the elected promoter looks for ranges
	// led elsewhere than their preferred replica (default 30s). A range
	// whose leader changed within the last interval is left alone.
	RebalanceInterval time.Duration
	// RebalanceMax bounds the handovers one rebalance round runs (default
	// 8), one after the other: each is a planned handover's gap for its
	// range, and a mass failover's thousand ranges move back over rounds,
	// not in one storm of promotions.
	RebalanceMax int
}

func (c *Config) defaults() error {
	if c.ID == "" {
		return errors.New("promoter: Config.ID is empty")
	}
	if c.Etcd == nil {
		return errors.New("promoter: Config.Etcd is nil")
	}
	if c.LeaseURL == "" {
		return errors.New("promoter: Config.LeaseURL is empty")
	}
	setDur := func(d *time.Duration, def time.Duration) {
		if *d <= 0 {
			*d = def
		}
	}
	if c.Prefix == "" {
		c.Prefix = "/tenure/"
	}
	if c.HTTPClient == nil {
		c.HTTPClient = transport.NewHTTPClient()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	setDur(&c.FenceTimeout, time.Second)
	setDur(&c.FenceGrace, 20*time.Millisecond)
	setDur(&c.RPCTimeout, 2*time.Second)
	setDur(&c.ProbeInterval, 100*time.Millisecond)
	setDur(&c.ProbeTimeout, 300*time.Millisecond)
	setDur(&c.StatusInterval, time.Second)
	setDur(&c.SessionTTL, 5*time.Second)
	setDur(&c.RefreshInterval, 2*time.Second)
	setDur(&c.RetryMax, 2*time.Second)
	setDur(&c.HandoverCatchUp, 5*time.Second)
	setDur(&c.RebalanceInterval, 30*time.Second)
	if c.RebalanceMax <= 0 {
		c.RebalanceMax = 8
	}
	if c.ProbeMisses <= 0 {
		c.ProbeMisses = 3
	}
	if c.MaxParallel <= 0 {
		c.MaxParallel = 1024
	}
	if c.KeepTransitions <= 0 {
		c.KeepTransitions = 100
	}
	// An unsafe promotion reads the latest recordedHWMs records for the
	// highest HWM ever committed: keeping fewer would make it forget.
	c.KeepTransitions = max(c.KeepTransitions, recordedHWMs)
	return nil
}

// Promoter runs promotions. Create it with New, serve Handlers(), and call
// Run to campaign and watch; Promote works only while elected.
type Promoter struct {
	cfg   Config
	log   *slog.Logger
	lease tenurev1connect.LeaseServiceClient
	// metrics are the promotion series (metrics.go), kept whether or not
	// Config.Metrics exports them; rpc counts and times the
	// PromoterService calls (only with Config.Metrics).
	metrics *promoterMetrics
	rpc     *metrics.RPC

	clientsMu sync.Mutex
	clients   map[string]tenurev1connect.ReplicaServiceClient // by address, or replicaKey
	// replicaBatch batches fences and adoptions per replica (replicaKey), and
	// leaseBatch grants and binds (batch.go).
	replicaBatch map[string]*replicaBatchers
	leaseBatch   *leaseBatchers

	// sem bounds concurrent promotions (Config.MaxParallel).
	sem chan struct{}

	mu       sync.Mutex
	elected  bool
	leaderID string // the elected promoter, as last seen
	// leaderURL is the elected promoter's URL, as published with the
	// election ("" when it published none: an older promoter, or no URL).
	leaderURL string
	session   int64 // this promoter's lease session, 0 until opened
	ranges    map[string]*rangeState
	// inflight holds ranges with a promotion or reconcile running, so the
	// same range is never promoted twice at once.
	inflight map[string]bool
	probes   map[string]*probeState // by replica address

	// electionErr is why the last election round failed ("" once a round
	// got an election session): why this promoter is not elected.
	electionErr string

	// warnMu guards the recurring failures' log state (logRecurring).
	warnMu                               sync.Mutex
	electionWarn, refreshWarn, watchWarn recurring

	// records writes transition records in batches (recorder).
	records recorder

	// forwardMu guards forwards: a client of the elected promoter per URL.
	forwardMu sync.Mutex
	forwards  map[string]tenurev1connect.PromoterServiceClient

	// testHookAfterFence, when set by a test, runs between the fence round
	// and the plan, to interleave two promoters deterministically.
	testHookAfterFence func(rangeID string, epoch uint64)
	// testHookStep, when set by a test, runs after each promotion step.
	testHookStep func(step string)
	// testStop stops a promoter a test started (set by the test harness).
	testStop func()
}

// New builds a promoter; it does nothing until Run.
func New(cfg Config) (*Promoter, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	lc, err := leaseclient.New(cfg.HTTPClient, append([]string{cfg.LeaseURL}, cfg.LeaseURLs...))
	if err != nil {
		return nil, fmt.Errorf("promoter: %w", err)
	}
	p := &Promoter{
		cfg:          cfg,
		log:          cfg.Logger.With("promoter", cfg.ID),
		lease:        lc,
		clients:      map[string]tenurev1connect.ReplicaServiceClient{},
		replicaBatch: map[string]*replicaBatchers{},
		sem:          make(chan struct{}, cfg.MaxParallel),
		ranges:       map[string]*rangeState{},
		inflight:     map[string]bool{},
		probes:       map[string]*probeState{},
		metrics:      newPromoterMetrics(),
	}
	p.leaseBatch = p.newLeaseBatchers()
	if cfg.Metrics != nil {
		if err := p.registerMetrics(cfg.Metrics); err != nil {
			return nil, fmt.Errorf("promoter: register metrics: %w", err)
		}
		var err error
		if p.rpc, err = metrics.NewRPC(cfg.Metrics); err != nil {
			return nil, fmt.Errorf("promoter: register metrics: %w", err)
		}
	}
	return p, nil
}

func (p *Promoter) replica(addr string) tenurev1connect.ReplicaServiceClient {
	return p.client(addr, addr)
}

// replicaFor returns the client for calls meant for replica r: each names
// r, so that whatever else answers at r's address refuses rather than
// being counted as r (transport.ReplicaIDHeader).
func (p *Promoter) replicaFor(r *tenurev1.Replica) tenurev1connect.ReplicaServiceClient {
	return p.client(replicaKey(r), r.GetAddress(), transport.ForReplica(r.GetId()))
}

// replicaKey keys the clients and batchers of replica r: its id and address.
func replicaKey(r *tenurev1.Replica) string { return r.GetId() + " " + r.GetAddress() }

func (p *Promoter) client(key, addr string, opts ...connect.ClientOption) tenurev1connect.ReplicaServiceClient {
	p.clientsMu.Lock()
	defer p.clientsMu.Unlock()
	c, ok := p.clients[key]
	if !ok {
		c = tenurev1connect.NewReplicaServiceClient(p.cfg.HTTPClient, addr, transport.ClientOptions(opts...)...)
		p.clients[key] = c
	}
	return c
}

// Elected reports whether this promoter currently holds the election.
func (p *Promoter) Elected() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.elected
}

// electionFailureLocked says why this promoter's election cannot run, or
// "" while it runs (elected or standing by): the operator's next step is
// then etcd, not the elected promoter. Promote's refusal and GetStatus's
// election_error both say it. p.mu is held.
func (p *Promoter) electionFailureLocked() string {
	if p.electionErr == "" {
		return ""
	}
	return fmt.Sprintf("its election on etcd %v fails: %s", p.cfg.Etcd.Endpoints(), p.electionErr)
}

func (p *Promoter) notElectedError() error {
	p.mu.Lock()
	leader, why := p.leaderID, p.electionFailureLocked()
	p.mu.Unlock()
	if leader == "" {
		leader = "unknown"
	}
	if why != "" {
		return connect.NewError(connect.CodeFailedPrecondition,
			fmt.Errorf("promoter %s is not elected; the elected promoter is %s; %s", p.cfg.ID, leader, why))
	}
	return connect.NewError(connect.CodeFailedPrecondition,
		fmt.Errorf("promoter %s is not elected; the elected promoter is %s", p.cfg.ID, leader))
}

// openSession opens this promoter's lease session: GrantEpoch binds the new
// epoch's lease to it until the new leader takes it over.
func (p *Promoter) openSession(ctx context.Context) (int64, error) {
	p.mu.Lock()
	id := p.session
	p.mu.Unlock()
	if id != 0 {
		return id, nil
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.RPCTimeout)
	defer cancel()
	resp, err := p.lease.OpenSession(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{
		HolderId: p.cfg.ID,
		TtlMs:    p.cfg.SessionTTL.Milliseconds(),
	}))
	if err != nil {
		return 0, fmt.Errorf("open lease session: %w", err)
	}
	p.mu.Lock()
	p.session = resp.Msg.GetSessionId()
	p.mu.Unlock()
	return resp.Msg.GetSessionId(), nil
}

// keepSession renews the promoter's session until ctx ends; a session that
// cannot be renewed is dropped and reopened on the next promotion.
func (p *Promoter) keepSession(ctx context.Context) {
	t := time.NewTicker(p.cfg.SessionTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.mu.Lock()
		id := p.session
		p.mu.Unlock()
		if id == 0 {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, p.cfg.RPCTimeout)
		_, err := p.lease.KeepAlive(cctx, connect.NewRequest(&tenurev1.KeepAliveRequest{SessionId: id}))
		cancel()
		if err != nil && ctx.Err() == nil {
			p.log.Warn("promoter lease session lost; will reopen", "session", id, "err", err)
			p.mu.Lock()
			if p.session == id {
				p.session = 0
			}
			p.mu.Unlock()
		}
	}
}
