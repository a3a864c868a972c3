package promoter

import (
	"context"
	"errors"
	"sort"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// Handlers returns the PromoterService registration to serve.
func (p *Promoter) Handlers() []transport.Registration {
	path, h := tenurev1connect.NewPromoterServiceHandler(handler{p}, transport.HandlerOptions()...)
	return []transport.Registration{{Name: tenurev1connect.PromoterServiceName, Path: path, Handler: h}}
}

type handler struct{ p *Promoter }

func (h handler) Promote(ctx context.Context, req *connect.Request[tenurev1.PromoteRequest]) (*connect.Response[tenurev1.PromoteResponse], error) {
	if err := wire.ValidateRangeID(req.Msg.GetRangeId()); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	if id := req.Msg.GetPreferredReplicaId(); id != "" {
		if err := wire.ValidateRangeID(id); err != nil {
			return nil, connect.NewError(connect.CodeInvalidArgument, err)
		}
	}
	reason := req.Msg.GetReason()
	if reason == "" {
		reason = "operator request"
	}
	tr, err := h.p.Promote(ctx, req.Msg.GetRangeId(), req.Msg.GetPreferredReplicaId(), reason)
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
	return connect.NewResponse(&tenurev1.ListTransitionsResponse{Transitions: trs}), nil
}

func (h handler) GetStatus(context.Context, *connect.Request[tenurev1.PromoterServiceGetStatusRequest]) (*connect.Response[tenurev1.PromoterServiceGetStatusResponse], error) {
	p := h.p
	p.mu.Lock()
	resp := &tenurev1.PromoterServiceGetStatusResponse{PromoterId: p.cfg.ID, Elected: p.elected, LeaderPromoterId: p.leaderID}
	for id, rs := range p.ranges {
		resp.Ranges = append(resp.Ranges, rs.status(id))
	}
	p.mu.Unlock()
	sort.Slice(resp.Ranges, func(i, j int) bool { return resp.Ranges[i].GetRangeId() < resp.Ranges[j].GetRangeId() })
	return connect.NewResponse(resp), nil
}

// ChangeReplicas implements PromoterService.ChangeReplicas.
func (h handler) ChangeReplicas(ctx context.Context, req *connect.Request[tenurev1.ChangeReplicasRequest], stream *connect.ServerStream[tenurev1.ChangeReplicasResponse]) error {
	return connect.NewError(connect.CodeUnimplemented, errors.New("promoter: ChangeReplicas is not built yet"))
}

// DeleteRange implements PromoterService.DeleteRange.
func (h handler) DeleteRange(ctx context.Context, req *connect.Request[tenurev1.PromoterServiceDeleteRangeRequest]) (*connect.Response[tenurev1.PromoterServiceDeleteRangeResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("promoter: DeleteRange is not built yet"))
}
