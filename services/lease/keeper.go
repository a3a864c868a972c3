package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

const (
	// keeperOpenTimeout bounds one OpenSession call of a Keeper.
	keeperOpenTimeout = 2 * time.Second

	// keeperRetryMax bounds the wait between OpenSession attempts.
	keeperRetryMax = time.Second
)

// validityMargin is how much earlier than the session's TTL a Keeper stops
// calling a lease valid. The TTL is counted on etcd's leader clock from when
// it applied the renewal, the validity on this process's clock from when the
// renewal was sent; the two clocks tick at slightly different rates, and a
// leader acts a little after it asked Valid (a scheduling delay, a GC pause).
// A tenth of the TTL covers clock-rate error far beyond any real clock's
// (parts per million) plus tens to hundreds of milliseconds of such delay.
func validityMargin(ttl time.Duration) time.Duration { return ttl / 10 }

// Keeper keeps a holder's leases alive: it opens one session and runs one
// keep-alive loop (every ttl/3) for every range the holder holds, so a holder
// of a thousand ranges sends one KeepAlive per interval, not a thousand.
//
// A replica leader consults Valid before acknowledging or serving reads. The
// replica service uses any value with Hold, Drop and Valid as its lease guard.
//
// Validity is measured from when the last successful renewal was SENT, not
// when its answer arrived: etcd restarted the TTL at some instant between
// the two, so send time + TTL is the earliest the session can expire. Counting
// from the answer would overstate the lease by a round trip, which is exactly
// the case of a slow or partitioned network where the lease matters.
//
// With a client of several lease service instances (pkg/leaseclient), a
// renewal one instance does not answer goes to the next under the same
// session id: instances are stateless over one etcd, so the same etcd lease
// is renewed and every range bound to it stays bound. The send time is
// still taken before the first try, so the instance that finally answered
// renewed the TTL after it: the bound stays that of a real renewal, only
// more conservative by the failed try.
//
// A session that expires takes every lease bound to it; the Keeper then
// opens a new session, and the ranges held under the old one are invalid:
// their leases are gone, and only a new binding, which the promoter makes,
// brings them back. The Keeper never rebinds by itself, but it learns of the
// binding: while a held range is lost, every renewal round also reads the
// range from the lease service (relearn), and a range whose lease for the
// held epoch is live on the open session is valid again. The holder need
// not call Hold again, and may not know it should: in issue 31 the promoter
// adopted the leader at a new epoch (Hold) a few milliseconds before the
// keeper found its session gone, and its bind then landed on the new
// session; waiting for a second Hold left the leader refusing, at an epoch
// whose lease the lease service showed live and held by it, for good.
type Keeper struct {
	client        tenurev1connect.LeaseServiceClient
	holderID      string
	holderAddress string
	requestedTTL  time.Duration
	log           *slog.Logger
	now           func() time.Time

	poke   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}

	mu sync.Mutex
	// session is the open session's id, 0 while none is open.
	session int64
	// ttl is the open session's granted TTL.
	ttl time.Duration
	// validUntil is when the last successful renewal of session runs out, minus
	// the margin. Invariant: zero whenever session is 0.
	validUntil time.Time
	held       map[string]*heldRange
	// opened is closed when the first session opens.
	opened  chan struct{}
	openErr error
	failing bool
}

// heldRange is one range the holder acts for, at one epoch.
type heldRange struct {
	epoch uint64
	// superseded: the service said the epoch moved on. Final for this epoch.
	superseded bool
	// lost: the session the lease was bound to ended. Cleared by a Hold of
	// the epoch, or when the lease service shows the epoch's lease live on
	// the open session (relearn).
	lost bool
}

// KeeperOption configures a Keeper.
type KeeperOption func(*Keeper)

// WithSessionTTL sets the session TTL (default 0: the lease service's
// default). Whole seconds, at least etcd's minimum.
func WithSessionTTL(d time.Duration) KeeperOption { return func(k *Keeper) { k.requestedTTL = d } }

// WithKeeperLogger sets the Keeper's logger (default slog.Default()).
func WithKeeperLogger(l *slog.Logger) KeeperOption { return func(k *Keeper) { k.log = l } }

// NewKeeper starts a Keeper for holderID (a replica or promoter id) that
// others reach at holderAddress. It returns at once; the session opens in the
// background, retrying until it does (Session waits for it). Close stops it.
func NewKeeper(client tenurev1connect.LeaseServiceClient, holderID, holderAddress string, opts ...KeeperOption) (*Keeper, error) {
	if err := checkHolder(holderID); err != nil {
		return nil, err
	}
	k := &Keeper{
		client:        client,
		holderID:      holderID,
		holderAddress: holderAddress,
		log:           slog.Default(),
		now:           time.Now,
		poke:          make(chan struct{}, 1),
		done:          make(chan struct{}),
		held:          map[string]*heldRange{},
		opened:        make(chan struct{}),
	}
	for _, o := range opts {
		o(k)
	}
	if k.requestedTTL < 0 || k.requestedTTL%time.Second != 0 {
		return nil, fmt.Errorf("lease: keeper TTL %v: want whole seconds (0 = the service's default)", k.requestedTTL)
	}
	ctx, cancel := context.WithCancel(context.Background())
	k.cancel = cancel
	go k.run(ctx)
	return k, nil
}

// Hold adds a range, at the epoch the holder now acts under, to the held set
// and renews at once, so a range already moved on is learnt about without
// waiting for the next interval. A Hold of an epoch below the one held is a
// late call from an older leadership and is ignored. A Hold of the epoch
// already held revives it after its session was lost (the promoter bound it
// again), but not after it was superseded: that epoch is over.
func (k *Keeper) Hold(rangeID string, epoch uint64) {
	if epoch == 0 {
		return // never granted: there is nothing to hold
	}
	k.mu.Lock()
	h := k.held[rangeID]
	switch {
	case h == nil || h.epoch < epoch:
		k.held[rangeID] = &heldRange{epoch: epoch}
	case h.epoch == epoch:
		h.lost = false
	}
	k.mu.Unlock()
	select {
	case k.poke <- struct{}{}:
	default:
	}
}

// Drop removes a range from the held set if it is held at epoch or below.
// A Drop for an epoch below the held one is a late call from an older
// leadership and must not end the newer one.
func (k *Keeper) Drop(rangeID string, epoch uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if h := k.held[rangeID]; h != nil && h.epoch <= epoch {
		delete(k.held, rangeID)
	}
}

// Valid reports whether the holder may act for rangeID at epoch now: the
// range is held at exactly that epoch, its session's last successful renewal
// was sent less than ttl - margin ago, and no renewal has answered that the
// range's epoch moved on.
func (k *Keeper) Valid(rangeID string, epoch uint64) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	h := k.held[rangeID]
	return h != nil && h.epoch == epoch && !h.superseded && !h.lost &&
		k.session != 0 && k.now().Before(k.validUntil)
}

// SessionID is the open session, 0 while none is open.
func (k *Keeper) SessionID() int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.session
}

// Range reads a range from the lease service: a replica asks it before it
// hosts a range or takes a fence far above its current one (replica.Config
// Ranges).
func (k *Keeper) Range(ctx context.Context, rangeID string) (*tenurev1.RangeInfo, error) {
	resp, err := k.client.GetRange(ctx, connect.NewRequest(&tenurev1.GetRangeRequest{RangeId: rangeID}))
	if err != nil {
		return nil, err
	}
	return resp.Msg.GetRange(), nil
}

// GetRanges reads many ranges from the lease service in one call (at most
// wire.MaxRangesPerBatch): a replica re-reads the retention policies of the
// ranges it leads with it (replica.Config Policies).
func (k *Keeper) GetRanges(ctx context.Context, rangeIDs []string) ([]*tenurev1.GetRangeResult, error) {
	resp, err := k.client.GetRanges(ctx, connect.NewRequest(&tenurev1.GetRangesRequest{RangeIds: rangeIDs}))
	if err != nil {
		return nil, err
	}
	return resp.Msg.GetResults(), nil
}

// Session waits until the Keeper's first session is open and returns its
// current session id. If ctx ends first, the error names the last reason
// opening failed.
func (k *Keeper) Session(ctx context.Context) (int64, error) {
	select {
	case <-k.opened:
		return k.SessionID(), nil
	case <-ctx.Done():
		k.mu.Lock()
		defer k.mu.Unlock()
		return 0, fmt.Errorf("lease: keeper session for %q not open: %w (last attempt: %v)", k.holderID, ctx.Err(), k.openErr)
	}
}

// Close stops renewing and closes the session (bounded by ctx), which
// releases every lease bound to it: watchers see RELEASED, and the promoter
// need not wait for a TTL to run out. Every range is invalid afterwards.
func (k *Keeper) Close(ctx context.Context) error {
	k.cancel()
	<-k.done
	k.mu.Lock()
	sid := k.session
	k.session, k.validUntil = 0, time.Time{}
	k.mu.Unlock()
	if sid == 0 {
		return nil
	}
	_, err := k.client.CloseSession(ctx, connect.NewRequest(&tenurev1.CloseSessionRequest{SessionId: sid}))
	if connect.CodeOf(err) == connect.CodeNotFound {
		return nil // expired already: closed all the same
	}
	return err
}

func (k *Keeper) run(ctx context.Context) {
	defer close(k.done)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-k.poke:
		}
		var wait time.Duration
		if k.SessionID() == 0 {
			wait = k.open(ctx)
		} else {
			wait = k.renew(ctx)
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wait)
	}
}

// open opens a session and returns how long to wait before the next step.
func (k *Keeper) open(ctx context.Context) time.Duration {
	retry := min(max(k.requestedTTL, DefaultSessionTTL)/3, keeperRetryMax)
	cctx, cancel := context.WithTimeout(ctx, keeperOpenTimeout)
	defer cancel()
	sent := k.now()
	resp, err := k.client.OpenSession(cctx, connect.NewRequest(&tenurev1.OpenSessionRequest{
		HolderId: k.holderID, HolderAddress: k.holderAddress, TtlMs: k.requestedTTL.Milliseconds(),
	}))
	k.mu.Lock()
	defer k.mu.Unlock()
	if err != nil {
		if k.openErr == nil {
			k.log.Warn("lease: keeper cannot open a session; retrying", "holder", k.holderID, "err", err)
		}
		k.openErr = err
		return retry
	}
	ttl := time.Duration(resp.Msg.GetTtlMs()) * time.Millisecond
	if ttl <= 0 {
		k.openErr = fmt.Errorf("lease service granted TTL %v", ttl)
		return retry
	}
	k.session, k.ttl, k.openErr = resp.Msg.GetSessionId(), ttl, nil
	// Granting the session started its TTL after this send: the same rule
	// as a renewal.
	k.validUntil = sent.Add(ttl - validityMargin(ttl))
	select {
	case <-k.opened:
	default:
		close(k.opened)
	}
	k.log.Info("lease: keeper session open", "holder", k.holderID, "session", k.session, "ttl", ttl)
	for _, h := range k.held {
		if h.lost && !h.superseded {
			// A lease may be bound to the new session already (the promoter
			// binds to the holder's newest): renew, and so relearn, now.
			return 0
		}
	}
	return ttl / 3
}

// renew sends one keep-alive round for the held set and returns how long to
// wait before the next.
func (k *Keeper) renew(ctx context.Context) time.Duration {
	k.mu.Lock()
	sid, ttl := k.session, k.ttl
	held := make([]*tenurev1.RangeEpoch, 0, len(k.held))
	var lost []string
	for id, h := range k.held {
		switch {
		case h.superseded:
		case h.lost:
			lost = append(lost, id)
		default:
			held = append(held, &tenurev1.RangeEpoch{RangeId: id, Epoch: h.epoch})
		}
	}
	k.mu.Unlock()
	interval := ttl / 3

	// One request renews the session; a held set beyond what one request
	// may name goes in several, and the round counts from the first send.
	var first time.Time
	ok := true
	for i := 0; i == 0 || i < len(held); i += MaxKeepAliveRanges {
		chunk := held[i:min(i+MaxKeepAliveRanges, len(held))]
		sent := k.now()
		if i == 0 {
			first = sent
		}
		// Bounded by the interval: a renewal answered later than that is
		// worth less than the next one, which is due.
		cctx, cancel := context.WithTimeout(ctx, interval)
		resp, err := k.client.KeepAlive(cctx, connect.NewRequest(&tenurev1.KeepAliveRequest{SessionId: sid, Held: chunk}))
		cancel()
		switch code := connect.CodeOf(err); {
		case err == nil:
			k.supersede(chunk, resp.Msg.GetSuperseded())
		case code == connect.CodeFailedPrecondition:
			// Renewed, but every range in the chunk moved on.
			k.supersede(chunk, supersededOf(err, chunk))
		case code == connect.CodeNotFound:
			k.lose(sid, err)
			return 0 // open a new session now
		case ctx.Err() != nil:
			return 0 // closing
		default:
			ok = false
			k.mu.Lock()
			if !k.failing {
				k.log.Warn("lease: keep-alive failed; leases stay valid until their TTL runs out", "holder", k.holderID, "session", sid, "err", err)
			}
			k.failing = true
			k.mu.Unlock()
		}
	}
	if ok {
		k.mu.Lock()
		if k.failing {
			k.log.Info("lease: keep-alive recovered", "holder", k.holderID, "session", sid)
			k.failing = false
		}
		if until := first.Add(ttl - validityMargin(ttl)); k.session == sid && until.After(k.validUntil) {
			k.validUntil = until
		}
		k.mu.Unlock()
		if len(lost) > 0 {
			k.relearn(ctx, sid, lost, interval)
		}
	}
	return interval
}

// relearn reads the lost ranges from the lease service and takes back each
// one whose lease for the held epoch is live on session sid, the open
// session: the promoter bound it there (it binds to the holder's newest
// session), so the holder holds it again, exactly as if it had been bound
// before the old session ended. Validity is still that of sid's renewals;
// a lease the promoter moves or supersedes later is learnt of like any
// other held range's, at the next renewal. A range whose epoch moved on is
// superseded. Ranges whose lease is elsewhere (gone with the old session,
// still on the promoter's) stay lost until a bind lands here. Each read
// is bounded by timeout; a failed one is retried at the next renewal.
func (k *Keeper) relearn(ctx context.Context, sid int64, ids []string, timeout time.Duration) {
	for i := 0; i < len(ids); i += wire.MaxRangesPerBatch {
		chunk := ids[i:min(i+wire.MaxRangesPerBatch, len(ids))]
		cctx, cancel := context.WithTimeout(ctx, timeout)
		resp, err := k.client.GetRanges(cctx, connect.NewRequest(&tenurev1.GetRangesRequest{RangeIds: chunk}))
		cancel()
		if err != nil {
			k.log.Debug("lease: cannot read lost ranges; retrying at the next renewal", "holder", k.holderID, "err", err)
			return
		}
		k.mu.Lock()
		for _, res := range resp.Msg.GetResults() {
			r, h := res.GetRange(), k.held[res.GetRangeId()]
			if r == nil || h == nil || !h.lost || h.superseded || k.session != sid {
				continue // unreadable, dropped, taken back by a Hold, or another session now
			}
			l := r.GetLease()
			switch {
			case r.GetEpoch() != h.epoch:
				// As in a keep-alive answer: a later grant deposed the
				// holder, or it claims an epoch never granted. Either way
				// this epoch is over for it.
				h.superseded = true
				k.log.Info("lease: lost range superseded; stop acting for it", "holder", k.holderID, "range", r.GetRangeId(),
					"held_epoch", h.epoch, "current_epoch", r.GetEpoch())
			case l.GetEpoch() == h.epoch && l.GetHolderId() == k.holderID && l.GetSessionId() == sid && l.GetLive():
				// The epoch compare matters: a lease record of an older
				// epoch on this session would say nothing about this one.
				h.lost = false
				k.log.Info("lease: lease of a lost range is bound to the new session; valid again", "holder", k.holderID,
					"range", r.GetRangeId(), "epoch", h.epoch, "session", sid)
			}
		}
		k.mu.Unlock()
	}
}

// supersededOf reads the superseded ranges from a FailedPrecondition
// keep-alive answer's KeepAliveResponse detail; without one, every range
// sent moved on (that is what the code means).
func supersededOf(err error, sent []*tenurev1.RangeEpoch) []*tenurev1.RangeEpoch {
	var ce *connect.Error
	if errors.As(err, &ce) {
		for _, d := range ce.Details() {
			if v, derr := d.Value(); derr == nil {
				if r, ok := v.(*tenurev1.KeepAliveResponse); ok {
					return r.GetSuperseded()
				}
			}
		}
	}
	return sent
}

// supersede marks the ranges the service reported as moved on, but only
// where the held epoch is still the one sent: a Hold of a newer epoch since
// then is not what the answer was about.
func (k *Keeper) supersede(sent, superseded []*tenurev1.RangeEpoch) {
	if len(superseded) == 0 {
		return
	}
	sentEpoch := make(map[string]uint64, len(sent))
	for _, r := range sent {
		sentEpoch[r.GetRangeId()] = r.GetEpoch()
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, r := range superseded {
		id := r.GetRangeId()
		if h := k.held[id]; h != nil && h.epoch == sentEpoch[id] {
			h.superseded = true
			k.log.Info("lease: range superseded; stop acting for it", "holder", k.holderID, "range", id,
				"held_epoch", h.epoch, "current_epoch", r.GetEpoch())
		}
	}
}

// lose forgets a session the service no longer knows: it expired (or was
// closed), and every lease bound to it went with it.
func (k *Keeper) lose(sid int64, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.session != sid {
		return
	}
	k.log.Warn("lease: keeper session lost; its leases are gone", "holder", k.holderID, "session", sid, "err", err)
	k.session, k.validUntil = 0, time.Time{}
	for _, h := range k.held {
		h.lost = true
	}
}
