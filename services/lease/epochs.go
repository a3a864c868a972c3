package lease

import (
	"context"
	"math"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// releaseAttempts bounds ReleaseLease's read-compare-write retries when the
// lease changes between its read and its write.
const releaseAttempts = 3

func (s *Service) grantEpoch(ctx context.Context, req *tenurev1.GrantEpochRequest) (*tenurev1.GrantEpochResponse, error) {
	if err := checkGrant(req); err != nil {
		return nil, err
	}
	sess, err := s.resolveSession(ctx, req.GetHolderId(), req.GetSessionId())
	if err != nil {
		return nil, err
	}
	return s.grantEpochIn(ctx, req, sess)
}

// checkGrant checks a GrantEpoch request's shape.
func checkGrant(req *tenurev1.GrantEpochRequest) error {
	if err := wire.ValidateRangeID(req.GetRangeId()); err != nil {
		return err
	}
	if err := checkHolder(req.GetHolderId()); err != nil {
		return err
	}
	if req.GetPreviousEpoch() == math.MaxUint64 {
		// prev+1 would wrap to 0, "no grant yet": refuse rather than reuse.
		return failedf("range %q: epoch space exhausted", req.GetRangeId())
	}
	return nil
}

// grantEpochIn grants req's epoch with its lease in sess, the holder's
// session as resolved from req. The transaction compares the session's
// creation revision, so a session resolved a moment ago that has since
// expired grants nothing.
func (s *Service) grantEpochIn(ctx context.Context, req *tenurev1.GrantEpochRequest, sess session) (*tenurev1.GrantEpochResponse, error) {
	t := s.grantTxn(req, sess)
	resp, err := s.kv.Txn(ctx).If(t.cmps...).Then(t.then...).Else(t.els...).Commit()
	if err != nil {
		return nil, err
	}
	return s.grantAnswer(ctx, req, sess, resp.Succeeded, resp.Responses)
}

// rangeTxn is one range's compare-and-swap: its compares, its operations
// when they hold and when they do not. A single-range call commits it as
// its own etcd transaction; a batch commits many as nested transactions of
// one (commitNested), each still deciding on its own compares.
type rangeTxn struct {
	cmps       []clientv3.Cmp
	then, els  []clientv3.Op
	rangeIndex int // which request of the batch it answers
}

// grantTxn is the compare-and-swap of one grant: write prev+1 and its lease
// if and only if the stored epoch is still prev and sess is still live.
// Its answer (grantAnswer) reads the range's members from the same
// transaction, so the caller learns the replica set as of its grant.
func (s *Service) grantTxn(req *tenurev1.GrantEpochRequest, sess session) rangeTxn {
	id, prev := req.GetRangeId(), req.GetPreviousEpoch()
	epochKey := s.keys.epoch(id)
	return rangeTxn{
		cmps: []clientv3.Cmp{
			// The whole safety of a grant is this compare: next is written
			// only if the stored epoch is still exactly prev. etcd applies
			// transactions one at a time in revision order (and the nested
			// transactions of a batch each on their own compares, evaluated
			// before any of the batch's writes, all of them on other
			// ranges' keys), so of two callers that both read prev, only
			// the first to commit finds the compare true; the other compares
			// against prev+1 and loses. A value compare on a missing key is
			// false, so an unknown range never gets epoch 1 out of nothing;
			// and the epoch key is never deleted, so the sequence never
			// restarts. The next epoch is always exactly prev+1: no gaps,
			// no repeats.
			clientv3.Compare(clientv3.Value(epochKey), "=", formatEpoch(prev)),
			// The session the new lease is attached to is still this live
			// session, its record unchanged, when the transaction applies
			// (it could expire or close in between; session in sessions.go).
			clientv3.Compare(clientv3.ModRevision(sess.key), "=", sess.modRev),
			// The range exists: a deleted range keeps its epoch key as a
			// tombstone (DeleteRange), which must not take grants.
			clientv3.Compare(clientv3.CreateRevision(s.keys.members(id)), ">", 0),
		},
		then: []clientv3.Op{
			clientv3.OpPut(epochKey, formatEpoch(prev+1)),
			// Overwriting the lease key also detaches it from the previous
			// holder's session: the deposed holder's lease ends with the grant.
			clientv3.OpPut(s.keys.lease(id), mustJSON(s.grantRecord(req, sess)), clientv3.WithLease(clientv3.LeaseID(sess.id))),
			clientv3.OpGet(s.keys.members(id)),
			// The policy too: the promoter hands it to the new leader in
			// Adopt, so retention applies from the leader's first pass.
			clientv3.OpGet(s.keys.retention(id)),
		},
		els: []clientv3.Op{clientv3.OpGet(epochKey), clientv3.OpGet(s.keys.members(id))},
	}
}

func (s *Service) grantRecord(req *tenurev1.GrantEpochRequest, sess session) leaseRecord {
	return leaseRecord{Epoch: req.GetPreviousEpoch() + 1, HolderID: req.GetHolderId(), HolderAddress: sess.rec.HolderAddress, SessionID: sess.id}
}

// grantAnswer is the answer to a grant whose transaction (grantTxn)
// committed with the given outcome and responses.
func (s *Service) grantAnswer(ctx context.Context, req *tenurev1.GrantEpochRequest, sess session, succeeded bool, rs []*etcdserverpb.ResponseOp) (*tenurev1.GrantEpochResponse, error) {
	id, prev, holder := req.GetRangeId(), req.GetPreviousEpoch(), req.GetHolderId()
	epochKey := s.keys.epoch(id)
	if !succeeded {
		kv := opKV(rs, 0)
		if kv == nil {
			return nil, rangeNotFound(id)
		}
		cur, err := parseEpoch(epochKey, kv.Value)
		if err != nil {
			return nil, err
		}
		if cur != prev {
			return nil, lostGrant(id, prev, cur)
		}
		if opKV(rs, 1) == nil {
			return nil, rangeNotFound(id)
		}
		// The epoch compare held, so the session compare failed.
		s.sessions.forget(holder, sess)
		return nil, failedf("session %d of holder %q expired or was closed before the grant; nothing was granted", sess.id, holder)
	}
	rec := s.grantRecord(req, sess)
	out := &tenurev1.GrantEpochResponse{Epoch: rec.Epoch, Lease: s.boundLease(ctx, id, rec)}
	if mkv := opKV(rs, 2); mkv != nil {
		// The members as of the grant. A stored set that does not decode is
		// left out rather than failing a grant that has happened: the
		// caller falls back to GetRange, which reports the corruption.
		if m, err := decodeMembers(string(mkv.Key), mkv.Value); err == nil {
			out.Range = &tenurev1.RangeInfo{RangeId: id, Epoch: rec.Epoch, Lease: out.Lease}
			membersInfo(out.Range, m, mkv)
			// Likewise a policy that does not decode is left out (the
			// leader keeps the defaults until it reads the range itself).
			if p, err := decodeRetention(opKV(rs, 3)); err == nil {
				out.Range.Retention = p
			}
		}
	}
	return out, nil
}

// opKV is the single key the i-th get of a transaction's responses
// returned, or nil.
func opKV(rs []*etcdserverpb.ResponseOp, i int) *mvccpb.KeyValue {
	if i >= len(rs) {
		return nil
	}
	if r := rs[i].GetResponseRange(); r != nil && len(r.Kvs) > 0 {
		return r.Kvs[0]
	}
	return nil
}

// boundLease is the Lease just bound by a successful transaction. The TTL is
// best effort: the grant or bind has happened, and failing the call now
// would tell the caller it had not.
func (s *Service) boundLease(ctx context.Context, rangeID string, rec leaseRecord) *tenurev1.Lease {
	l := &tenurev1.Lease{
		RangeId: rangeID, Epoch: rec.Epoch, HolderId: rec.HolderID, HolderAddress: rec.HolderAddress,
		SessionId: rec.SessionID, Live: true,
	}
	if ms, live, err := s.remaining(ctx, rec.SessionID, ttlCache{}); err == nil {
		l.TtlRemainingMs, l.Live = ms, live
	}
	return l
}

// ttlSampleMaxAge is how long a session's TTL sample answers remaining.
const ttlSampleMaxAge = time.Second

// ttlSamples remembers the last remaining-TTL sample of each session asked
// about within ttlSampleMaxAge (see remaining).
type ttlSamples struct {
	mu sync.Mutex
	m  map[int64]ttlSample
}

type ttlSample struct {
	ms int64
	at time.Time
}

// get returns the session's remaining TTL as of now from a sample younger
// than ttlSampleMaxAge, lowered by the sample's age; false when there is
// none, or when the lowered TTL is not positive (the session may be about
// to expire: only etcd can tell).
func (t *ttlSamples) get(id int64, now time.Time) (int64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	smp, ok := t.m[id]
	age := now.Sub(smp.at)
	if !ok || age < 0 || age >= ttlSampleMaxAge || smp.ms-age.Milliseconds() <= 0 {
		return 0, false
	}
	return smp.ms - age.Milliseconds(), true
}

func (t *ttlSamples) put(id, ms int64, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[int64]ttlSample{}
	}
	// Samples outlive their use by at most one sweep: the map holds the
	// sessions asked about within the last second, a handful per holder.
	for k, smp := range t.m {
		if now.Sub(smp.at) >= ttlSampleMaxAge {
			delete(t.m, k)
		}
	}
	t.m[id] = ttlSample{ms: ms, at: now}
}

func (s *Service) bindLease(ctx context.Context, req *tenurev1.BindLeaseRequest) (*tenurev1.BindLeaseResponse, error) {
	if err := checkBind(req); err != nil {
		return nil, err
	}
	sess, err := s.resolveSession(ctx, req.GetHolderId(), req.GetSessionId())
	if err != nil {
		return nil, err
	}
	return s.bindLeaseIn(ctx, req, sess)
}

// checkBind checks a BindLease request's shape.
func checkBind(req *tenurev1.BindLeaseRequest) error {
	if err := wire.ValidateRangeID(req.GetRangeId()); err != nil {
		return err
	}
	if req.GetEpoch() == 0 {
		return invalidf("epoch 0 is never granted: bind the current epoch")
	}
	return checkHolder(req.GetHolderId())
}

// bindLeaseIn binds req's lease to sess, the holder's session as resolved
// from req; like grantEpochIn, its transaction re-checks the session.
func (s *Service) bindLeaseIn(ctx context.Context, req *tenurev1.BindLeaseRequest, sess session) (*tenurev1.BindLeaseResponse, error) {
	t := s.bindTxn(req, sess)
	resp, err := s.kv.Txn(ctx).If(t.cmps...).Then(t.then...).Else(t.els...).Commit()
	if err != nil {
		return nil, err
	}
	return s.bindAnswer(ctx, req, sess, resp.Succeeded, resp.Responses)
}

// bindTxn is the compare-and-swap of one bind: move the lease of epoch to
// sess if and only if epoch is still current and sess is still live.
func (s *Service) bindTxn(req *tenurev1.BindLeaseRequest, sess session) rangeTxn {
	id := req.GetRangeId()
	epochKey := s.keys.epoch(id)
	return rangeTxn{
		cmps: []clientv3.Cmp{
			// Only the current epoch's lease can move: binding an old epoch
			// would hand a lease to a leader that a later grant has already
			// deposed. Comparing in the same transaction closes the window
			// between checking and writing.
			clientv3.Compare(clientv3.Value(epochKey), "=", formatEpoch(req.GetEpoch())),
			// This very session, its record unchanged since it was read
			// (session, in sessions.go).
			clientv3.Compare(clientv3.ModRevision(sess.key), "=", sess.modRev),
			// The range exists, as a grant checks: a deleted range keeps
			// its epoch key (a tombstone), and a bind at that epoch wrote
			// a lease for a range that is not there, which a range created
			// again under the id then showed as its live lease, held by
			// whoever bound it.
			clientv3.Compare(clientv3.CreateRevision(s.keys.members(id)), ">", 0),
		},
		then: []clientv3.Op{
			clientv3.OpPut(s.keys.lease(id), mustJSON(bindRecord(req, sess)), clientv3.WithLease(clientv3.LeaseID(sess.id))),
		},
		els: []clientv3.Op{clientv3.OpGet(epochKey), clientv3.OpGet(s.keys.members(id))},
	}
}

func bindRecord(req *tenurev1.BindLeaseRequest, sess session) leaseRecord {
	return leaseRecord{Epoch: req.GetEpoch(), HolderID: req.GetHolderId(), HolderAddress: sess.rec.HolderAddress, SessionID: sess.id}
}

// bindAnswer is the answer to a bind whose transaction (bindTxn) committed
// with the given outcome and responses.
func (s *Service) bindAnswer(ctx context.Context, req *tenurev1.BindLeaseRequest, sess session, succeeded bool, rs []*etcdserverpb.ResponseOp) (*tenurev1.BindLeaseResponse, error) {
	id, epoch, holder := req.GetRangeId(), req.GetEpoch(), req.GetHolderId()
	if !succeeded {
		kv := opKV(rs, 0)
		if kv == nil {
			return nil, rangeNotFound(id)
		}
		cur, err := parseEpoch(s.keys.epoch(id), kv.Value)
		if err != nil {
			return nil, err
		}
		if opKV(rs, 1) == nil {
			return nil, rangeNotFound(id)
		}
		if cur != epoch {
			return nil, notCurrent(id, epoch, cur)
		}
		s.sessions.forget(holder, sess)
		return nil, failedf("session %d of holder %q expired or was closed before the bind; nothing was bound", sess.id, holder)
	}
	return &tenurev1.BindLeaseResponse{Lease: s.boundLease(ctx, id, bindRecord(req, sess))}, nil
}

func (s *Service) releaseLease(ctx context.Context, req *tenurev1.ReleaseLeaseRequest) (*tenurev1.ReleaseLeaseResponse, error) {
	id, epoch, sid := req.GetRangeId(), req.GetEpoch(), req.GetSessionId()
	if err := wire.ValidateRangeID(id); err != nil {
		return nil, err
	}
	if epoch == 0 {
		return nil, invalidf("epoch 0 is never granted: release the current epoch")
	}
	if sid <= 0 {
		return nil, invalidf("session_id %d: name the session that holds the lease", sid)
	}
	epochKey, leaseKey := s.keys.epoch(id), s.keys.lease(id)
	for range releaseAttempts {
		snap, err := s.readRange(ctx, id)
		if err != nil {
			return nil, err
		}
		if snap.epoch == nil {
			return nil, rangeNotFound(id)
		}
		cur, err := parseEpoch(epochKey, snap.epoch.Value)
		if err != nil {
			return nil, err
		}
		// Only the current epoch's lease can be released: an old epoch's
		// holder releasing would end the lease of the leader that replaced it.
		if cur != epoch {
			return nil, notCurrent(id, epoch, cur)
		}
		if snap.lease == nil {
			return nil, failedf("range %q has no lease at epoch %d: its session expired or was closed", id, epoch)
		}
		rec, err := decodeLease(leaseKey, snap.lease.Value)
		if err != nil {
			return nil, err
		}
		if rec.SessionID != sid || rec.Epoch != epoch {
			return nil, failedf("range %q: the lease of epoch %d is held by session %d (holder %q), not session %d",
				id, rec.Epoch, rec.SessionID, rec.HolderID, sid)
		}
		if rec.Released {
			return &tenurev1.ReleaseLeaseResponse{}, nil // released already: same outcome
		}
		rec.Released = true
		resp, err := s.kv.Txn(ctx).If(
			// Still the current epoch, and still the very lease read above.
			clientv3.Compare(clientv3.Value(epochKey), "=", formatEpoch(epoch)),
			clientv3.Compare(clientv3.ModRevision(leaseKey), "=", snap.lease.ModRevision),
		).Then(
			// A put without a lease detaches the key from the session: a
			// released lease no longer ends with it, and the put (not a
			// delete) is how watchers tell RELEASED from EXPIRED.
			clientv3.OpPut(leaseKey, mustJSON(rec)),
		).Commit()
		if err != nil {
			return nil, err
		}
		if resp.Succeeded {
			return &tenurev1.ReleaseLeaseResponse{}, nil
		}
		// Changed since the read: re-read, and answer from the new state.
	}
	return nil, abortedf("range %q: the lease changed %d times while being released; re-read and retry", id, releaseAttempts)
}

func (s *Service) getLease(ctx context.Context, req *tenurev1.GetLeaseRequest) (*tenurev1.GetLeaseResponse, error) {
	id := req.GetRangeId()
	if err := wire.ValidateRangeID(id); err != nil {
		return nil, err
	}
	snap, err := s.readRange(ctx, id)
	if err != nil {
		return nil, err
	}
	// A deleted range keeps its epoch key: without its members it is not
	// found, as GetRange says. It answered a lease at the tombstone's
	// epoch.
	if snap.epoch == nil || snap.members == nil {
		return nil, rangeNotFound(id)
	}
	cur, err := parseEpoch(s.keys.epoch(id), snap.epoch.Value)
	if err != nil {
		return nil, err
	}
	l, err := s.leaseInfo(ctx, id, cur, snap.lease, ttlCache{})
	if err != nil {
		return nil, err
	}
	return &tenurev1.GetLeaseResponse{Lease: l}, nil
}
