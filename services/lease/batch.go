package lease

import (
	"context"
	"errors"
	"sync"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/internal/fanout"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// This file holds the batched calls: GetRanges, GrantEpochs and BindLeases.
// A dead holder loses all its leases at once, and the promoter then reads,
// grants and binds hundreds of ranges together; one call per range spent its
// CPU on HTTP/2 framing and a session read per range.
//
// A batch is only a transport. Each range is still its own etcd
// transaction with its own compare-and-swap on its epoch (grantEpochIn,
// bindLeaseIn), so one lost race fails that range alone: a single multi-range
// transaction would be all-or-nothing, and one stale previous epoch would
// refuse every grant with it. The transactions run concurrently, which etcd
// batches into shared raft proposals and WAL syncs. What the batch does
// share is the session lookup: a promoter grants every range of a failover
// to its one session, so it is read once per (holder, session) named, not
// once per range; each transaction still compares the session's creation
// revision, so a session that expired after the lookup grants nothing.

// GrantEpochs implements LeaseService.GrantEpochs.
func (s *Service) GrantEpochs(ctx context.Context, req *connect.Request[tenurev1.GrantEpochsRequest]) (*connect.Response[tenurev1.GrantEpochsResponse], error) {
	return unary(s, ctx, req, s.grantEpochs)
}

// GetRanges implements LeaseService.GetRanges.
func (s *Service) GetRanges(ctx context.Context, req *connect.Request[tenurev1.GetRangesRequest]) (*connect.Response[tenurev1.GetRangesResponse], error) {
	return unary(s, ctx, req, s.getRanges)
}

// BindLeases implements LeaseService.BindLeases.
func (s *Service) BindLeases(ctx context.Context, req *connect.Request[tenurev1.BindLeasesRequest]) (*connect.Response[tenurev1.BindLeasesResponse], error) {
	return unary(s, ctx, req, s.bindLeases)
}

func (s *Service) grantEpochs(ctx context.Context, req *tenurev1.GrantEpochsRequest) (*tenurev1.GrantEpochsResponse, error) {
	grants := req.GetGrants()
	if err := wire.ValidateRangeBatch(len(grants), func(i int) string { return grants[i].GetRangeId() }); err != nil {
		return nil, err
	}
	sessions := s.sessionsOf(ctx, len(grants), func(i int) (string, int64) {
		return grants[i].GetHolderId(), grants[i].GetSessionId()
	})
	out := &tenurev1.GrantEpochsResponse{Results: make([]*tenurev1.GrantEpochResult, len(grants))}
	fanout.Run(len(grants), batchParallel, func(i int) {
		g := grants[i]
		res := &tenurev1.GrantEpochResult{RangeId: g.GetRangeId()}
		resp, err := func() (*tenurev1.GrantEpochResponse, error) {
			if err := checkGrant(g); err != nil {
				return nil, err
			}
			sess, err := sessions(i)
			if err != nil {
				return nil, err
			}
			return s.grantEpochIn(ctx, g, sess)
		}()
		if err != nil {
			res.Error = leaseError(ctx, err)
		} else {
			res.Grant = resp
		}
		out.Results[i] = res
	})
	return out, nil
}

func (s *Service) getRanges(ctx context.Context, req *tenurev1.GetRangesRequest) (*tenurev1.GetRangesResponse, error) {
	ids := req.GetRangeIds()
	if err := wire.ValidateRangeBatch(len(ids), func(i int) string { return ids[i] }); err != nil {
		return nil, err
	}
	out := &tenurev1.GetRangesResponse{Results: make([]*tenurev1.GetRangeResult, len(ids))}
	fanout.Run(len(ids), batchParallel, func(i int) {
		res := &tenurev1.GetRangeResult{RangeId: ids[i]}
		resp, err := s.getRange(ctx, &tenurev1.GetRangeRequest{RangeId: ids[i]})
		if err != nil {
			res.Error = leaseError(ctx, err)
		} else {
			res.Range = resp.GetRange()
		}
		out.Results[i] = res
	})
	return out, nil
}

func (s *Service) bindLeases(ctx context.Context, req *tenurev1.BindLeasesRequest) (*tenurev1.BindLeasesResponse, error) {
	binds := req.GetBinds()
	if err := wire.ValidateRangeBatch(len(binds), func(i int) string { return binds[i].GetRangeId() }); err != nil {
		return nil, err
	}
	sessions := s.sessionsOf(ctx, len(binds), func(i int) (string, int64) {
		return binds[i].GetHolderId(), binds[i].GetSessionId()
	})
	out := &tenurev1.BindLeasesResponse{Results: make([]*tenurev1.BindLeaseResult, len(binds))}
	fanout.Run(len(binds), batchParallel, func(i int) {
		b := binds[i]
		res := &tenurev1.BindLeaseResult{RangeId: b.GetRangeId()}
		resp, err := func() (*tenurev1.BindLeaseResponse, error) {
			if err := checkBind(b); err != nil {
				return nil, err
			}
			sess, err := sessions(i)
			if err != nil {
				return nil, err
			}
			return s.bindLeaseIn(ctx, b, sess)
		}()
		if err != nil {
			res.Error = leaseError(ctx, err)
		} else {
			res.Bind = resp
		}
		out.Results[i] = res
	})
	return out, nil
}

// sessionsOf returns, for entry i of a batch, its holder's session: each
// distinct (holder, session id) is resolved once, on first use, and its
// answer (or error) shared by the entries that name it.
func (s *Service) sessionsOf(ctx context.Context, n int, key func(i int) (string, int64)) func(i int) (session, error) {
	type sessKey struct {
		holder string
		id     int64
	}
	type resolved struct {
		once sync.Once
		sess session
		err  error
	}
	byKey := map[sessKey]*resolved{}
	for i := range n {
		h, id := key(i)
		if byKey[sessKey{h, id}] == nil {
			byKey[sessKey{h, id}] = &resolved{}
		}
	}
	return func(i int) (session, error) {
		h, id := key(i)
		r := byKey[sessKey{h, id}]
		r.once.Do(func() { r.sess, r.err = s.resolveSession(ctx, h, id) })
		return r.sess, r.err
	}
}

// batchParallel bounds the transactions one batch has in flight. etcd
// batches concurrent transactions into shared raft proposals, so a few
// dozen in flight share most of the WAL syncs a hundred would; beyond that
// a batch only crowds out other callers' requests, among them holders'
// keep-alives, whose sessions expire if they wait longer than their TTL
// (seen with 128 in flight per batch: keep-alives timing out and a few
// hundred leases expiring under the promotions of a thousand new ranges).
const batchParallel = 16

// leaseError is one range's failure in a batch answer: the code and message
// the single-range call would have answered, and the current epoch its
// RangeEpoch detail would have carried.
func leaseError(ctx context.Context, err error) *tenurev1.LeaseError {
	err = toConnect(ctx, err)
	out := &tenurev1.LeaseError{Code: uint32(connect.CodeInternal), Message: err.Error()}
	var ce *connect.Error
	if errors.As(err, &ce) {
		out.Code, out.Message = uint32(ce.Code()), ce.Message()
	}
	if cur, ok := CurrentEpoch(err); ok {
		out.CurrentEpoch = cur
	}
	return out
}
