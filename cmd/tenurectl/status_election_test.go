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

// testPromoterList: --promoter takes several promoters, as --lease takes
// several lease services, and a command goes on to the next when one does
// not answer. With only one URL, a stopped promoter left status with "no
// promotion state" and promote failing although another promoter was
// elected (seen on the compose stack with promoter-1 stopped).
func testPromoterList(t *testing.T, c *testCluster) {
	leader := c.createRange("two-promoters", "r1")
	dead := "http://" + testnet.ClosedAddr(t)
	list := dead + "," + c.promoterURL
	_, out, errOut := c.ctl("", "status", "two-promoters", "--promoter", list, "--json")
	var st []statusJSON
	if err := json.Unmarshal([]byte(out), &st); err != nil || len(st) != 1 || st[0].Promotion == nil || st[0].Promotion.State != "healthy" {
		t.Fatalf("status --promoter %s --json = %s (stderr %s), want the elected promoter's healthy state", list, out, errOut)
	}
	// A promotion too: the dead promoter never saw it, so the next one is
	// asked.
	to := c.others(leader)[0]
	if code, out, errOut := c.ctl("", "--promoter", list, "promote", "two-promoters", "--to", to); code != exitOK || !strings.Contains(out, to) {
		t.Fatalf("promote --to %s through %s: status %d\n%s\n%s", to, list, code, out, errOut)
	}
	if got := c.waitLeader("two-promoters", 2); got != to {
		t.Errorf("leader after the handover = %s, want %s", got, to)
	}
	// Every URL unreachable: the error names them all.
	dead2 := "http://" + testnet.ClosedAddr(t)
	code, _, errOut := c.ctl("", "transitions", "two-promoters", "--promoter", dead+","+dead2)
	if code != exitFail || !strings.Contains(errOut, dead+","+dead2) {
		t.Errorf("transitions with every promoter down: status %d, stderr %q, want 1 naming both URLs", code, errOut)
	}
}
