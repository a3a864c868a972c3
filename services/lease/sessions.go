package lease

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenurelog/tenure/pkg/auth"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// checkTTL checks a session TTL in milliseconds, other than etcd's minimum,
// which only etcd knows.
func checkTTL(ms int64) error {
	switch {
	case ms <= 0:
		return invalidf("ttl_ms %d: a session TTL must be positive (0 asks for the server's default)", ms)
	case ms%1000 != 0:
		return invalidf("ttl_ms %d is not whole seconds: etcd counts lease TTLs in seconds", ms)
	case ms > MaxSessionTTL.Milliseconds():
		return invalidf("ttl_ms %d is above the maximum of %d: a dead holder would keep its leases that long", ms, MaxSessionTTL.Milliseconds())
	}
	return nil
}

func belowMinTTL(ms, minSeconds int64) error {
	return invalidf("ttl_ms %d is below etcd's minimum lease TTL of %d ms (1.5 election timeouts, rounded up to whole seconds); etcd would silently lengthen it",
		ms, minSeconds*1000)
}

// checkHolder checks a holder id: the same grammar as range and replica ids.
func checkHolder(id string) error {
	if id == "" {
		return invalidf("holder_id is missing: name the promoter or replica that holds the session")
	}
	if err := wire.ValidateID("holder_id", id); err != nil {
		return invalidf("%v", err)
	}
	return nil
}

// detachedCtx is for cleanup after the request's context may have ended:
// undoing a half-done OpenSession must not be skipped because the caller
// went away, yet it must stay bounded.
func (s *Service) detachedCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), s.requestTimeout)
}

func (s *Service) openSession(ctx context.Context, req *tenurev1.OpenSessionRequest) (*tenurev1.OpenSessionResponse, error) {
	holder := req.GetHolderId()
	if err := checkHolder(holder); err != nil {
		return nil, err
	}
	// A replica's certificate opens sessions only under its own id: it
	// leads ranges under the session's holder id, so a replica that could
	// name another would hold that replica's leases.
	if err := auth.RequireHolder(ctx, holder); err != nil {
		return nil, err
	}
	if n := len(req.GetHolderAddress()); n > MaxHolderAddressBytes {
		return nil, invalidf("holder_address is %d bytes, at most %d", n, MaxHolderAddressBytes)
	}
	ms := req.GetTtlMs()
	if ms == 0 {
		ms = s.defaultTTL.Milliseconds()
	}
	if err := checkTTL(ms); err != nil {
		return nil, err
	}
	ttl := ms / 1000
	if minTTL := s.minTTLSeconds.Load(); ttl < minTTL {
		return nil, belowMinTTL(ms, minTTL)
	}
	g, err := s.leases.Grant(ctx, ttl)
	if err != nil {
		return nil, err
	}
	id := g.ID
	undo := func() {
		ctx, cancel := s.detachedCtx(ctx)
		defer cancel()
		if _, err := s.leases.Revoke(ctx, id); err != nil && !isLeaseNotFound(err) {
			s.log.Warn("lease: revoke an unused session; it expires by itself", "session", int64(id), "err", err)
		}
	}
	if g.TTL > ttl {
		// etcd raised the TTL to its minimum: the etcd we talk to now has a
		// longer election timeout than the one probed at start (or a new
		// leader does). Learn it, and refuse rather than hand out a session
		// that outlives what the holder asked for.
		undo()
		s.minTTLSeconds.Store(g.TTL)
		return nil, belowMinTTL(ms, g.TTL)
	}
	rec := sessionRecord{HolderID: holder, HolderAddress: req.GetHolderAddress(), TTLMillis: ms}
	if _, err := s.kv.Put(ctx, s.keys.session(holder, int64(id)), mustJSON(rec), clientv3.WithLease(id)); err != nil {
		undo()
		return nil, err
	}
	return &tenurev1.OpenSessionResponse{SessionId: int64(id), TtlMs: g.TTL * 1000}, nil
}

// session is a live session as resolved for a grant or bind.
type session struct {
	id  int64
	key string
	// modRev is the session key's last-modified revision: the transaction
	// that binds a lease compares it, so the lease is attached only if the
	// key still holds the very record read here when the transaction
	// applies (revisions are never reused: an expired and re-created key,
	// or a record since marked closing, has another). That compare, not the
	// freshness of the read, is what makes a grant safe, so a session may
	// be remembered (below).
	modRev int64
	rec    sessionRecord
}

// sessionCache remembers sessions resolved by id, so a grant or bind
// after the first does not wait for a linearizable read (130-290 ms under
// a mass failover's load) before its transaction. A remembered session
// that has since expired, closed or been marked closing fails the
// transaction's session compare, exactly as a fresh read would have
// refused it, and is forgotten then.
type sessionCache struct {
	mu sync.Mutex
	m  map[sessionKey]session
}

type sessionKey struct {
	holder string
	id     int64
}

// maxCachedSessions bounds sessionCache: a lease service sees one session
// per holder process at a time, a few more as old ones expire. Past the
// bound it starts over rather than track which expired.
const maxCachedSessions = 4096

func (c *sessionCache) get(holder string, id int64) (session, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sess, ok := c.m[sessionKey{holder, id}]
	return sess, ok
}

func (c *sessionCache) put(holder string, id int64, sess session) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxCachedSessions {
		c.m = map[sessionKey]session{}
	}
	c.m[sessionKey{holder, id}] = sess
}

// forget drops sess, whose transaction's session compare failed.
func (c *sessionCache) forget(holder string, sess session) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur, ok := c.m[sessionKey{holder, sess.id}]; ok && cur.modRev == sess.modRev {
		delete(c.m, sessionKey{holder, sess.id})
	}
}

// maxSessionsScanned bounds the sessions read to find a holder's newest live
// one. A holder normally has one; a few more while an old one expires.
const maxSessionsScanned = 16

// resolveSession finds the live session id of holder; id 0 means the
// holder's most recently opened live session that is not closing.
func (s *Service) resolveSession(ctx context.Context, holder string, id int64) (session, error) {
	if id < 0 {
		return session{}, invalidf("session_id %d: session ids are positive (0 = the holder's newest session)", id)
	}
	if id != 0 {
		// Only a named session is remembered: "the holder's newest" must
		// see a session opened since.
		if sess, ok := s.sessions.get(holder, id); ok {
			return sess, nil
		}
	}
	var kvs []*mvccpb.KeyValue
	if id == 0 {
		r, err := s.kv.Get(ctx, s.keys.sessions(holder), clientv3.WithPrefix(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(maxSessionsScanned))
		if err != nil {
			return session{}, err
		}
		kvs = r.Kvs
	} else {
		r, err := s.kv.Get(ctx, s.keys.session(holder, id))
		if err != nil {
			return session{}, err
		}
		kvs = r.Kvs
	}
	for _, kv := range kvs {
		rec, err := decodeSession(string(kv.Key), kv.Value)
		if err != nil {
			return session{}, err
		}
		if rec.Closing {
			continue
		}
		sess := session{id: kv.Lease, key: string(kv.Key), modRev: kv.ModRevision, rec: rec}
		if id != 0 {
			s.sessions.put(holder, id, sess)
		}
		return sess, nil
	}
	if id == 0 {
		return session{}, failedf("holder %q has no live session: it must OpenSession first", holder)
	}
	return session{}, failedf("session %d of holder %q is not live: it expired, was closed, or belongs to another holder", id, holder)
}

func (s *Service) keepAlive(ctx context.Context, req *tenurev1.KeepAliveRequest) (*tenurev1.KeepAliveResponse, error) {
	id := req.GetSessionId()
	if id <= 0 {
		return nil, invalidf("session_id %d: session ids are positive", id)
	}
	held := req.GetHeld()
	if len(held) > MaxKeepAliveRanges {
		return nil, invalidf("keep-alive names %d ranges, at most %d: split it", len(held), MaxKeepAliveRanges)
	}
	ids := make([]string, 0, len(held))
	for i, h := range held {
		if h == nil {
			return nil, invalidf("held entry %d is missing", i)
		}
		if err := wire.ValidateRangeID(h.GetRangeId()); err != nil {
			return nil, err
		}
		if h.GetEpoch() == 0 {
			return nil, invalidf("range %q held at epoch 0: epoch 0 is never granted", h.GetRangeId())
		}
		ids = append(ids, h.GetRangeId())
	}

	// Renew first, read epochs second. Every grant committed before this
	// request was sent is then visible to the read below, so a holder is
	// never told "renewed, nothing moved on" about a range that had already
	// moved on when it asked.
	ka, err := s.leases.KeepAliveOnce(ctx, clientv3.LeaseID(id))
	if err != nil {
		if isLeaseNotFound(err) {
			return nil, notFoundf("session %d not found: it expired or was closed, and its leases with it; open a new session", id)
		}
		return nil, err
	}
	resp := &tenurev1.KeepAliveResponse{TtlMs: ka.TTL * 1000}
	if len(held) == 0 {
		return resp, nil
	}
	current, err := s.readEpochs(ctx, ids)
	if err != nil {
		return nil, err
	}
	for _, h := range held {
		cur, ok := current[h.GetRangeId()]
		// Any difference means the holder must stop: a stored epoch above the
		// held one is a later grant (the holder was deposed); one below it
		// means the holder claims an epoch that was never granted, which it
		// must not act under either. A range that does not exist reports
		// epoch 0: nothing can be held there.
		if !ok || cur != h.GetEpoch() {
			resp.Superseded = append(resp.Superseded, &tenurev1.RangeEpoch{RangeId: h.GetRangeId(), Epoch: cur})
		}
	}
	// The session was renewed either way: a holder told to stop still owns
	// its session (and any ranges it holds under other requests).
	if len(resp.Superseded) == len(held) {
		return nil, withDetail(failedf("every held range has moved on, stop acting for them: %s", describeSuperseded(resp.Superseded)), resp)
	}
	return resp, nil
}

// describeSuperseded names the current epochs, a few of them: the message is
// for people, the KeepAliveResponse detail carries all of them.
func describeSuperseded(sup []*tenurev1.RangeEpoch) string {
	const shown = 8
	var b strings.Builder
	for i, r := range sup {
		if i == shown {
			fmt.Fprintf(&b, " and %d more", len(sup)-shown)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "range %q is at epoch %d", r.GetRangeId(), r.GetEpoch())
	}
	return b.String()
}

// readEpochs reads the current epochs of ids with one range read over
// epochs/<smallest id>..epochs/<largest id> (paged by epochPage, all pages at
// the first page's revision), not one get per range. Ranges that do not
// exist are absent from the result.
func (s *Service) readEpochs(ctx context.Context, ids []string) (map[string]uint64, error) {
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	sorted := slices.Sorted(maps.Keys(want))
	out := make(map[string]uint64, len(want))
	from, end := s.keys.epoch(sorted[0]), s.keys.epoch(sorted[len(sorted)-1])+"\x00"
	var rev int64
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(epochPage)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		r, err := s.kv.Get(ctx, from, opts...)
		if err != nil {
			return nil, err
		}
		if rev == 0 {
			rev = r.Header.Revision
		}
		for _, kv := range r.Kvs {
			if kind, id := s.keys.parse(string(kv.Key)); kind == kindEpoch && want[id] {
				e, err := parseEpoch(string(kv.Key), kv.Value)
				if err != nil {
					return nil, err
				}
				out[id] = e
			}
		}
		// Keys strictly advance page by page, so this ends.
		if !r.More || len(r.Kvs) == 0 {
			return out, nil
		}
		from = string(r.Kvs[len(r.Kvs)-1].Key) + "\x00"
	}
}

func (s *Service) closeSession(ctx context.Context, req *tenurev1.CloseSessionRequest) (*tenurev1.CloseSessionResponse, error) {
	id := req.GetSessionId()
	if id <= 0 {
		return nil, invalidf("session_id %d: session ids are positive", id)
	}
	ttl, err := s.leases.TimeToLive(ctx, clientv3.LeaseID(id), clientv3.WithAttachedKeys())
	if err != nil && !isLeaseNotFound(err) {
		return nil, err
	}
	if err != nil || ttl.TTL < 0 {
		return nil, notFoundf("session %d not found: it expired or was already closed", id)
	}
	// Mark the session record closing before revoking, so the lease keys the
	// revoke deletes are reported as RELEASED, not EXPIRED (package comment).
	// The revoke deletes the record in the same revision as the lease keys,
	// and the watcher reads the deleted record's closing flag there.
	for _, k := range ttl.Keys {
		if kind, _ := s.keys.parse(string(k)); kind != kindSession {
			continue
		}
		if err := s.markClosing(ctx, string(k), id); err != nil {
			return nil, err
		}
	}
	if _, err := s.leases.Revoke(ctx, clientv3.LeaseID(id)); err != nil && !isLeaseNotFound(err) {
		return nil, err
	}
	// A session that expired between the two calls is closed all the same.
	return &tenurev1.CloseSessionResponse{}, nil
}

// markClosing rewrites a session record with closing set, still attached to
// the session, and only if the record is still the one attached to it.
func (s *Service) markClosing(ctx context.Context, key string, id int64) error {
	r, err := s.kv.Get(ctx, key)
	if err != nil {
		return err
	}
	kv := firstKV(r)
	if kv == nil || kv.Lease != id {
		return nil // gone with the session already
	}
	rec, err := decodeSession(key, kv.Value)
	if err != nil {
		return err
	}
	rec.Closing = true
	_, err = s.kv.Txn(ctx).If(
		clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision),
	).Then(
		clientv3.OpPut(key, mustJSON(rec), clientv3.WithLease(clientv3.LeaseID(id))),
	).Commit()
	if isLeaseNotFound(err) {
		return nil // expired meanwhile
	}
	return err
}
