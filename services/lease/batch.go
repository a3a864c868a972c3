package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"connectrpc.com/connect"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenurelog/tenure/internal/fanout"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// This file holds the batched calls: GetRanges, GrantEpochs and BindLeases.
// A dead holder loses all its leases at once, and the promoter then reads,
// grants and binds hundreds of ranges together; one call per range spent its
// CPU on HTTP/2 framing and a session read per range.
//
// A batch is a transport, and for grants and binds also one etcd
// transaction per nestedPerTxn ranges: each range is a nested transaction
// of it (clientv3.OpTxn) with its own compare-and-swap on its epoch
// (grantTxn, bindTxn), so one lost race fails that range alone, exactly as
// its own transaction would. A flat multi-range transaction would be
// all-or-nothing: one stale previous epoch would refuse every grant with
// it. Nesting keeps each range's decision its own while a batch of 128
// costs two raft proposals, not 128: in a mass failover of 1,000 ranges,
// one transaction per range was 2,000 proposals contending for etcd with
// the surviving holders' keep-alives, and a grant waited 100-200 ms.
//
// What a batch also shares is the session lookup: a promoter grants every
// range of a failover to its one session, so it is read once per (holder,
// session) named, not once per range; each range's compares still check
// the session's creation revision, so a session that expired after the
// lookup grants nothing.

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
	out := &tenurev1.GrantEpochsResponse{Results: make([]*tenurev1.GrantEpochResult, len(grants))}
	commitBatch(ctx, s, len(grants), func(i int) (string, int64) { return grants[i].GetHolderId(), grants[i].GetSessionId() },
		func(i int) error { return checkGrant(grants[i]) },
		func(i int, sess session) rangeTxn { return s.grantTxn(grants[i], sess) },
		func(i int, sess session, succeeded bool, rs []*etcdserverpb.ResponseOp) (*tenurev1.GrantEpochResponse, error) {
			return s.grantAnswer(ctx, grants[i], sess, succeeded, rs)
		},
		func(i int, resp *tenurev1.GrantEpochResponse, err error) {
			res := &tenurev1.GrantEpochResult{RangeId: grants[i].GetRangeId()}
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
	out := &tenurev1.BindLeasesResponse{Results: make([]*tenurev1.BindLeaseResult, len(binds))}
	commitBatch(ctx, s, len(binds), func(i int) (string, int64) { return binds[i].GetHolderId(), binds[i].GetSessionId() },
		func(i int) error { return checkBind(binds[i]) },
		func(i int, sess session) rangeTxn { return s.bindTxn(binds[i], sess) },
		func(i int, sess session, succeeded bool, rs []*etcdserverpb.ResponseOp) (*tenurev1.BindLeaseResponse, error) {
			return s.bindAnswer(ctx, binds[i], sess, succeeded, rs)
		},
		func(i int, resp *tenurev1.BindLeaseResponse, err error) {
			res := &tenurev1.BindLeaseResult{RangeId: binds[i].GetRangeId()}
			if err != nil {
				res.Error = leaseError(ctx, err)
			} else {
				res.Bind = resp
			}
			out.Results[i] = res
		})
	return out, nil
}

// commitBatch runs the n per-range transactions of a grant or bind batch:
// each request is checked and its holder's session looked up (once per
// session, sessionsOf), its transaction built (txn) and committed with the
// others (commitEach), and its answer read from its own outcome (result);
// answer gets each range's response or error, exactly once.
func commitBatch[Resp any](ctx context.Context, s *Service, n int,
	holder func(i int) (string, int64),
	check func(i int) error,
	txn func(i int, sess session) rangeTxn,
	result func(i int, sess session, succeeded bool, rs []*etcdserverpb.ResponseOp) (Resp, error),
	answer func(i int, resp Resp, err error),
) {
	var zero Resp
	sessions := s.sessionsOf(ctx, n, holder)
	sess := make([]session, n)
	var txns []rangeTxn
	for i := range n {
		err := check(i)
		if err == nil {
			sess[i], err = sessions(i)
		}
		if err != nil {
			answer(i, zero, err)
			continue
		}
		t := txn(i, sess[i])
		t.rangeIndex = i
		txns = append(txns, t)
	}
	s.commitEach(ctx, txns, func(t rangeTxn, succeeded bool, rs []*etcdserverpb.ResponseOp, err error) {
		i := t.rangeIndex
		if err != nil {
			answer(i, zero, err)
			return
		}
		resp, err := result(i, sess[i], succeeded, rs)
		answer(i, resp, err)
	})
}

// nestedPerTxn is how many ranges' transactions one etcd transaction
// carries. etcd refuses a transaction whose operations at one level plus
// the largest nested one exceed --max-txn-ops (default 128): 64 ranges of
// at most four operations each stay well within it, and a batch of
// wire.MaxRangesPerBatch is two transactions.
const nestedPerTxn = 64

// commitEach commits every range's transaction, nestedPerTxn of them per
// etcd transaction (each a nested transaction deciding on its own
// compares), and calls done once per range with its outcome and responses,
// or with the error of the etcd transaction that carried it. An etcd that
// refuses the nested form (a lower --max-txn-ops, a request too large)
// gets each range as its own transaction instead, batchParallel at a time.
func (s *Service) commitEach(ctx context.Context, txns []rangeTxn, done func(t rangeTxn, succeeded bool, rs []*etcdserverpb.ResponseOp, err error)) {
	chunks := (len(txns) + nestedPerTxn - 1) / nestedPerTxn
	fanout.Run(chunks, batchParallel, func(c int) {
		chunk := txns[c*nestedPerTxn : min((c+1)*nestedPerTxn, len(txns))]
		ops := make([]clientv3.Op, len(chunk))
		for i, t := range chunk {
			ops[i] = clientv3.OpTxn(t.cmps, t.then, t.els)
		}
		resp, err := s.kv.Txn(ctx).Then(ops...).Commit()
		if errors.Is(err, rpctypes.ErrTooManyOps) || errors.Is(err, rpctypes.ErrRequestTooLarge) {
			// Refused before it was applied: nothing of it happened.
			fanout.Run(len(chunk), batchParallel, func(i int) {
				t := chunk[i]
				resp, err := s.kv.Txn(ctx).If(t.cmps...).Then(t.then...).Else(t.els...).Commit()
				if err != nil {
					done(t, false, nil, err)
					return
				}
				done(t, resp.Succeeded, resp.Responses, nil)
			})
			return
		}
		for i, t := range chunk {
			switch {
			case err != nil:
				done(t, false, nil, err)
			case i >= len(resp.Responses) || resp.Responses[i].GetResponseTxn() == nil:
				done(t, false, nil, fmt.Errorf("etcd answered %d responses for %d nested transactions", len(resp.Responses), len(chunk)))
			default:
				r := resp.Responses[i].GetResponseTxn()
				done(t, r.Succeeded, r.Responses, nil)
			}
		}
	})
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
