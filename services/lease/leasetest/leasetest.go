// Package leasetest runs a real lease service for tests: an embedded etcd in
// t.TempDir(), the service over real HTTP/2 on 127.0.0.1, and a Connect
// client built with pkg/transport's options. The promoter's and replica's
// tests use it as their lease service.
package leasetest

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tenurelog/tenure/pkg/embedetcd"
	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
	"github.com/tenurelog/tenure/services/lease"
)

// Env is a running lease service and what it runs on. Everything is stopped
// by t.Cleanup.
type Env struct {
	Etcd       *embedetcd.Etcd
	EtcdClient *clientv3.Client
	Service    *lease.Service
	Server     *transport.Server
	// Client talks to Server (gRPC protocol over h2c, read limit set).
	Client tenurev1connect.LeaseServiceClient
}

// Start starts an embedded etcd in t.TempDir() and a lease service on it.
func Start(t testing.TB, opts ...lease.Option) *Env {
	t.Helper()
	e, err := embedetcd.Start(t.TempDir())
	if err != nil {
		t.Fatalf("leasetest: %v", err)
	}
	t.Cleanup(e.Close)
	return StartOn(t, e, opts...)
}

// StartOn starts another lease service on an existing etcd. Services with
// the same prefix (lease.WithPrefix) share ranges; distinct prefixes keep
// tests that share one etcd apart.
func StartOn(t testing.TB, e *embedetcd.Etcd, opts ...lease.Option) *Env {
	t.Helper()
	cli := EtcdClient(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	svc, err := lease.New(ctx, cli, opts...)
	if err != nil {
		t.Fatalf("leasetest: %v", err)
	}
	srv, err := transport.Serve("127.0.0.1:0", svc.Registration())
	if err != nil {
		t.Fatalf("leasetest: %v", err)
	}
	t.Cleanup(func() {
		svc.Close()
		srv.Close()
	})
	return &Env{
		Etcd:       e,
		EtcdClient: cli,
		Service:    svc,
		Server:     srv,
		Client:     Client(srv.URL()),
	}
}

// Client is a lease service client for baseURL, built the way every tenure
// client is.
func Client(baseURL string) tenurev1connect.LeaseServiceClient {
	return tenurev1connect.NewLeaseServiceClient(transport.NewHTTPClient(), baseURL, transport.ClientOptions()...)
}

// EtcdClient dials e quietly; closed by t.Cleanup.
func EtcdClient(t testing.TB, e *embedetcd.Etcd) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("leasetest: dial etcd: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}
