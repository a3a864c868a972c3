package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenurelog/tenure/internal/metrics"
	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

const (
	// DefaultPrefix is where the service keeps its keys unless told otherwise.
	DefaultPrefix = "/tenure/"

	// DefaultSessionTTL is the TTL of a session opened with ttl_ms 0. Two
	// seconds is etcd's minimum with its default 1 s election timeout (etcd
	// rounds 1.5 election timeouts up to whole seconds), and failover does not
	// wait for it anyway: the promoter also acts on direct evidence.
	DefaultSessionTTL = 2 * time.Second

	// MaxSessionTTL bounds a session's TTL. A dead holder keeps its leases
	// for up to one TTL; beyond minutes the lease no longer detects failure.
	MaxSessionTTL = 10 * time.Minute

	// MaxKeepAliveRanges bounds the ranges one KeepAlive names. A KeepAlive
	// of this many ranges is ~1.5 MB at most (well inside
	// wire.MaxMessageBytes) and one paged etcd range read; the Keeper splits
	// a larger held set into several requests.
	MaxKeepAliveRanges = 10_000

	// MaxWatchRanges bounds the ranges one WatchLeases names; a watcher of
	// more watches all.
	MaxWatchRanges = 10_000

	// MaxHolderAddressBytes bounds a holder address (shown with its leases).
	MaxHolderAddressBytes = 512

	// DefaultListLimit and MaxListLimit are ListRanges' page sizes (0 means
	// the default; larger limits are lowered to the maximum).
	DefaultListLimit = 100
	MaxListLimit     = 1000

	// DefaultCompactionInterval is how often the service compacts etcd's
	// history (WithCompaction), kube-apiserver's default.
	DefaultCompactionInterval = 5 * time.Minute

	// DefaultRequestTimeout bounds the etcd work of one request, so a
	// leaderless etcd answers Unavailable instead of holding callers forever.
	DefaultRequestTimeout = 5 * time.Second

	// epochPage bounds one range read of epoch keys (a keep-alive's). 4096
	// keys of ~40 bytes is a ~160 KB answer; more keys take more pages.
	epochPage = 4096
)

// Service implements tenure.v1.LeaseService on etcd. It is safe for
// concurrent use; see the package comment for what it stores.
type Service struct {
	kv      clientv3.KV
	leases  clientv3.Lease
	watcher clientv3.Watcher

	keys           layout
	defaultTTL     time.Duration
	requestTimeout time.Duration
	log            *slog.Logger
	// compactEvery is the compaction interval (WithCompaction); 0: none.
	compactEvery time.Duration

	// minTTLSeconds is etcd's minimum lease TTL as last observed: etcd
	// silently raises a shorter TTL to it, so OpenSession refuses TTLs below
	// it instead of granting a session that lives longer than asked.
	minTTLSeconds atomic.Int64

	// ttls remembers sessions' remaining TTLs for a moment (remaining).
	ttls ttlSamples
	// sessions remembers sessions resolved by id (sessionCache).
	sessions sessionCache

	closeOnce sync.Once
	closing   chan struct{}

	// metrics receives the RPC series (WithMetrics); nil: none.
	metrics prometheus.Registerer
	rpc     *metrics.RPC
}

var _ tenurev1connect.LeaseServiceHandler = (*Service)(nil)

// Option configures a Service.
type Option func(*Service)

// WithPrefix sets the etcd key prefix (default DefaultPrefix). A prefix not
// ending in "/" gets one. Instances that share a prefix share ranges.
func WithPrefix(p string) Option {
	return func(s *Service) {
		if !strings.HasSuffix(p, "/") {
			p += "/"
		}
		s.keys = layout{prefix: p}
	}
}

// WithDefaultTTL sets the TTL of sessions opened with ttl_ms 0 (default
// DefaultSessionTTL). It must be whole seconds and at least etcd's minimum.
func WithDefaultTTL(d time.Duration) Option { return func(s *Service) { s.defaultTTL = d } }

// WithRequestTimeout bounds the etcd work of one request (default
// DefaultRequestTimeout).
func WithRequestTimeout(d time.Duration) Option { return func(s *Service) { s.requestTimeout = d } }

// WithCompaction sets how often the service compacts etcd's revision
// history, keeping one interval of it (default DefaultCompactionInterval; 0
// turns it off). etcd keeps every revision of every key until compacted:
// epoch grants, lease binds, membership changes and transition records for
// months fill its backend to its quota (2 GiB by default), after which it
// refuses every write. Only etcd's own --auto-compaction-* flags compacted
// it, and an etcd run without them grew for ever. Compaction is
// keyspace-wide: turn it off when the etcd is shared with applications
// that need a longer history, and compact there.
func WithCompaction(every time.Duration) Option {
	return func(s *Service) { s.compactEvery = every }
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(s *Service) { s.log = l } }

// WithMetrics registers the service's series on reg: every RPC counted by
// procedure and code, and timed (internal/metrics.RPC). Default: none.
func WithMetrics(reg prometheus.Registerer) Option { return func(s *Service) { s.metrics = reg } }

// New returns a Service on cli. It asks etcd once for its minimum lease TTL
// (bounded by ctx) and checks the default TTL against it, so a misconfigured
// default fails at start rather than on every OpenSession.
func New(ctx context.Context, cli *clientv3.Client, opts ...Option) (*Service, error) {
	s := &Service{
		kv:             cli.KV,
		leases:         cli.Lease,
		watcher:        cli.Watcher,
		keys:           layout{prefix: DefaultPrefix},
		defaultTTL:     DefaultSessionTTL,
		requestTimeout: DefaultRequestTimeout,
		log:            slog.Default(),
		compactEvery:   DefaultCompactionInterval,
		closing:        make(chan struct{}),
	}
	for _, o := range opts {
		o(s)
	}
	if s.keys.prefix == "/" || s.keys.prefix == "" {
		return nil, errors.New("lease: the key prefix must not be empty")
	}
	if s.requestTimeout <= 0 {
		return nil, fmt.Errorf("lease: request timeout %v must be positive", s.requestTimeout)
	}
	if s.compactEvery < 0 {
		return nil, fmt.Errorf("lease: compaction interval %v must not be negative", s.compactEvery)
	}
	if s.metrics != nil {
		var err error
		if s.rpc, err = metrics.NewRPC(s.metrics); err != nil {
			return nil, fmt.Errorf("lease: register metrics: %w", err)
		}
	}
	if s.defaultTTL%time.Second != 0 || checkTTL(s.defaultTTL.Milliseconds()) != nil {
		return nil, fmt.Errorf("lease: default TTL %v: want whole seconds, at least 1s and at most %v (etcd counts TTLs in seconds)", s.defaultTTL, MaxSessionTTL)
	}
	minTTL, err := s.probeMinTTL(ctx)
	if err != nil {
		return nil, err
	}
	if s.defaultTTL < time.Duration(minTTL)*time.Second {
		return nil, fmt.Errorf("lease: default TTL %v is below etcd's minimum lease TTL of %ds", s.defaultTTL, minTTL)
	}
	if s.compactEvery > 0 {
		go s.compactLoop()
	}
	return s, nil
}

// compactLoop compacts etcd's history every compactEvery, to the revision
// it read one interval before: a watcher (the promoter's, WatchLeases) up
// to an interval behind resumes where it was, and one further behind is
// told the history is compacted and re-reads the current state, as both
// already do after etcd's own compaction. Several instances on one etcd
// each compact; a revision already compacted answers ErrCompacted, which
// is fine. Until Close.
func (s *Service) compactLoop() {
	t := time.NewTicker(s.compactEvery)
	defer t.Stop()
	var prev int64
	for {
		select {
		case <-s.closing:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.requestTimeout)
		// Any read answers the store's current revision in its header.
		resp, err := s.kv.Get(ctx, s.keys.epochs(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err == nil && prev > 0 {
			if _, cerr := s.kv.Compact(ctx, prev); cerr != nil && !errors.Is(cerr, rpctypes.ErrCompacted) {
				err = cerr
			}
		}
		cancel()
		if err != nil {
			// The next tick tries again; a revision not compacted now is
			// compacted with the next one.
			s.log.Warn("lease: compacting etcd's history failed; retried next interval", "interval", s.compactEvery, "err", err)
			continue
		}
		prev = resp.Header.Revision
	}
}

// probeMinTTL learns etcd's minimum lease TTL: it grants a 1 s lease, which
// etcd raises to its minimum, and revokes it. The minimum is 1.5 election
// timeouts rounded up to whole seconds (2 s for etcd's default 1 s), a
// server setting no API reports directly.
func (s *Service) probeMinTTL(ctx context.Context) (int64, error) {
	g, err := s.leases.Grant(ctx, 1)
	if err != nil {
		return 0, fmt.Errorf("lease: probe etcd's minimum lease TTL: %w", err)
	}
	if _, err := s.leases.Revoke(ctx, g.ID); err != nil {
		s.log.Warn("lease: revoke the TTL probe lease; it expires by itself", "lease", int64(g.ID), "err", err)
	}
	s.minTTLSeconds.Store(g.TTL)
	return g.TTL, nil
}

// Registration is the service's entry for transport.Serve, built with
// transport.HandlerOptions (read limit, uncompressed responses, interceptors).
func (s *Service) Registration() transport.Registration {
	var extra []connect.HandlerOption
	if s.rpc != nil {
		extra = append(extra, connect.WithInterceptors(s.rpc))
	}
	path, h := tenurev1connect.NewLeaseServiceHandler(s, transport.HandlerOptions(extra...)...)
	return transport.Registration{Name: tenurev1connect.LeaseServiceName, Path: path, Handler: h}
}

// Close ends every WatchLeases stream with Unavailable, so watchers resume on
// another instance, and lets a server's graceful shutdown complete. Unary
// calls in flight finish normally. It does not close the etcd client, which
// the caller owns.
func (s *Service) Close() {
	s.closeOnce.Do(func() { close(s.closing) })
}

// bound is a handler's context: the caller's, with the service's own bound on
// etcd work, whose cause toConnect recognises.
func (s *Service) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, s.requestTimeout, errStoreTimeout)
}

// unary runs one unary handler: bounded context, and errors mapped in one place.
func unary[Req, Res any](s *Service, ctx context.Context, req *connect.Request[Req], fn func(context.Context, *Req) (*Res, error)) (*connect.Response[Res], error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	res, err := fn(ctx, req.Msg)
	if err != nil {
		return nil, toConnect(ctx, err)
	}
	return connect.NewResponse(res), nil
}

// CreateRange implements LeaseService.CreateRange.
func (s *Service) CreateRange(ctx context.Context, req *connect.Request[tenurev1.CreateRangeRequest]) (*connect.Response[tenurev1.CreateRangeResponse], error) {
	return unary(s, ctx, req, s.createRange)
}

// GetRange implements LeaseService.GetRange.
func (s *Service) GetRange(ctx context.Context, req *connect.Request[tenurev1.GetRangeRequest]) (*connect.Response[tenurev1.GetRangeResponse], error) {
	return unary(s, ctx, req, s.getRange)
}

// ListRanges implements LeaseService.ListRanges.
func (s *Service) ListRanges(ctx context.Context, req *connect.Request[tenurev1.ListRangesRequest]) (*connect.Response[tenurev1.ListRangesResponse], error) {
	return unary(s, ctx, req, s.listRanges)
}

// SetReplicas implements LeaseService.SetReplicas.
func (s *Service) SetReplicas(ctx context.Context, req *connect.Request[tenurev1.SetReplicasRequest]) (*connect.Response[tenurev1.SetReplicasResponse], error) {
	return unary(s, ctx, req, s.setReplicas)
}

// OpenSession implements LeaseService.OpenSession.
func (s *Service) OpenSession(ctx context.Context, req *connect.Request[tenurev1.OpenSessionRequest]) (*connect.Response[tenurev1.OpenSessionResponse], error) {
	return unary(s, ctx, req, s.openSession)
}

// KeepAlive implements LeaseService.KeepAlive.
func (s *Service) KeepAlive(ctx context.Context, req *connect.Request[tenurev1.KeepAliveRequest]) (*connect.Response[tenurev1.KeepAliveResponse], error) {
	return unary(s, ctx, req, s.keepAlive)
}

// CloseSession implements LeaseService.CloseSession.
func (s *Service) CloseSession(ctx context.Context, req *connect.Request[tenurev1.CloseSessionRequest]) (*connect.Response[tenurev1.CloseSessionResponse], error) {
	return unary(s, ctx, req, s.closeSession)
}

// GrantEpoch implements LeaseService.GrantEpoch.
func (s *Service) GrantEpoch(ctx context.Context, req *connect.Request[tenurev1.GrantEpochRequest]) (*connect.Response[tenurev1.GrantEpochResponse], error) {
	return unary(s, ctx, req, s.grantEpoch)
}

// BindLease implements LeaseService.BindLease.
func (s *Service) BindLease(ctx context.Context, req *connect.Request[tenurev1.BindLeaseRequest]) (*connect.Response[tenurev1.BindLeaseResponse], error) {
	return unary(s, ctx, req, s.bindLease)
}

// ReleaseLease implements LeaseService.ReleaseLease.
func (s *Service) ReleaseLease(ctx context.Context, req *connect.Request[tenurev1.ReleaseLeaseRequest]) (*connect.Response[tenurev1.ReleaseLeaseResponse], error) {
	return unary(s, ctx, req, s.releaseLease)
}

// GetLease implements LeaseService.GetLease.
func (s *Service) GetLease(ctx context.Context, req *connect.Request[tenurev1.GetLeaseRequest]) (*connect.Response[tenurev1.GetLeaseResponse], error) {
	return unary(s, ctx, req, s.getLease)
}

// ChangeMembership implements LeaseService.ChangeMembership.
func (s *Service) ChangeMembership(ctx context.Context, req *connect.Request[tenurev1.ChangeMembershipRequest]) (*connect.Response[tenurev1.ChangeMembershipResponse], error) {
	return unary(s, ctx, req, s.changeMembership)
}

// CompleteMembershipChange implements LeaseService.CompleteMembershipChange.
func (s *Service) CompleteMembershipChange(ctx context.Context, req *connect.Request[tenurev1.CompleteMembershipChangeRequest]) (*connect.Response[tenurev1.CompleteMembershipChangeResponse], error) {
	return unary(s, ctx, req, s.completeMembershipChange)
}

// SetRetention implements LeaseService.SetRetention.
func (s *Service) SetRetention(ctx context.Context, req *connect.Request[tenurev1.SetRetentionRequest]) (*connect.Response[tenurev1.SetRetentionResponse], error) {
	return unary(s, ctx, req, s.setRetention)
}

// DeleteRange implements LeaseService.DeleteRange.
func (s *Service) DeleteRange(ctx context.Context, req *connect.Request[tenurev1.DeleteRangeRequest]) (*connect.Response[tenurev1.DeleteRangeResponse], error) {
	return unary(s, ctx, req, s.deleteRange)
}
