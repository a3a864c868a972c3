package lease

import (
	"context"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// rangeSnap is one range's keys read at one revision; nil where absent.
type rangeSnap struct {
	members, epoch, lease, retention *mvccpb.KeyValue
}

// firstKV is the single key a get of one key returned, or nil.
func firstKV(r *clientv3.GetResponse) *mvccpb.KeyValue {
	if r == nil || len(r.Kvs) == 0 {
		return nil
	}
	return r.Kvs[0]
}

// txnKV is the single key the i-th get of a transaction returned, or nil.
func txnKV(resp *clientv3.TxnResponse, i int) *mvccpb.KeyValue {
	return firstKV((*clientv3.GetResponse)(resp.Responses[i].GetResponseRange()))
}

// readRange reads a range's four keys in one transaction, so they are
// consistent with each other.
func (s *Service) readRange(ctx context.Context, rangeID string) (rangeSnap, error) {
	resp, err := s.kv.Txn(ctx).Then(
		clientv3.OpGet(s.keys.members(rangeID)),
		clientv3.OpGet(s.keys.epoch(rangeID)),
		clientv3.OpGet(s.keys.lease(rangeID)),
		clientv3.OpGet(s.keys.retention(rangeID)),
	).Commit()
	if err != nil {
		return rangeSnap{}, err
	}
	return rangeSnap{members: txnKV(resp, 0), epoch: txnKV(resp, 1), lease: txnKV(resp, 2), retention: txnKV(resp, 3)}, nil
}

// ttlCache remembers, within one request, the remaining TTL of each session
// already asked about: a page of ranges led by a few holders costs a few
// TimeToLive calls, not one per range.
type ttlCache map[int64]struct {
	ms   int64
	live bool
}

// remaining is a session's remaining TTL in milliseconds (etcd reports whole
// seconds, rounded down) and whether it is live. Callers ask about a session
// a key attached to it named a moment ago (a lease key read or written), so
// a live answer from etcd is remembered for up to ttlSampleMaxAge and
// reused, lowered by its age, while that stays positive: a mass failover
// asks about the dead leader's and the promoter's sessions hundreds of
// times a second, and a TimeToLive round trip for each was a third of the
// lease service's etcd calls. A sample lowered by its age never overstates
// the TTL (keep-alives only lengthen it); a session revoked meanwhile takes
// its keys with it, so the key the caller read or wrote shows it was live.
func (s *Service) remaining(ctx context.Context, sessionID int64, cache ttlCache) (int64, bool, error) {
	if c, ok := cache[sessionID]; ok {
		return c.ms, c.live, nil
	}
	if ms, ok := s.ttls.get(sessionID, time.Now()); ok {
		return ms, true, nil
	}
	asked := time.Now()
	r, err := s.leases.TimeToLive(ctx, clientv3.LeaseID(sessionID))
	var ms int64
	var live bool
	switch {
	case err != nil && !isLeaseNotFound(err):
		return 0, false, err
	case err == nil && r.TTL >= 0:
		ms, live = r.TTL*1000, true
		s.ttls.put(sessionID, ms, asked)
	}
	cache[sessionID] = struct {
		ms   int64
		live bool
	}{ms, live}
	return ms, live, nil
}

// leaseInfo is the Lease of a range whose current epoch is current, from its
// lease key (nil when there is none: never granted, or the session expired or
// was closed).
func (s *Service) leaseInfo(ctx context.Context, rangeID string, current uint64, kv *mvccpb.KeyValue, cache ttlCache) (*tenurev1.Lease, error) {
	l := &tenurev1.Lease{RangeId: rangeID, Epoch: current}
	if kv == nil {
		return l, nil
	}
	rec, err := decodeLease(string(kv.Key), kv.Value)
	if err != nil {
		return nil, err
	}
	l.Epoch, l.HolderId, l.HolderAddress = rec.Epoch, rec.HolderID, rec.HolderAddress
	if rec.Released {
		// Nobody holds a released lease; the last holder is still shown.
		return l, nil
	}
	l.SessionId = rec.SessionID
	l.TtlRemainingMs, l.Live, err = s.remaining(ctx, rec.SessionID, cache)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// rangeInfo builds a RangeInfo from a snapshot whose members key exists.
func (s *Service) rangeInfo(ctx context.Context, rangeID string, snap rangeSnap, cache ttlCache) (*tenurev1.RangeInfo, error) {
	m, err := decodeMembers(string(snap.members.Key), snap.members.Value)
	if err != nil {
		return nil, err
	}
	info := &tenurev1.RangeInfo{RangeId: rangeID}
	membersInfo(info, m, snap.members)
	if snap.epoch == nil {
		// CreateRange writes both keys in one transaction and neither is
		// ever deleted, so this is a key removed by hand.
		return nil, errCorruptf("range %q has members but no epoch key", rangeID)
	}
	if info.Epoch, err = parseEpoch(string(snap.epoch.Key), snap.epoch.Value); err != nil {
		return nil, err
	}
	// No retention key: a range created before retention existed, which
	// reads as the defaults (CreateRange writes them explicitly now).
	if info.Retention, err = decodeRetention(snap.retention); err != nil {
		return nil, err
	}
	if snap.lease != nil {
		if info.Lease, err = s.leaseInfo(ctx, rangeID, info.Epoch, snap.lease, cache); err != nil {
			return nil, err
		}
	}
	return info, nil
}

func (s *Service) createRange(ctx context.Context, req *tenurev1.CreateRangeRequest) (*tenurev1.CreateRangeResponse, error) {
	id := req.GetRangeId()
	if err := wire.ValidateRangeID(id); err != nil {
		return nil, err
	}
	if err := wire.ValidateReplicas(req.GetReplicas()); err != nil {
		return nil, err
	}
	if err := wire.ValidateAddresses(req.GetReplicas()); err != nil {
		return nil, err
	}
	preferred := req.GetPreferredReplicaId()
	if preferred != "" && !slices.ContainsFunc(req.GetReplicas(), func(r *tenurev1.Replica) bool { return r.GetId() == preferred }) {
		return nil, invalidf("preferred_replica_id %q is not in the replica set", preferred)
	}
	for _, r := range req.GetReplicas() {
		if inc := r.GetIncarnation(); inc != "" {
			if err := validateIncarnation(inc); err != nil {
				return nil, err
			}
		}
	}
	m := newMembersRecord(req.GetReplicas(), preferred)
	if m.voters() == 0 {
		return nil, invalidf("the replica set has no voter: a range needs at least one replica that is not a learner")
	}
	// No policy means the defaults, written out: a range keeps the policy
	// it was created with even if a later version changes the defaults.
	retention := wire.RetentionOrDefault(req.GetRetention())
	if err := wire.ValidateRetention(retention); err != nil {
		return nil, err
	}
	putRetention := clientv3.OpPut(s.keys.retention(id), mustJSON(newRetentionRecord(retention)))
	resp, err := s.kv.Txn(ctx).If(
		clientv3.Compare(clientv3.CreateRevision(s.keys.members(id)), "=", 0),
	).Then(
		clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(s.keys.epoch(id)), "=", 0)},
			[]clientv3.Op{clientv3.OpPut(s.keys.members(id), mustJSON(m)), clientv3.OpPut(s.keys.epoch(id), formatEpoch(0)), putRetention},
			// The epoch key of a deleted range (or of members removed by
			// hand) stays: the new range's epochs continue above it, so
			// none repeats. Writing "0" over it would let epochs repeat.
			[]clientv3.Op{clientv3.OpPut(s.keys.members(id), mustJSON(m)), clientv3.OpGet(s.keys.epoch(id)), putRetention},
		),
	).Commit()
	if err != nil {
		return nil, err
	}
	if !resp.Succeeded {
		return nil, alreadyExistsf("range %q already exists", id)
	}
	info := &tenurev1.RangeInfo{
		RangeId:            id,
		Replicas:           m.proto(),
		MembershipRevision: resp.Header.Revision,
		PreferredReplicaId: preferred,
		Generation:         uint64(resp.Header.Revision),
		Retention:          retention,
	}
	if inner := resp.Responses[0].GetResponseTxn(); inner != nil && !inner.GetSucceeded() {
		if kv := opKV(inner.GetResponses(), 1); kv != nil {
			if info.Epoch, err = parseEpoch(string(kv.Key), kv.Value); err != nil {
				return nil, err
			}
		}
	}
	return &tenurev1.CreateRangeResponse{Range: info}, nil
}

func (s *Service) getRange(ctx context.Context, req *tenurev1.GetRangeRequest) (*tenurev1.GetRangeResponse, error) {
	id := req.GetRangeId()
	if err := wire.ValidateRangeID(id); err != nil {
		return nil, err
	}
	snap, err := s.readRange(ctx, id)
	if err != nil {
		return nil, err
	}
	if snap.members == nil {
		return nil, rangeNotFound(id)
	}
	info, err := s.rangeInfo(ctx, id, snap, ttlCache{})
	if err != nil {
		return nil, err
	}
	return &tenurev1.GetRangeResponse{Range: info}, nil
}

func (s *Service) listRanges(ctx context.Context, req *tenurev1.ListRangesRequest) (*tenurev1.ListRangesResponse, error) {
	after := req.GetAfterRangeId()
	if after != "" {
		if err := wire.ValidateRangeID(after); err != nil {
			return nil, err
		}
	}
	limit := int64(req.GetLimit())
	switch {
	case limit == 0:
		limit = DefaultListLimit
	case limit > MaxListLimit:
		limit = MaxListLimit
	}
	from := s.keys.membersAll()
	if after != "" {
		// The key right after members/<after>: ids sort as keys do.
		from = s.keys.members(after) + "\x00"
	}
	page, err := s.kv.Get(ctx, from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(s.keys.membersAll())), clientv3.WithLimit(limit))
	if err != nil {
		return nil, err
	}
	out := &tenurev1.ListRangesResponse{More: page.More}
	if len(page.Kvs) == 0 {
		return out, nil
	}
	// The page's epochs, leases and policies, read at the page's revision so
	// the four agree: three range reads over the same id interval, not three
	// per range.
	_, first := s.keys.parse(string(page.Kvs[0].Key))
	_, last := s.keys.parse(string(page.Kvs[len(page.Kvs)-1].Key))
	at := clientv3.WithRev(page.Header.Revision)
	epochs, err := s.kv.Get(ctx, s.keys.epoch(first), clientv3.WithRange(s.keys.epoch(last)+"\x00"), at)
	if err != nil {
		return nil, err
	}
	leases, err := s.kv.Get(ctx, s.keys.lease(first), clientv3.WithRange(s.keys.lease(last)+"\x00"), at)
	if err != nil {
		return nil, err
	}
	retentions, err := s.kv.Get(ctx, s.keys.retention(first), clientv3.WithRange(s.keys.retention(last)+"\x00"), at)
	if err != nil {
		return nil, err
	}
	byID := func(kvs []*mvccpb.KeyValue) map[string]*mvccpb.KeyValue {
		m := make(map[string]*mvccpb.KeyValue, len(kvs))
		for _, kv := range kvs {
			if _, id := s.keys.parse(string(kv.Key)); id != "" {
				m[id] = kv
			}
		}
		return m
	}
	epochByID, leaseByID, retentionByID := byID(epochs.Kvs), byID(leases.Kvs), byID(retentions.Kvs)
	cache := ttlCache{}
	for _, mkv := range page.Kvs {
		kind, id := s.keys.parse(string(mkv.Key))
		if kind != kindMembers {
			return nil, errCorruptf("unexpected key %q under %s", mkv.Key, s.keys.membersAll())
		}
		info, err := s.rangeInfo(ctx, id, rangeSnap{members: mkv, epoch: epochByID[id], lease: leaseByID[id], retention: retentionByID[id]}, cache)
		if err != nil {
			return nil, err
		}
		out.Ranges = append(out.Ranges, info)
	}
	return out, nil
}

// setRetention replaces a range's policy. The policy has its own key, so
// the write never touches the members key: a membership change racing it is
// neither lost (nothing here rewrites the members) nor aborted (the
// membership revision does not move). The compare on the members key makes
// the write and "the range exists" one decision, so a policy is never left
// behind for a range DeleteRange removed meanwhile; the gets in the same
// transaction answer the range exactly as it stands after the write.
func (s *Service) setRetention(ctx context.Context, req *tenurev1.SetRetentionRequest) (*tenurev1.SetRetentionResponse, error) {
	id := req.GetRangeId()
	if err := wire.ValidateRangeID(id); err != nil {
		return nil, err
	}
	if err := wire.ValidateRetention(req.GetRetention()); err != nil {
		return nil, err
	}
	resp, err := s.kv.Txn(ctx).If(
		clientv3.Compare(clientv3.CreateRevision(s.keys.members(id)), ">", 0),
	).Then(
		clientv3.OpPut(s.keys.retention(id), mustJSON(newRetentionRecord(req.GetRetention()))),
		clientv3.OpGet(s.keys.members(id)),
		clientv3.OpGet(s.keys.epoch(id)),
		clientv3.OpGet(s.keys.lease(id)),
		clientv3.OpGet(s.keys.retention(id)),
	).Commit()
	if err != nil {
		return nil, err
	}
	if !resp.Succeeded {
		return nil, rangeNotFound(id)
	}
	info, err := s.rangeInfo(ctx, id, rangeSnap{members: txnKV(resp, 1), epoch: txnKV(resp, 2), lease: txnKV(resp, 3), retention: txnKV(resp, 4)}, ttlCache{})
	if err != nil {
		return nil, err
	}
	return &tenurev1.SetRetentionResponse{Range: info}, nil
}
