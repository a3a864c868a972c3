package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tenurelog/tenure/internal/testnet"
	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/services/promoter"
)

// testPromoterWithoutEtcd: status asked of a promoter whose election cannot
// run (its etcd unreachable) says so and names etcd, in the table and in
// --json. It read "a standby (elected: -)", as if another promoter were
// doing the work, while no range could fail over.
func testPromoterWithoutEtcd(t *testing.T, c *testCluster) {
	c.createRange("orphaned", "r1")
	etcdAddr := testnet.ClosedAddr(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdAddr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	p, err := promoter.New(promoter.Config{ID: "p-no-etcd", Etcd: cli, LeaseURL: c.lease.Server.URL(), Logger: c.log})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := transport.Serve("127.0.0.1:0", p.Handlers()...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; srv.Close() })

	want := "promoter p-no-etcd is not elected (elected: -): its election on etcd [" + etcdAddr
	var out string
	waitFor(t, "status to say the promoter's election fails", 20*time.Second, func() bool {
		_, out, _ = c.ctl("", "status", "orphaned", "--promoter", srv.URL())
		return strings.Contains(out, want)
	})
	if !strings.Contains(out, "failovers need an elected promoter") {
		t.Errorf("status through a promoter without etcd:\n%s\nwant it to say failovers need an elected promoter", out)
	}
	_, out, _ = c.ctl("", "status", "orphaned", "--promoter", srv.URL(), "--json")
	var st []statusJSON
	if err := json.Unmarshal([]byte(out), &st); err != nil || len(st) != 1 || st[0].Promotion == nil {
		t.Fatalf("status --json = %s (%v)", out, err)
	}
	if pr := st[0].Promotion; pr.State != "unknown" || !strings.Contains(pr.PromoterError, want) {
		t.Errorf("status --json promotion = %+v, want state unknown and promoter_error %q", pr, want)
	}
}
