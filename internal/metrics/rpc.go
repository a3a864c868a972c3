package metrics

import (
	"context"
	"errors"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
)

// RPC is a Connect handler interceptor counting each call by procedure and
// outcome code, and timing it: tenure_rpc_server_handled_total and
// tenure_rpc_server_duration_seconds. Both labels are bounded: procedures
// are the service's methods, codes Connect's 17 ("ok" and the error codes).
// A streaming call is counted and timed when it ends.
type RPC struct {
	handled  *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// NewRPC registers the RPC series on reg. Servers sharing a registry (tenure
// dev's lease service and promoter, one process) share the series: the
// procedure label tells them apart.
func NewRPC(reg prometheus.Registerer) (*RPC, error) {
	r := &RPC{
		handled: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: "rpc", Name: "server_handled_total",
			Help: "RPCs this server finished, by procedure and Connect code (ok, or the error's code)."}, []string{"procedure", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: "rpc", Name: "server_duration_seconds",
			Help: "Time from an RPC's arrival to its answer (a stream: to its end), by procedure.", Buckets: LatencyBuckets}, []string{"procedure"}),
	}
	if err := reg.Register(r.handled); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return nil, err
		}
		r.handled = are.ExistingCollector.(*prometheus.CounterVec)
	}
	if err := reg.Register(r.duration); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return nil, err
		}
		r.duration = are.ExistingCollector.(*prometheus.HistogramVec)
	}
	return r, nil
}

func (r *RPC) observe(procedure string, began time.Time, err error) {
	code := "ok"
	if err != nil {
		code = connect.CodeOf(err).String()
		var ce *connect.Error
		if !errors.As(err, &ce) {
			code = connect.CodeUnknown.String()
		}
	}
	r.handled.WithLabelValues(procedure, code).Inc()
	r.duration.WithLabelValues(procedure).Observe(time.Since(began).Seconds())
}

// WrapUnary times and counts a unary call.
func (r *RPC) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		began := time.Now()
		res, err := next(ctx, req)
		r.observe(req.Spec().Procedure, began, err)
		return res, err
	}
}

// WrapStreamingClient leaves clients alone: the series are the server's.
func (r *RPC) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler times and counts a stream when it ends.
func (r *RPC) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		began := time.Now()
		err := next(ctx, conn)
		r.observe(conn.Spec().Procedure, began, err)
		return err
	}
}
