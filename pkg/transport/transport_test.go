package transport_test

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpcreflect"

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
