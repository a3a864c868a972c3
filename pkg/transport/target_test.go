package transport_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// TestRequireReplica: a request naming another replica is refused before
// the handler runs, and its connection is closed so the next call dials
// again; a request naming this replica, or none, is served.
func TestRequireReplica(t *testing.T) {
	var served atomic.Int64
	mux := http.NewServeMux()
	count := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served.Add(1); h.ServeHTTP(w, r) })
	}
	mux.Handle("/t.Echo/Unary", count(connect.NewUnaryHandler("/t.Echo/Unary", echoUnary, transport.HandlerOptions()...)))
	mux.Handle("/t.Echo/Stream", count(connect.NewBidiStreamHandler("/t.Echo/Stream", echoStream, transport.HandlerOptions()...)))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := transport.ServeListener(ln, transport.Registration{Name: "t.Echo", Path: "/t.Echo/", Handler: transport.RequireReplica("r2", mux)})
	t.Cleanup(func() { _ = srv.Close() })
	hc := transport.NewHTTPClient()
	t.Cleanup(hc.CloseIdleConnections)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// call makes one unary call with opts and reports whether it used a
	// connection opened before it.
	call := func(opts ...connect.ClientOption) (reused bool, err error) {
		c := connect.NewClient[tenurev1.FetchRequest, tenurev1.FetchResponse](hc, srv.URL()+"/t.Echo/Unary", transport.ClientOptions(opts...)...)
		tctx := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }})
		_, err = c.CallUnary(tctx, connect.NewRequest(&tenurev1.FetchRequest{FetchOffset: 7}))
		return reused, err
	}

	if _, err := call(transport.ForReplica("r2")); err != nil {
		t.Fatalf("call for r2 = %v", err)
	}
	if reused, err := call(); err != nil || !reused {
		t.Fatalf("call naming no replica = %v (reused %v), want served on the same connection", err, reused)
	}
	before := served.Load()
	_, err = call(transport.ForReplica("r3"))
	if connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "misdirected: this is replica r2, the request is for replica r3") {
		t.Fatalf("call for r3 = %v, want Unavailable: misdirected", err)
	}
	if served.Load() != before {
		t.Fatal("the handler ran for a request meant for another replica")
	}
	// The server closed that connection (GOAWAY): the next call dials.
	if reused, err := call(transport.ForReplica("r2")); err != nil || reused {
		t.Fatalf("call for r2 after a misdirected one = %v (reused %v), want served on a new connection", err, reused)
	}

	// A stream meant for another replica is refused the same way.
	c := connect.NewClient[tenurev1.FetchRequest, tenurev1.FetchResponse](hc, srv.URL()+"/t.Echo/Stream", transport.ClientOptions(transport.ForReplica("r3"))...)
	s := c.CallBidiStream(ctx)
	_ = s.Send(&tenurev1.FetchRequest{FetchOffset: 1})
	if _, err := s.Receive(); connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "misdirected") {
		t.Fatalf("stream for r3: Receive = %v, want Unavailable: misdirected", err)
	}
	_ = s.CloseRequest()
	_ = s.CloseResponse()
	if served.Load() != before+1 {
		t.Fatalf("handlers ran %d times, want %d", served.Load(), before+1)
	}
}
