package transport_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpcreflect"
	"google.golang.org/protobuf/proto"

	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// logServer answers Read with the HTTP protocol the request arrived on, so
// the test can see that clients really speak HTTP/2 without TLS.
type logServer struct {
	tenurev1connect.UnimplementedLogServiceHandler
}

func (logServer) Read(_ context.Context, req *connect.Request[tenurev1.ReadRequest]) (*connect.Response[tenurev1.ReadResponse], error) {
	return connect.NewResponse(&tenurev1.ReadResponse{Records: []*tenurev1.Record{{Value: []byte(req.Peer().Protocol)}}}), nil
}

func (logServer) Append(_ context.Context, req *connect.Request[tenurev1.AppendRequest]) (*connect.Response[tenurev1.AppendResponse], error) {
	return connect.NewResponse(&tenurev1.AppendResponse{BaseOffset: uint64(len(req.Msg.GetRecords()))}), nil
}

func start(t *testing.T) *transport.Server {
	t.Helper()
	path, h := tenurev1connect.NewLogServiceHandler(logServer{}, transport.HandlerOptions()...)
	srv, err := transport.Serve("127.0.0.1:0", transport.Registration{Name: tenurev1connect.LogServiceName, Path: path, Handler: h})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

func TestServeHTTP2Cleartext(t *testing.T) {
	srv := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client := tenurev1connect.NewLogServiceClient(transport.NewHTTPClient(), srv.URL(), transport.ClientOptions()...)
	resp, err := client.Read(ctx, connect.NewRequest(&tenurev1.ReadRequest{RangeId: "r"}))
	if err != nil {
		t.Fatalf("Read() error = %v", err)
	}
	if got := string(resp.Msg.GetRecords()[0].GetValue()); got != connect.ProtocolConnect {
		t.Errorf("server saw protocol %q, want %q", got, connect.ProtocolConnect)
	}
	// gRPC clients (grpcurl, other languages) are served too.
	grpcClient := tenurev1connect.NewLogServiceClient(transport.NewHTTPClient(), srv.URL(), transport.ClientOptions(connect.WithGRPC())...)
	resp, err = grpcClient.Read(ctx, connect.NewRequest(&tenurev1.ReadRequest{RangeId: "r"}))
	if err != nil {
		t.Fatalf("gRPC Read() error = %v", err)
	}
	if got := string(resp.Msg.GetRecords()[0].GetValue()); got != connect.ProtocolGRPC {
		t.Errorf("server saw protocol %q, want %q", got, connect.ProtocolGRPC)
	}
	// An unimplemented RPC answers Unimplemented, which the promoter reads as
	// "older version: unknown history".
	stream, err := client.Tail(ctx, connect.NewRequest(&tenurev1.TailRequest{RangeId: "r"}))
	if err != nil {
		t.Fatalf("Tail() error = %v", err)
	}
	defer stream.Close()
	if stream.Receive() {
		t.Fatal("Tail() on an unimplemented handler received a message")
	}
	if code := connect.CodeOf(stream.Err()); code != connect.CodeUnimplemented {
		t.Errorf("Tail() code = %v, want %v", code, connect.CodeUnimplemented)
	}
}

func TestReflectionAndHTTP2(t *testing.T) {
	srv := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	httpClient := transport.NewHTTPClient()
	rc := grpcreflect.NewClient(httpClient, srv.URL())
	stream := rc.NewStream(ctx)
	defer stream.Close()
	names, err := stream.ListServices()
	if err != nil {
		t.Fatalf("reflection ListServices() error = %v", err)
	}
	var got []string
	for _, n := range names {
		got = append(got, string(n))
	}
	if !slices.Contains(got, tenurev1connect.LogServiceName) {
		t.Errorf("reflection lists %v, want it to include %s", got, tenurev1connect.LogServiceName)
	}

	// gRPC health answers over the same HTTP/2 server.
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL()+"/grpc.health.v1.Health/Check", nil)
	req.Header.Set("Content-Type", "application/grpc")
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("health check: %v", err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Errorf("health check answered over HTTP/%d, want HTTP/2", resp.ProtoMajor)
	}
}

// A peer cannot make a handler read more than the read limit.
func TestReadLimit(t *testing.T) {
	srv := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := tenurev1connect.NewLogServiceClient(transport.NewHTTPClient(), srv.URL(), transport.ClientOptions()...)
	big := make([][]byte, 17)
	for i := range big {
		big[i] = make([]byte, wire.MaxMessageBytes/16)
	}
	_, err := client.Append(ctx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: "r", Records: big}))
	if code := connect.CodeOf(err); code != connect.CodeResourceExhausted {
		t.Errorf("Append() of %d bytes: code = %v (%v), want %v", wire.MaxMessageBytes+wire.MaxMessageBytes/16, code, err, connect.CodeResourceExhausted)
	}
	// Still serving after refusing it.
	if _, err := client.Read(ctx, connect.NewRequest(&tenurev1.ReadRequest{RangeId: "r"})); err != nil {
		t.Errorf("Read() after an oversized request: %v", err)
	}
}

// Stopping a server twice (a test cleanup after a test already killed it)
// must not hang.
func TestCloseTwice(t *testing.T) {
	srv := start(t)
	done := make(chan struct{})
	go func() {
		srv.Close()
		srv.Close()
		srv.Shutdown(context.Background())
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("second Close did not return")
	}
}

// TestResponsesAreNotCompressed checks that handlers built with
// HandlerOptions answer uncompressed, unary and streamed, although the client
// accepts gzip: Connect would otherwise deflate every answer, whatever its
// size (see HandlerOptions).
func TestResponsesAreNotCompressed(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle(tenurev1connect.NewLogServiceHandler(logServer{}, transport.HandlerOptions()...))
	mux.Handle("/bench.Echo/Stream", connect.NewBidiStreamHandler("/bench.Echo/Stream", echoStream, transport.HandlerOptions()...))
	srv, err := transport.Serve("127.0.0.1:0", transport.Registration{Name: tenurev1connect.LogServiceName, Path: "/", Handler: mux})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hc := transport.NewHTTPClient()
	defer hc.CloseIdleConnections()
	post := func(path, contentType string, header http.Header, body []byte) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL()+path, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header = header
		req.Header.Set("Content-Type", contentType)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("POST %s: read body: %v", path, err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST %s: status %d, body %q", path, resp.StatusCode, b)
		}
		return resp, b
	}

	// Unary: Accept-Encoding set by hand, so net/http does not decompress
	// (and hide) a gzipped answer.
	msg, err := proto.Marshal(&tenurev1.AppendRequest{RangeId: "r", Records: [][]byte{bytes.Repeat([]byte("a"), 4096)}})
	if err != nil {
		t.Fatal(err)
	}
	resp, _ := post(tenurev1connect.LogServiceAppendProcedure, "application/proto", http.Header{"Accept-Encoding": {"gzip"}}, msg)
	if got := resp.Header.Get("Content-Encoding"); got != "" {
		t.Errorf("unary Append answered with Content-Encoding %q, want none", got)
	}

	// Streamed: one enveloped request, then the client's side ends.
	msg, err = proto.Marshal(&tenurev1.FetchRequest{FetchOffset: 7})
	if err != nil {
		t.Fatal(err)
	}
	env := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg)))
	// The stream's Connect-Content-Encoding header names gzip either way:
	// it says what a compressed message would use, and each message's flags
	// say whether it is.
	_, body := post("/bench.Echo/Stream", "application/connect+proto", http.Header{"Connect-Accept-Encoding": {"gzip"}}, append(env, msg...))
	if len(body) < 5 || body[0]&1 != 0 {
		t.Errorf("stream's first message = %q, want an uncompressed envelope (flags bit 0 clear)", body)
	}
}
