package transport_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// TestLostStream: a stream whose server vanishes mid-body is Unavailable;
// an Internal error the server itself sent stays Internal.
func TestLostStream(t *testing.T) {
	// The handler answers offset 1 with an error of its own; any other
	// offset it answers once, then waits until the test has closed the
	// server under it.
	mux := http.NewServeMux()
	mux.Handle("/t.Echo/Stream", connect.NewBidiStreamHandler("/t.Echo/Stream",
		func(ctx context.Context, s *connect.BidiStream[tenurev1.FetchRequest, tenurev1.FetchResponse]) error {
			m, err := s.Receive()
			if err != nil {
				return err
			}
			if m.GetFetchOffset() == 1 {
				return connect.NewError(connect.CodeInternal, errors.New("disk on fire"))
			}
			if err := s.Send(&tenurev1.FetchResponse{}); err != nil {
				return err
			}
			<-ctx.Done()
			return ctx.Err()
		}, transport.HandlerOptions()...))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := transport.ServeListener(ln, transport.Registration{Name: "t.Echo", Path: "/t.Echo/", Handler: mux})
	t.Cleanup(func() { _ = srv.Close() })
	hc := transport.NewHTTPClient()
	t.Cleanup(hc.CloseIdleConnections)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := connect.NewClient[tenurev1.FetchRequest, tenurev1.FetchResponse](hc, srv.URL()+"/t.Echo/Stream", transport.ClientOptions()...)

	// recv sends offset and returns what the stream's Receive says; with
	// crash, it first takes the one answer and then closes the server.
	recv := func(offset uint64, crash bool) error {
		s := c.CallBidiStream(ctx)
		defer func() { _ = s.CloseResponse() }()
		if err := s.Send(&tenurev1.FetchRequest{FetchOffset: offset}); err != nil {
			return err
		}
		if crash {
			// Mid-body: the response has begun (headers and one message).
			if _, err := s.Receive(); err != nil {
				return err
			}
			_ = srv.Close()
		}
		_, err := s.Receive()
		return transport.LostStream(err)
	}

	err = recv(1, false)
	if connect.CodeOf(err) != connect.CodeInternal || !connect.IsWireError(err) {
		t.Fatalf("the server's own Internal error = %v, want it kept (Internal, from the wire)", err)
	}
	err = recv(2, true)
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("a stream whose server closed mid-body = %v, want Unavailable", err)
	}
}
