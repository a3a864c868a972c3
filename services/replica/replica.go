// Package replica is tenure's replica service: each range's log in Badger
// (package logstore), replicated from the range's leader to its followers by
// fetch long polls, committed by quorum, and obedient to fences.
//
// A Replica hosts ranges and serves two Connect services for them:
// LogService (Append, Read, Tail: clients, leader only) and ReplicaService
// (Fetch between replicas; Fence, Truncate, Adopt from the promoter; status).
//
// # Roles
//
// A range is hosted from the first Fence that names it, unless the fence
// names this replica under another incarnation (its disk lost the range:
// refused, reported in status) or for an older generation of the range; a
// newer generation drops the data of the old one first (membership.go).
// DropRange deletes a range again. Fence(E) durably
// records fenced epoch E and stops the range acting under any lower epoch;
// Adopt(E, role) then makes it a leader or a follower at exactly E:
//
//   - A leader journals (E, log end) and fsyncs it, writes the epoch-start
//     record, and only then serves: it assigns offsets to appends and answers
//     fetches at E. Its HWM is the highest offset durable on a quorum
//     (commitPoint), counted only once its own epoch-start record is on a
//     quorum, and only from followers whose fetch position passed the KIP-320
//     check (checkFetch; checkFetchFrom once its log start moved: a follower
//     below it, or whose last epoch its trimmed history no longer holds, is
//     answered below_log_start).
//   - A follower runs one fetch loop against the leader it was told of,
//     writes what it receives (journaling each new epoch from the records' own
//     epochs), truncates when the leader answers a divergence (never below its
//     own HWM: a target below it stops the range as a safety violation), and
//     raises its HWM to min(leader HWM, its durable log end) and its log start
//     to min(leader's log start, its HWM). Told it is below the leader's log
//     start, it resets its log to that start if its HWM is at or below it
//     (what it lacks is committed and was deleted on purpose), and stops the
//     range otherwise.
//
// # Restart
//
// New reloads every range's durable state. A follower resumes fetching. A
// range that was leading comes back not serving (reported as FENCED, with
// its old epoch): its followers' progress, its lease and its group commit
// died with the process, and only a Fence at a higher epoch followed by an
// Adopt makes it act again. Truncate and Adopt at its old epoch are refused,
// so a promoter's late command cannot resurrect the old leadership.
//
// A range whose stored data failed its checks (logstore quarantined it)
// comes back HALTED with the reason: it answers no fence (FailedPrecondition
// naming the quarantine, so no promotion counts it as a known history) and
// serves nothing until it is dropped and rebuilt from its peers (tenurectl
// range rebuild); the replica's other ranges serve.
package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// LeaseGuard keeps a leader's lease alive. Package lease's Keeper implements
// it. Safety never depends on it (fencing alone stops a deposed leader from
// committing); it stops a leader that lost its lease from acknowledging
// appends and serving reads, so the promoter may act on lease expiry.
type LeaseGuard interface {
	// Hold starts keeping the lease of rangeID at epoch alive.
	Hold(rangeID string, epoch uint64)
	// Drop stops keeping it alive (the range was fenced or is closing).
	Drop(rangeID string, epoch uint64)
	// Valid reports whether the lease of rangeID at epoch is live now.
	Valid(rangeID string, epoch uint64) bool
}

// Config configures a Replica.
type Config struct {
	// ID is this replica's id (the range-id grammar). Required.
	ID string
	// Address is the base URL peers reach this replica at, e.g.
	// "http://127.0.0.1:7101"; followers are told the leader's. Required
	// (Start fills it from the listener when empty).
	Address string
	// DataDir holds the Badger log, the journals and per-range state. Required.
	DataDir string
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Lease guards leaders' leases; nil means no lease service: a leader's
	// lease is always valid.
	Lease LeaseGuard
	// Ranges, when set, is the lease service's word on a range, asked
	// before a fence hosts a range this replica does not hold and before a
	// fence jumps far above the range's current fence (control.go).
	// package lease's Keeper implements it. nil: fences are taken on the
	// promoter's word (mutual TLS already says who may fence).
	Ranges RangeSource
	// HTTPClient dials leaders for fetches; default transport.NewHTTPClient().
	// It is the seam tests use to partition a follower from its leader.
	HTTPClient connect.HTTPClient
	// StoreOptions are passed to logstore.Open (fault injection in tests).
	StoreOptions logstore.Options
	// FetchWait is how long a follower lets the leader hold a fetch with
	// nothing new; default 1s, at most wire.MaxFetchWaitMillis.
	FetchWait time.Duration
	// AppendTimeout bounds how long an append waits to commit before it
	// fails with DeadlineExceeded (outcome unknown); default 10s.
	AppendTimeout time.Duration
	// Metrics, when set, receives the replica's series (metrics.go); nil:
	// they are kept but not exported.
	Metrics prometheus.Registerer
	// RetentionInterval is how often the leader of each range applies its
	// retention policy (retention.go); default DefaultRetentionInterval.
	// Negative: never (nothing is removed).
	RetentionInterval time.Duration
	// Policies, when set, is where leaders re-read their ranges' retention
	// policies every RetentionInterval (one batched read), so a changed
	// policy applies without a promotion. package lease's Keeper implements
	// it. nil: a leader applies the policy its Adopt carried.
	Policies PolicySource
}

const (
	defaultFetchWait     = time.Second
	defaultAppendTimeout = 10 * time.Second
)

// Replica serves one process's hosted ranges. It implements
// tenurev1connect.LogServiceHandler and tenurev1connect.ReplicaServiceHandler.
type Replica struct {
	cfg Config
	log *slog.Logger
	// metrics are the event series (metrics.go), kept whether or not
	// Config.Metrics exports them.
	metrics *replicaMetrics

	// ctx is cancelled by Close (cause errClosed); every leader and fetch
	// loop runs under a context derived from it.
	ctx    context.Context
	cancel context.CancelCauseFunc
	// loops counts background goroutines (fetch loops, committers), so Close
	// returns only after they stopped touching the store.
	loops sync.WaitGroup
	// refused paces fetch loops whose leader address refuses connections.
	refused refusals
	// sessions are the fetch sessions to leader replicas, shared by every
	// range this replica follows on each (session_client.go).
	sessions fetchSessions
	// retentionDue are the ranges whose leaders asked the retention loop
	// for a pass before its next tick (retention.go).
	retentionDue retentionQueue
	// retained counts what retention removed since the loop last logged
	// it: one line per interval, not one per range and pass.
	retained retentionTally

	// incarnation is the data directory's id (incarnation.go), fixed for
	// the process's life.
	incarnation string
	// started is when New opened the store: with the pid, GetStatus tells
	// an operator which process answers, and since when.
	started time.Time

	mu sync.Mutex
	// gen is the store as opened now and the loops on its ranges; a
	// reopen after a want of space replaces it (reopen.go).
	gen *storeGen
	// reopening: the store is being closed and opened again; ranges is
	// empty meanwhile and lookups answer Unavailable (errStoreReopening).
	reopening bool
	ranges    map[string]*hosted
	// lost are the ranges a fence named with a member incarnation that is
	// not this one (membership.go), by range id. They are not hosted.
	lost   map[string]*tenurev1.LostRange
	closed bool
}

var (
	_ tenurev1connect.LogServiceHandler     = (*Replica)(nil)
	_ tenurev1connect.ReplicaServiceHandler = (*Replica)(nil)
)

// New opens the replica's store and reloads every hosted range: fenced
// epoch, role, HWM and history come back from disk, and followers resume
// fetching. A range that was leading comes back not serving (see the package
// comment).
func New(cfg Config) (*Replica, error) {
	if err := wire.ValidateReplicaID(cfg.ID); err != nil {
		return nil, fmt.Errorf("replica: config ID: %w", err)
	}
	if cfg.Address == "" {
		return nil, errors.New("replica: config Address is required")
	}
	if cfg.DataDir == "" {
		return nil, errors.New("replica: config DataDir is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = transport.NewHTTPClient()
	}
	if cfg.FetchWait <= 0 {
		cfg.FetchWait = defaultFetchWait
	}
	cfg.FetchWait = min(cfg.FetchWait, wire.MaxFetchWaitMillis*time.Millisecond)
	if cfg.AppendTimeout <= 0 {
		cfg.AppendTimeout = defaultAppendTimeout
	}
	if cfg.RetentionInterval == 0 {
		cfg.RetentionInterval = DefaultRetentionInterval
	}
	log := cfg.Logger.With("replica", cfg.ID)
	if cfg.StoreOptions.Logger == nil {
		cfg.StoreOptions.Logger = log
	}
	inc, err := readIncarnation(cfg.DataDir, cfg.ID)
	if err != nil {
		return nil, err
	}
	if inc != "" {
		// Before the store opens, which would make a lost one anew.
		if err := checkStoreKept(cfg.DataDir, inc); err != nil {
			return nil, err
		}
	}
	_, statErr := os.Stat(filepath.Join(cfg.DataDir, "badger"))
	hadStore := statErr == nil
	m := newReplicaMetrics()
	if cfg.StoreOptions.WALSyncSeconds == nil {
		cfg.StoreOptions.WALSyncSeconds = m.walSync
	}
	store, err := logstore.Open(cfg.DataDir, cfg.StoreOptions)
	if err != nil {
		return nil, fmt.Errorf("replica: open store in %s: %w", cfg.DataDir, err)
	}
	if inc == "" {
		// After the store's first Open (so an incarnation always comes
		// with a store: checkStoreKept), and before anything this
		// directory holds is answered for.
		if inc, err = newIncarnation(cfg.DataDir, hadStore, log); err != nil {
			_ = store.Close()
			return nil, err
		}
	}
	// Before anything is served, or a fence answered, from another
	// replica's data.
	if err := checkOwner(store, cfg.ID, inc, cfg.DataDir); err != nil {
		_ = store.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	s := &Replica{cfg: cfg, log: log, metrics: m, incarnation: inc, started: time.Now(), ctx: ctx, cancel: cancel, lost: map[string]*tenurev1.LostRange{}}
	s.gen = s.newGen(store)
	s.retentionDue = newRetentionQueue(cfg.RetentionInterval > 0)
	if cfg.Metrics != nil {
		if err := s.registerMetrics(cfg.Metrics); err != nil {
			cancel(errClosed)
			_ = store.Close()
			return nil, fmt.Errorf("replica: register metrics: %w", err)
		}
	}
	s.ranges = s.loadRanges(s.gen)
	if cfg.RetentionInterval > 0 {
		s.goLoop(func() { s.retentionLoop(cfg.RetentionInterval) })
	}
	s.goLoop(s.storeWatchLoop)
	log.Info("replica started", "incarnation", inc, "data_dir", cfg.DataDir, "ranges", len(s.ranges), "quarantined", len(store.Quarantined()))
	return s, nil
}

// loadRanges hosts every range of g's store as a restart does: its durable
// state comes back, followers resume fetching, a range that was leading
// comes back not serving, a quarantined one halted. New and a reopen
// (reopen.go) share it. The ranges are not visible yet: the caller
// installs them.
func (s *Replica) loadRanges(g *storeGen) map[string]*hosted {
	ids := g.store.RangeIDs()
	slices.Sort(ids)
	ranges := make(map[string]*hosted, len(ids))
	for _, id := range ids {
		r, ok := g.store.Range(id)
		if !ok {
			continue
		}
		h := s.newHosted(g, r)
		ranges[id] = h
		if q := r.Quarantined(); q != nil {
			h.quarantine(q)
			continue
		}
		h.resume()
	}
	return ranges
}

// Start builds a replica and serves it on listenAddr ("127.0.0.1:0" picks a
// port). An empty cfg.Address becomes the listener's URL.
func Start(cfg Config, listenAddr string) (*Replica, *transport.Server, error) {
	ln, err := net.Listen("tcp", listenAddr)
	if err != nil {
		return nil, nil, fmt.Errorf("replica: listen on %s: %w", listenAddr, err)
	}
	if cfg.Address == "" {
		cfg.Address = transport.Scheme() + "://" + ln.Addr().String()
	}
	s, err := New(cfg)
	if err != nil {
		_ = ln.Close()
		return nil, nil, err
	}
	return s, transport.ServeListener(ln, s.Handlers()...), nil
}

// Handlers are the Connect services to serve: LogService and ReplicaService.
// Their responses are never compressed (transport.HandlerOptions).
func (s *Replica) Handlers() []transport.Registration {
	lp, lh := tenurev1connect.NewLogServiceHandler(s, transport.HandlerOptions()...)
	rp, rh := tenurev1connect.NewReplicaServiceHandler(s, transport.HandlerOptions()...)
	// A request meant for another replica (its address reached this one)
	// is refused before it can fence or change anything here.
	return []transport.Registration{
		{Name: tenurev1connect.LogServiceName, Path: lp, Handler: transport.RequireReplica(s.cfg.ID, withStoppableStreams(lh, tenurev1connect.LogServiceAppendStreamProcedure))},
		{Name: tenurev1connect.ReplicaServiceName, Path: rp, Handler: transport.RequireReplica(s.cfg.ID, withStoppableStreams(rh, tenurev1connect.ReplicaServiceFetchStreamProcedure, tenurev1connect.ReplicaServiceFetchSessionProcedure))},
	}
}

// ID is the replica's id.
func (s *Replica) ID() string { return s.cfg.ID }

// Address is the replica's advertised base URL.
func (s *Replica) Address() string { return s.cfg.Address }

// Close stops serving: leaders stop acknowledging (waiting appends fail with
// Unavailable), fetch loops and committers stop, leases are dropped, and the
// store is closed. Close the server first, so no handler is mid-call.
func (s *Replica) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	hs := make([]*hosted, 0, len(s.ranges))
	for _, h := range s.ranges {
		hs = append(hs, h)
	}
	s.mu.Unlock()
	// Cancel before taking any range lock: an Adopt that holds a range lock
	// now either started its loops already (and Wait below waits for them)
	// or will see the cancelled context and start nothing.
	s.cancel(errClosed)
	for _, h := range hs {
		h.mu.Lock()
		h.stopActingLocked(errClosed)
		h.mu.Unlock()
	}
	// Every loop, the store watcher with any reopen in progress included,
	// has exited: the store is the last one opened, and nothing replaces it.
	s.loops.Wait()
	s.mu.Lock()
	store, gone := s.gen.store, s.reopening
	s.mu.Unlock()
	if gone {
		// A reopen closed the failed store and could not open it again.
		return nil
	}
	if err := store.Close(); err != nil {
		return fmt.Errorf("replica: close store: %w", err)
	}
	return nil
}

// Crash is for fault-injection tests: it stops the replica as a power loss
// would. The store fails first, so nothing the shutdown does reaches the
// disk, and after Close its files keep only what a machine losing power
// could keep (logstore.Store.PowerLoss).
func (s *Replica) Crash() error {
	after := s.currentStore().PowerLoss()
	// Close reports the failure the crash caused; that is the point.
	_ = s.Close()
	if err := after(); err != nil {
		return fmt.Errorf("replica: crash: %w", err)
	}
	return nil
}

// Halted reports the safety violation that stopped a range, if one did.
func (s *Replica) Halted(rangeID string) error {
	h, err := s.lookup(rangeID)
	if err != nil {
		return err
	}
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.halted
}

// lookup finds a hosted range: NotFound until a Fence named it.
func (s *Replica) lookup(rangeID string) (*hosted, error) {
	if err := wire.ValidateRangeID(rangeID); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	if s.reopening {
		return nil, errStoreReopening
	}
	h, ok := s.ranges[rangeID]
	if !ok {
		return nil, notFoundf("range %q is not hosted by replica %s (no fence has named it)", rangeID, s.cfg.ID)
	}
	return h, nil
}

// host finds or creates a range: a Fence is what brings a replica into a
// range. CreateRange is durable before the range is visible.
func (s *Replica) host(rangeID string) (*hosted, error) {
	if err := wire.ValidateRangeID(rangeID); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	if s.reopening {
		return nil, errStoreReopening
	}
	if h, ok := s.ranges[rangeID]; ok {
		return h, nil
	}
	r, err := s.gen.store.CreateRange(rangeID)
	if err != nil {
		return nil, fmt.Errorf("replica: create range %q: %w", rangeID, err)
	}
	h := s.newHosted(s.gen, r)
	s.ranges[rangeID] = h
	return h, nil
}

// hostedRanges returns the hosted ranges sorted by id.
func (s *Replica) hostedRanges() ([]*hosted, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	if s.reopening {
		return nil, errStoreReopening
	}
	out := make([]*hosted, 0, len(s.ranges))
	for _, h := range s.ranges {
		out = append(out, h)
	}
	slices.SortFunc(out, func(a, b *hosted) int { return strings.Compare(a.id, b.id) })
	return out, nil
}

// goLoop runs f as a background loop Close waits for.
func (s *Replica) goLoop(f func()) {
	s.loops.Add(1)
	go func() {
		defer s.loops.Done()
		f()
	}()
}

// httpClient is the client fetch loops dial leaders with.
func (s *Replica) httpClient() connect.HTTPClient { return s.cfg.HTTPClient }
