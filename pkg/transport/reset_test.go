package transport_test

import (
	"context"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// resetListener keeps the connections it accepts, so a test can reset them
// all (SO_LINGER 0: the peer reads ECONNRESET), as a server killed with
// unread bytes in its socket does.
type resetListener struct {
	net.Listener
	mu    sync.Mutex
	conns []*net.TCPConn
}

func (l *resetListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		l.mu.Lock()
		l.conns = append(l.conns, tc)
		l.mu.Unlock()
	}
	return c, err
}

func (l *resetListener) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		_ = c.SetLinger(0)
		_ = c.Close()
	}
	l.conns = nil
}

// A server process killed mid-call resets its connections. connect-go
// reports a reset as Canceled, the code of a call its caller canceled,
// which a client does not retry; the caller's context is live, so it is a
// lost connection: Unavailable, outcome unknown, for unary calls and for
// streams alike, in every client built with ClientOptions.
func TestConnectionResetIsUnavailable(t *testing.T) {
	reached := make(chan struct{}, 4)
	mux := http.NewServeMux()
	mux.Handle("/t.Echo/Unary", connect.NewUnaryHandler("/t.Echo/Unary",
		func(ctx context.Context, _ *connect.Request[tenurev1.FetchRequest]) (*connect.Response[tenurev1.FetchResponse], error) {
			reached <- struct{}{}
			<-ctx.Done()
			return nil, ctx.Err()
		}, transport.HandlerOptions()...))
	mux.Handle("/t.Echo/Stream", connect.NewServerStreamHandler("/t.Echo/Stream",
		func(ctx context.Context, _ *connect.Request[tenurev1.FetchRequest], s *connect.ServerStream[tenurev1.FetchResponse]) error {
			if err := s.Send(&tenurev1.FetchResponse{}); err != nil {
				return err
			}
			<-ctx.Done()
			return ctx.Err()
		}, transport.HandlerOptions()...))
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &resetListener{Listener: inner}
	srv := transport.ServeListener(ln, transport.Registration{Name: "t.Echo", Path: "/t.Echo/", Handler: mux})
	t.Cleanup(func() { _ = srv.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	t.Run("unary", func(t *testing.T) {
		hc := transport.NewHTTPClient()
		defer hc.CloseIdleConnections()
		c := connect.NewClient[tenurev1.FetchRequest, tenurev1.FetchResponse](hc, srv.URL()+"/t.Echo/Unary", transport.ClientOptions()...)
		go func() {
			select {
			case <-reached:
				ln.reset()
			case <-ctx.Done():
			}
		}()
		_, err := c.CallUnary(ctx, connect.NewRequest(&tenurev1.FetchRequest{}))
		if connect.CodeOf(err) != connect.CodeUnavailable {
			t.Fatalf("a unary call whose connection was reset = %v (code %v), want Unavailable", err, connect.CodeOf(err))
		}
	})
	t.Run("stream", func(t *testing.T) {
		hc := transport.NewHTTPClient()
		defer hc.CloseIdleConnections()
		c := connect.NewClient[tenurev1.FetchRequest, tenurev1.FetchResponse](hc, srv.URL()+"/t.Echo/Stream", transport.ClientOptions()...)
		s, err := c.CallServerStream(ctx, connect.NewRequest(&tenurev1.FetchRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if !s.Receive() {
			t.Fatalf("first message: %v", s.Err())
		}
		ln.reset()
		if s.Receive() {
			t.Fatal("a second message after the reset")
		}
		if err := s.Err(); connect.CodeOf(err) != connect.CodeUnavailable {
			t.Fatalf("a stream whose connection was reset = %v (code %v), want Unavailable", err, connect.CodeOf(err))
		}
	})
}
