package transport_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// recorder is an interceptor that records which side saw which procedure.
type recorder struct {
	name string
	mu   sync.Mutex
	seen []string
}

func (r *recorder) add(isClient bool, procedure string) {
	side := "server"
	if isClient {
		side = "client"
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, r.name+" "+side+" "+procedure)
}

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.seen
	r.seen = nil
	return out
}

func (r *recorder) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		r.add(req.Spec().IsClient, req.Spec().Procedure)
		return next(ctx, req)
	}
}

func (r *recorder) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		r.add(true, spec.Procedure)
		return next(ctx, spec)
	}
}

func (r *recorder) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		r.add(false, conn.Spec().Procedure)
		return next(ctx, conn)
	}
}

type watchServer struct {
	tenurev1connect.UnimplementedLeaseServiceHandler
}

func (watchServer) WatchLeases(_ context.Context, _ *connect.Request[tenurev1.WatchLeasesRequest], s *connect.ServerStream[tenurev1.WatchLeasesResponse]) error {
	return s.Send(&tenurev1.WatchLeasesResponse{})
}

// Interceptors installed after a handler and a client were built must still
// run on their calls: otherwise whether a hop is traced depends on start-up
// order, and an untraced hop splits one promotion into two traces.
func TestSetInterceptorsAppliesToHandlersAndClientsBuiltBefore(t *testing.T) {
	t.Cleanup(func() { transport.SetInterceptors() })
	transport.SetInterceptors()
	srv := start(t)
	lpath, lh := tenurev1connect.NewLeaseServiceHandler(watchServer{}, transport.HandlerOptions()...)
	lsrv, err := transport.Serve("127.0.0.1:0", transport.Registration{Name: tenurev1connect.LeaseServiceName, Path: lpath, Handler: lh})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lsrv.Close() })
	hc := transport.NewHTTPClient()
	logc := tenurev1connect.NewLogServiceClient(hc, srv.URL(), transport.ClientOptions()...)
	leasec := tenurev1connect.NewLeaseServiceClient(hc, lsrv.URL(), transport.ClientOptions()...)
	call := func() {
		t.Helper()
		if _, err := logc.Read(context.Background(), connect.NewRequest(&tenurev1.ReadRequest{})); err != nil {
			t.Fatalf("Read: %v", err)
		}
		stream, err := leasec.WatchLeases(context.Background(), connect.NewRequest(&tenurev1.WatchLeasesRequest{}))
		if err != nil {
			t.Fatalf("WatchLeases: %v", err)
		}
		for stream.Receive() {
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("WatchLeases: %v", err)
		}
		stream.Close()
	}

	outer, inner := &recorder{name: "outer"}, &recorder{name: "inner"}
	call() // nothing installed: nothing to record, and the chain is cached empty
	transport.SetInterceptors(outer, inner)
	call()
	read, watch := tenurev1connect.LogServiceReadProcedure, tenurev1connect.LeaseServiceWatchLeasesProcedure
	for _, r := range []*recorder{outer, inner} {
		got := r.take()
		want := []string{r.name + " client " + read, r.name + " server " + read, r.name + " client " + watch, r.name + " server " + watch}
		if !slices.Equal(got, want) {
			t.Errorf("%s saw %q, want %q", r.name, got, want)
		}
	}

	// Replacing the set takes effect on the next call; removing it stops it.
	transport.SetInterceptors(inner)
	call()
	if got := outer.take(); len(got) != 0 {
		t.Errorf("outer, no longer installed, saw %q", got)
	}
	if got := inner.take(); len(got) != 4 {
		t.Errorf("inner saw %q, want 4 calls", got)
	}
	transport.SetInterceptors()
	call()
	if got := inner.take(); len(got) != 0 {
		t.Errorf("inner, removed, saw %q", got)
	}
}

// The first interceptor installed is the outermost, as with
// connect.WithInterceptors.
func TestSetInterceptorsOrder(t *testing.T) {
	t.Cleanup(func() { transport.SetInterceptors() })
	var mu sync.Mutex
	var order []string
	mark := func(name string) connect.Interceptor {
		return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				if req.Spec().IsClient {
					mu.Lock()
					order = append(order, name)
					mu.Unlock()
				}
				return next(ctx, req)
			}
		})
	}
	srv := start(t)
	c := tenurev1connect.NewLogServiceClient(transport.NewHTTPClient(), srv.URL(), transport.ClientOptions()...)
	transport.SetInterceptors(mark("first"), mark("second"))
	if _, err := c.Read(context.Background(), connect.NewRequest(&tenurev1.ReadRequest{})); err != nil {
		t.Fatal(err)
	}
	if want := []string{"first", "second"}; !slices.Equal(order, want) {
		t.Errorf("interceptors ran in order %q, want %q", order, want)
	}
}
