// Package transport runs and dials tenure's Connect services: HTTP/2
// cleartext (so gRPC clients, grpcurl and buf curl work as well as Connect
// clients), a read limit on every handler and client, gRPC health and
// reflection on every server. It is the one place where every service's
// network options are set, so they cannot drift apart.
package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"

	"github.com/tenurelog/tenure/pkg/auth"
	"github.com/tenurelog/tenure/pkg/wire"
)

// Registration is one Connect service to serve: the path prefix and handler
// returned by a generated NewXServiceHandler, and the service's full name
// (the generated XServiceName constant) for health and reflection.
type Registration struct {
	Name    string
	Path    string
	Handler http.Handler
}

// HandlerOptions are the options every tenure handler is built with: the
// read limit, so a peer cannot make us allocate on its say-so, responses
// that are never compressed, the interceptors installed with
// SetInterceptors, now or later, and a JSON codec whose refusals name the
// API's messages (jsonCodec).
//
// Connect gzips every response whose client accepts gzip (every Connect and
// gRPC client does), whatever its size. That is a compressor reset (hundreds
// of KiB of tables) and a deflate per answer: on the append path one per
// acknowledgement and per fetch answer, ~10% of a 3-replica cluster's CPU at
// 64 clients; in a mass failover ~6% of the lease service's CPU for its
// batched answers; on an open stream it is most of a round trip's cost
// (BenchmarkRoundTrip). The payloads are tiny (acks, status) or the
// clients' own bytes (records), often incompressible, on a local network.
// Requests a client compressed are still accepted.
func HandlerOptions(extra ...connect.HandlerOption) []connect.HandlerOption {
	opts := []connect.HandlerOption{
		connect.WithReadMaxBytes(wire.MaxMessageBytes),
		connect.WithCompressMinBytes(math.MaxInt),
		connect.WithInterceptors(lostConnection{}, installedInterceptors{}),
		// JSON requests that do not parse are refused naming the proto
		// message, not its Go type (jsonCodec); both of the names
		// connect-go registers its JSON codec under.
		connect.WithCodec(jsonCodec{"json"}),
		connect.WithCodec(jsonCodec{"json; charset=utf-8"}),
	}
	return append(opts, extra...)
}

// ClientOptions are the options every tenure client is built with: the same
// read limit as the handlers, the Connect protocol (binary protobuf over
// HTTP/2) and the interceptors installed with SetInterceptors, now or later.
// A connection lost under a call (a server killed mid-call resets it) is
// Unavailable on every such client, unary or stream (LostStream): never the
// Canceled connect-go reports for a reset, which means the caller gave up.
//
// Connect rather than gRPC: every tenure server speaks Connect, gRPC and
// gRPC-Web (so grpcurl and gRPC clients in other languages still work), and
// Connect is the cheaper of them per call. A unary call is one HEADERS and
// one DATA frame each way, without gRPC's length-prefixed envelope and
// trailers frame; each hop of the replication path (an append, a fetch) is
// one unary call, and at 64 clients per-call CPU is what bounds throughput.
func ClientOptions(extra ...connect.ClientOption) []connect.ClientOption {
	opts := []connect.ClientOption{
		connect.WithReadMaxBytes(wire.MaxMessageBytes),
		connect.WithInterceptors(lostConnection{}, installedInterceptors{}),
	}
	return append(opts, extra...)
}

// NewHTTPClient returns an HTTP client that speaks HTTP/2 without TLS to
// tenure servers (net/http's Protocols, no x/net/h2c). Calls are bounded by
// their contexts; the dial timeout bounds a connect to a dead peer. Streamed
// messages go out one DATA frame each (envelopeTransport).
//
// Under SetTLS it also speaks HTTP/2 over TLS to https URLs, presenting the
// process's certificate and verifying the server's against its CA.
func NewHTTPClient() *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	var tlsConfig *tls.Config
	if src := TLS(); src != nil {
		p.SetHTTP2(true)
		tlsConfig = src.ClientConfig()
	}
	return &http.Client{Transport: envelopeTransport{&http.Transport{
		Protocols:           &p,
		TLSClientConfig:     tlsConfig,
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 15 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     90 * time.Second,
		// A connection to a peer that stopped answering (a frozen
		// container, a partition that drops packets) would otherwise carry
		// every later call to that address, each hanging to its deadline,
		// for as long as the kernel keeps the TCP connection open. After
		// pingAfter without a frame it is pinged, and closed when the ping
		// goes unanswered for pingTimeout: the next call dials again, and
		// resolves the name again (see ReplicaIDHeader for why that
		// matters). Long polls are unaffected: a live peer answers pings.
		HTTP2: &http.HTTP2Config{SendPingTimeout: pingAfter, PingTimeout: pingTimeout},
	}}}
}

// pingAfter and pingTimeout bound how long a connection to a silent peer
// is kept (NewHTTPClient). Variables so a test need not wait 10 s.
var pingAfter, pingTimeout = 5 * time.Second, 5 * time.Second

// Server is a running Connect server.
type Server struct {
	Addr string // the bound address, e.g. "127.0.0.1:40123"
	// scheme is "https" when the server speaks TLS.
	scheme string
	srv    *http.Server
	done   chan error
	// drain is closed when a Shutdown or Close begins (Draining).
	drain     chan struct{}
	drainOnce sync.Once

	stopOnce sync.Once
	stopErr  error // what Serve returned; set once stopped
}

// Serve listens on addr ("127.0.0.1:0" picks a port) and serves the given
// services plus grpc.health.v1 and gRPC reflection for each of them. It
// returns once the listener is bound; Close stops it.
func Serve(addr string, regs ...Registration) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("transport: listen on %s: %w", addr, err)
	}
	return ServeListener(ln, regs...), nil
}

// ServeListener serves on an existing listener.
func ServeListener(ln net.Listener, regs ...Registration) *Server {
	mux := http.NewServeMux()
	names := make([]string, 0, len(regs))
	for _, r := range regs {
		mux.Handle(r.Path, r.Handler)
		names = append(names, r.Name)
	}
	mux.Handle(grpchealth.NewHandler(grpchealth.NewStaticChecker(names...)))
	reflector := grpcreflect.NewStaticReflector(names...)
	mux.Handle(grpcreflect.NewHandlerV1(reflector))
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector))

	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	var handler http.Handler = mux
	scheme := "http"
	ln, src := serverTLS(ln)
	if src != nil {
		// Every request passes the authorisation table before a handler
		// sees it (health needs no certificate; auth.Handler says why).
		p.SetHTTP2(true)
		p.SetUnencryptedHTTP2(false)
		handler, scheme = auth.Handler(mux, src, slog.Default()), "https"
	} else {
		ln = bufferedReads(ln)
	}
	drain := make(chan struct{})
	base := context.WithValue(context.Background(), drainKey{}, (<-chan struct{})(drain))
	s := &Server{
		Addr:   ln.Addr().String(),
		scheme: scheme,
		srv: &http.Server{
			Handler:           handler,
			Protocols:         &p,
			ReadHeaderTimeout: 5 * time.Second,
			// Long polls and streams (Fetch, Tail, WatchLeases) bound their
			// own time; no global write timeout would fit them all.
			BaseContext: func(net.Listener) context.Context { return base },
		},
		done:  make(chan error, 1),
		drain: drain,
	}
	s.srv.RegisterOnShutdown(s.startDrain)
	go func() {
		err := s.srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		if err != nil {
			slog.Error("transport: serve", "addr", s.Addr, "err", err)
		}
		s.done <- err
	}()
	return s
}

// URL is the server's base URL for clients.
func (s *Server) URL() string { return s.scheme + "://" + s.Addr }

// Close stops the server at once, dropping open connections: what a crash
// looks like to peers. Use Shutdown for a graceful stop.
// Calling Close or Shutdown again is a no-op.
func (s *Server) Close() error {
	s.startDrain()
	err := s.srv.Close()
	s.wait()
	return err
}

// wait waits for Serve to return; safe to call more than once.
func (s *Server) wait() {
	s.stopOnce.Do(func() { s.stopErr = <-s.done })
}

func (s *Server) startDrain() { s.drainOnce.Do(func() { close(s.drain) }) }

type drainKey struct{}

// Draining returns a channel that is closed when the Server serving the call
// whose context is ctx begins to stop (Shutdown or Close), or nil (never
// closed) for a call not served by a Server. Long-lived streams watch it:
// a graceful Shutdown waits for every open stream, and a stream that answers
// one request after another (AppendStream, FetchStream) would otherwise hold
// it until its deadline. Such a stream ends after the request in hand.
func Draining(ctx context.Context) <-chan struct{} {
	ch, _ := ctx.Value(drainKey{}).(<-chan struct{})
	return ch
}

// Shutdown stops accepting and waits (bounded by ctx) for in-flight calls.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if err != nil {
		s.srv.Close()
	}
	s.wait()
	return err
}
