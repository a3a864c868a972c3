package transport_test

import (
	"net"
	"net/http"
	"testing"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// BenchmarkRoundTrip compares one request and its answer as a unary call
// and as one message each way on an open bidi stream, over the transport
// tenure uses (HTTP/2 cleartext, Connect protocol). It is why the
// replication path (FetchStream) and producers (AppendStream) use streams:
//
//	go test -run='^$' -bench=RoundTrip -count=3 ./pkg/transport
func BenchmarkRoundTrip(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/bench.Echo/Unary", connect.NewUnaryHandler("/bench.Echo/Unary", echoUnary, transport.HandlerOptions()...))
	mux.Handle("/bench.Echo/Stream", connect.NewBidiStreamHandler("/bench.Echo/Stream", echoStream, transport.HandlerOptions()...))
	srv := transport.ServeListener(ln, transport.Registration{Name: "bench.Echo", Path: "/bench.Echo/", Handler: mux})
	b.Cleanup(func() { _ = srv.Close() })
	hc := transport.NewHTTPClient()
	b.Cleanup(hc.CloseIdleConnections)

	b.Run("unary", func(b *testing.B) {
		c := connect.NewClient[tenurev1.FetchRequest, tenurev1.FetchResponse](hc, srv.URL()+"/bench.Echo/Unary", transport.ClientOptions()...)
		for i := 0; b.Loop(); i++ {
			if _, err := c.CallUnary(b.Context(), connect.NewRequest(&tenurev1.FetchRequest{FetchOffset: uint64(i)})); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("stream", func(b *testing.B) {
		c := connect.NewClient[tenurev1.FetchRequest, tenurev1.FetchResponse](hc, srv.URL()+"/bench.Echo/Stream", transport.ClientOptions()...)
		s := c.CallBidiStream(b.Context())
		defer func() { _ = s.CloseRequest(); _ = s.CloseResponse() }()
		for i := 0; b.Loop(); i++ {
			if err := s.Send(&tenurev1.FetchRequest{FetchOffset: uint64(i)}); err != nil {
				b.Fatal(err)
			}
			if _, err := s.Receive(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
