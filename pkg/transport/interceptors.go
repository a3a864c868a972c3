package transport

import (
	"context"
	"slices"
	"sync/atomic"

	"connectrpc.com/connect"
)

// Interceptors (tracing) are installed process-wide with SetInterceptors and
// looked up when a call is made, not when a handler or client is built.
// Looking them up at build time made correctness depend on start-up order:
// a client built before telemetry.Setup (a harness started first, a
// package-level client) went untraced without any error, and one untraced
// hop splits a promotion's trace in two, so the replica's side of a fence
// shows up as an unrelated trace. Every handler and client is instead built
// with one fixed interceptor, installedInterceptors, that delegates to
// whatever is installed at call time.
//
// The cost when nothing is installed is one atomic load per call. When
// interceptors are installed, the wrapped chain is built once per installed
// set and per handler/client procedure, then reused.

// installedSet is one call to SetInterceptors. It is immutable; a new call
// stores a new set, so a built chain can be cached against its pointer.
type installedSet struct {
	list []connect.Interceptor
}

// installed is the current set; never nil.
var installed atomic.Pointer[installedSet]

func init() { installed.Store(&installedSet{}) }

// SetInterceptors installs interceptors (tracing) used by every call of
// every handler and client, including those built before it was called.
// The first interceptor is the outermost, as with connect.WithInterceptors.
// SetInterceptors() with no arguments removes them (tests). Calls already in
// flight finish with the interceptors they started with.
func SetInterceptors(list ...connect.Interceptor) {
	installed.Store(&installedSet{list: slices.Clone(list)})
}

// installedInterceptors is the interceptor every tenure handler and client
// is built with (HandlerOptions, ClientOptions).
type installedInterceptors struct{}

var _ connect.Interceptor = installedInterceptors{}

func (installedInterceptors) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	current := chainOf(next, connect.Interceptor.WrapUnary)
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		return current()(ctx, req)
	}
}

func (installedInterceptors) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	current := chainOf(next, connect.Interceptor.WrapStreamingClient)
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		return current()(ctx, spec)
	}
}

func (installedInterceptors) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	current := chainOf(next, connect.Interceptor.WrapStreamingHandler)
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return current()(ctx, conn)
	}
}

// chainOf returns a function giving next wrapped by the currently installed
// interceptors, rebuilding the wrap only when the installed set changed.
func chainOf[F any](next F, wrap func(connect.Interceptor, F) F) func() F {
	type built struct {
		from *installedSet
		fn   F
	}
	var cache atomic.Pointer[built]
	return func() F {
		set := installed.Load()
		if len(set.list) == 0 {
			return next
		}
		if b := cache.Load(); b != nil && b.from == set {
			return b.fn
		}
		fn := next
		// Wrap from the last so the first interceptor runs first.
		for i := len(set.list) - 1; i >= 0; i-- {
			fn = wrap(set.list[i], fn)
		}
		cache.Store(&built{from: set, fn: fn})
		return fn
	}
}
