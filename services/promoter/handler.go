package promoter

import (
	"context"
	"fmt"
	"sort"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// Handlers returns the PromoterService registration to serve.
func (p *Promoter) Handlers() []transport.Registration {
	var extra []connect.HandlerOption
	if p.rpc != nil {
		extra = append(extra, connect.WithInterceptors(p.rpc))
	}
	path, h := tenurev1connect.NewPromoterServiceHandler(handler{p}, transport.HandlerOptions(extra...)...)
	return []transport.Registration{{Name: tenurev1connect.PromoterServiceName, Path: path, Handler: h}}
}

type handler struct{ p *Promoter }

// unsafeReason is the reason of an operator's unsafe promotion that gave
// none. A promotion that finds a safe plan after all replaces it
// (promoteWith): the transition is not an unsafe one.
const unsafeReason = "operator: unsafe promotion (--unsafe-accept-data-loss)"

// maxReasonBytes bounds an operator's reason for a promotion. It is kept
// in the transition record, one etcd value: a 2 MB reason promoted, then
// its record was refused by etcd ("request is too large") and retried
// forever, holding the range's promotion slot and every later record of
// every range behind it (recordLater now refuses such a record too).
const maxReasonBytes = 1024

func (h handler) Promote(ctx context.Context, req *connect.Request[tenurev1.PromoteRequest]) (*connect.Response[tenurev1.PromoteResponse], error) {
	if c, to, ok := h.p.forwardTarget(req.Header()); ok {
		return h.p.forwardPromote(ctx, c, to, req.Msg)
	}
	if err := wire.ValidateRangeID(req.Msg.GetRangeId()); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	if id := req.Msg.GetPreferredReplicaId(); id != "" {
		if err := wire.ValidateID("preferred_replica_id", id); err != nil {
			return nil, connect.NewError(connect.CodeInvalidArgument, err)
		}
	}
	reason := req.Msg.GetReason()
	if len(reason) > maxReasonBytes {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("reason is %d bytes, at most %d", len(reason), maxReasonBytes))
	}
	unsafe := req.Msg.GetUnsafeAcceptDataLoss()
	if id := req.Msg.GetPreferredReplicaId(); id != "" && !req.Msg.GetForce() && !unsafe && h.p.Elected() {
		if epoch, ok := h.p.alreadyLeads(ctx, req.Msg.GetRangeId(), id); ok {
			// A promotion would spend an epoch, fence every replica and
			// adopt the same leader again: say so and do nothing.
			return connect.NewResponse(&tenurev1.PromoteResponse{AlreadyLeaderId: id, AlreadyLeaderEpoch: epoch}), nil
		}
	}
	switch {
	case reason == "" && unsafe:
		reason = unsafeReason
	case reason == "":
		reason = "operator request"
	}
	opts := promoteOpts{preferred: req.Msg.GetPreferredReplicaId(), reason: reason, unsafe: unsafe, waitRecord: true}
	var tr *tenurev1.Transition
	var err error
	if opts.preferred != "" && !unsafe {
		// A named replica is where the operator wants leadership: a
		// planned handover lands there or says why not (handover.go). An
		// unsafe promotion only prefers it among the most complete
		// survivors: with a quorum gone, nothing may wait for a catch-up.
		opts.target = opts.preferred
		tr, err = h.p.handover(ctx, req.Msg.GetRangeId(), opts)
	} else {
		tr, err = h.p.promoteNow(ctx, req.Msg.GetRangeId(), opts)
	}
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&tenurev1.PromoteResponse{Transition: tr}), nil
}

func (h handler) ListTransitions(ctx context.Context, req *connect.Request[tenurev1.ListTransitionsRequest]) (*connect.Response[tenurev1.ListTransitionsResponse], error) {
	if err := wire.ValidateRangeID(req.Msg.GetRangeId()); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	trs, err := h.p.transitions(ctx, req.Msg.GetRangeId(), int(req.Msg.GetLimit()))
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	if len(trs) == 0 {
		// No record: a range never promoted, or none at all. A caller
		// with a mistyped id read an empty history as "never promoted";
		// the lease service knows which. When it cannot be asked, the
		// empty list stands: it is what the records say.
		if _, err := h.p.getRange(ctx, req.Msg.GetRangeId()); connect.CodeOf(err) == connect.CodeNotFound {
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("range %q does not exist", req.Msg.GetRangeId()))
		}
	}
	return connect.NewResponse(&tenurev1.ListTransitionsResponse{Transitions: trs}), nil
}

// GetStatus answers with the elected promoter's status, from a standby
// too (forwarded): a standby's range states are stale. A standby that
// cannot reach the elected one answers for itself (not elected, naming
// it), which is still the truth about it.
func (h handler) GetStatus(ctx context.Context, req *connect.Request[tenurev1.PromoterServiceGetStatusRequest]) (*connect.Response[tenurev1.PromoterServiceGetStatusResponse], error) {
	p := h.p
	if c, to, ok := p.forwardTarget(req.Header()); ok {
		resp, err := p.forwardGetStatus(ctx, c, to, req.Msg)
		if err == nil || ctx.Err() != nil {
			return resp, err
		}
		p.log.Debug("status not forwarded to the elected promoter; answering for this one", "elected", to, "err", err)
	}
	p.mu.Lock()
	resp := &tenurev1.PromoterServiceGetStatusResponse{PromoterId: p.cfg.ID, Elected: p.elected, LeaderPromoterId: p.leaderID,
		ElectionError: p.electionFailureLocked()}
	for id, rs := range p.ranges {
		resp.Ranges = append(resp.Ranges, rs.status(id))
	}
	p.mu.Unlock()
	sort.Slice(resp.Ranges, func(i, j int) bool { return resp.Ranges[i].GetRangeId() < resp.Ranges[j].GetRangeId() })
	return connect.NewResponse(resp), nil
}

// ChangeReplicas implements PromoterService.ChangeReplicas: one message per
// phase as it ends.
func (h handler) ChangeReplicas(ctx context.Context, req *connect.Request[tenurev1.ChangeReplicasRequest], stream *connect.ServerStream[tenurev1.ChangeReplicasResponse]) error {
	if c, to, ok := h.p.forwardTarget(req.Header()); ok {
		return h.p.forwardChangeReplicas(ctx, c, to, req.Msg, stream.Send)
	}
	return h.p.ChangeReplicas(ctx, req.Msg, stream.Send)
}

// DeleteRange implements PromoterService.DeleteRange.
func (h handler) DeleteRange(ctx context.Context, req *connect.Request[tenurev1.PromoterServiceDeleteRangeRequest]) (*connect.Response[tenurev1.PromoterServiceDeleteRangeResponse], error) {
	if c, to, ok := h.p.forwardTarget(req.Header()); ok {
		return h.p.forwardDeleteRange(ctx, c, to, req.Msg)
	}
	resp, err := h.p.DeleteRange(ctx, req.Msg.GetRangeId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

// alreadyLeads reports whether replica id leads rangeID with a live lease
// at its current epoch, as the lease service says, and that epoch. Any
// doubt (the range cannot be read, no live lease, another holder) is no:
// the promotion runs and answers for itself.
func (p *Promoter) alreadyLeads(ctx context.Context, rangeID, id string) (uint64, bool) {
	rng, err := p.getRange(ctx, rangeID)
	if err != nil {
		return 0, false
	}
	l := rng.GetLease()
	if l.GetHolderId() != id || !l.GetLive() || rng.GetEpoch() == 0 || l.GetEpoch() != rng.GetEpoch() {
		return 0, false
	}
	return rng.GetEpoch(), true
}
