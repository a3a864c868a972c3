package transport_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"

	"github.com/tenurelog/tenure/pkg/auth"
	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// useTLS installs name's certificate from dir for the rest of the test.
func useTLS(t *testing.T, dir, name string) {
	t.Helper()
	src, err := auth.Load(auth.Files{
		Cert: filepath.Join(dir, name+".pem"), Key: filepath.Join(dir, name+"-key.pem"), CA: filepath.Join(dir, auth.CAFile),
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	transport.SetTLS(src)
	t.Cleanup(func() { transport.SetTLS(nil) })
}

// Under SetTLS a server speaks TLS and enforces the table, and a client
// made afterwards presents the process's certificate; health needs none.
func TestSetTLSServesAndDialsMutualTLS(t *testing.T) {
	dir := t.TempDir()
	if _, err := auth.Init(dir, auth.DefaultSpecs(nil, []string{"p1"}, nil, nil)); err != nil {
		t.Fatal(err)
	}
	useTLS(t, dir, "promoter-p1")
	path, h := tenurev1connect.NewPromoterServiceHandler(tenurev1connect.UnimplementedPromoterServiceHandler{}, transport.HandlerOptions()...)
	srv, err := transport.Serve("127.0.0.1:0", transport.Registration{Name: tenurev1connect.PromoterServiceName, Path: path, Handler: h})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	if !strings.HasPrefix(srv.URL(), "https://") {
		t.Fatalf("URL() = %s under SetTLS, want https", srv.URL())
	}
	ctx := context.Background()
	call := func() error {
		c := tenurev1connect.NewPromoterServiceClient(transport.NewHTTPClient(), srv.URL(), transport.ClientOptions()...)
		_, err := c.GetStatus(ctx, connect.NewRequest(&tenurev1.PromoterServiceGetStatusRequest{}))
		return err
	}
	// The promoter role may read a promoter's status: admitted.
	if err := call(); connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Fatalf("GetStatus as promoter = %v, want the handler's unimplemented", err)
	}
	useTLS(t, dir, "producer")
	if err := call(); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("GetStatus as producer = %v, want permission denied", err)
	}
	// Health with the producer's client: answered.
	hc := grpchealth.NewClient(transport.NewHTTPClient(), srv.URL(), connect.WithGRPC())
	if _, err := hc.Check(ctx, &grpchealth.CheckRequest{}); err != nil {
		t.Fatalf("health check over TLS = %v", err)
	}
}

func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:7101": true, "localhost:1": true, "[::1]:7": true,
		"0.0.0.0:7101": false, ":7101": false, "10.0.0.1:80": false, "replica-1:7101": false,
	} {
		if got := transport.Loopback(addr); got != want {
			t.Errorf("Loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}
