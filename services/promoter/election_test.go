package promoter

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tenurelog/tenure/internal/testlog"
	"github.com/tenurelog/tenure/internal/testnet"
	"github.com/tenurelog/tenure/pkg/embedetcd"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/lease/leasetest"
)

// Two promoters run behind the etcd election: only the elected one acts, the
// other refuses Promote naming the elected one, and takes over when the
// elected one stops.
func TestOnlyTheElectedPromoterActs(t *testing.T) {
	c := newCluster(t, 3)
	c.createRange("r", "r1")
	a := c.newPromoter("pa", true)
	waitFor(t, "pa to be elected", 10*time.Second, a.Elected)
	// Start pb only now, so the election order is known.
	ctx, cancel := context.WithCancel(context.Background())
	b := c.newPromoter("pb", false)
	bDone := make(chan struct{})
	go func() { b.Run(ctx); close(bDone) }()
	t.Cleanup(func() { cancel(); <-bDone })
	_, e1 := c.leader("r", 1, 20*time.Second)

	waitFor(t, "pb to see pa as the elected promoter", 10*time.Second, func() bool {
		resp, _ := handler{b}.GetStatus(context.Background(), connect.NewRequest(&tenurev1.PromoterServiceGetStatusRequest{}))
		return resp.Msg.GetLeaderPromoterId() == "pa"
	})
	if b.Elected() {
		t.Fatal("both promoters are elected")
	}
	_, err := handler{b}.Promote(context.Background(), connect.NewRequest(&tenurev1.PromoteRequest{RangeId: "r"}))
	if code := connect.CodeOf(err); code != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "pa") {
		t.Fatalf("Promote on the unelected promoter: %v, want FailedPrecondition naming pa", err)
	}

	// Stop pa's campaign (its election session is closed): pb takes over and
	// acts on the next failure.
	stopA := a.stopForTest()
	stopA()
	waitFor(t, "pb to be elected", 20*time.Second, b.Elected)
	leader, _ := c.leader("r", e1, 10*time.Second)
	c.stop(c.byID[leader])
	if next, e2 := c.leader("r", e1+1, 20*time.Second); next == leader || e2 <= e1 {
		t.Fatalf("after the kill: leader %s at %d, want another replica above epoch %d", next, e2, e1)
	}
	// The record is written just after adoption.
	waitFor(t, "pb's transition record", 10*time.Second, func() bool {
		trs, err := b.transitions(context.Background(), "r", 1)
		return err == nil && len(trs) == 1 && trs[0].GetPromoterId() == "pb" && trs[0].GetEpoch() > e1
	})
}

// A promoter whose etcd cannot be reached serves (its readiness is not
// etcd's), but is not elected and says so: a warning naming etcd's address
// and the error at once, then at most one every recurringWarnEvery, and
// Promote's refusal names the failing election. It used to wait in the
// election's lease grant for ever, logging nothing.
func TestUnreachableEtcdIsLogged(t *testing.T) {
	etcdAddr, leaseAddr := testnet.ClosedAddr(t), testnet.ClosedAddr(t)
	// As cmd/tenure makes it: the client does not dial until used.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdAddr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() }) // after the promoter stops (cleanups run last first)
	var logs testlog.Buffer
	p := runWarnLogged(t, &logs, Config{ID: "p1", Etcd: cli, LeaseURL: "http://" + leaseAddr})

	warned := func() int { return warnings(&logs, etcdAddr) }
	waitFor(t, "a warning naming etcd's address and the error", 15*time.Second, func() bool { return warned() > 0 })
	if p.Elected() {
		t.Fatal("elected without etcd")
	}
	_, err = handler{p}.Promote(context.Background(), connect.NewRequest(&tenurev1.PromoteRequest{RangeId: "r"}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "not elected") || !strings.Contains(err.Error(), etcdAddr) {
		t.Errorf("Promote while etcd is unreachable: %v, want FailedPrecondition: not elected, naming etcd at %s", err, etcdAddr)
	}
	// Its status says why too (tenurectl status prints it): without the
	// field a promoter that can never be elected read as a healthy standby.
	st, err := handler{p}.GetStatus(context.Background(), connect.NewRequest(&tenurev1.PromoterServiceGetStatusRequest{}))
	if err != nil || st.Msg.GetElected() || !strings.Contains(st.Msg.GetElectionError(), "election on etcd") || !strings.Contains(st.Msg.GetElectionError(), etcdAddr) {
		t.Errorf("GetStatus while etcd is unreachable: %v, %v; want not elected, with an election_error naming etcd at %s", st.Msg, err, etcdAddr)
	}
	// Bounded: the rounds go on failing (one per grant bound, 3 s, and a
	// pause), and none of them warns again within recurringWarnEvery (10 s).
	const quiet = 7 * time.Second
	time.Sleep(quiet)
	if n := warned(); n != 1 {
		t.Errorf("%d warnings in the %v after the first, want 1 (at most one per 10s); logs:\n%s", n, quiet, logs.String())
	}
	if p.Elected() {
		t.Fatal("elected without etcd")
	}
}

// An elected promoter whose lease service cannot be reached says so at a
// bounded rate: its lease watch is retried every ~200 ms and logged five
// warnings a second; now the first at once, naming the lease service's
// address and the error, then at most one every 10 s.
func TestUnreachableLeaseServiceIsLoggedAtABoundedRate(t *testing.T) {
	e, err := embedetcd.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	leaseAddr := testnet.ClosedAddr(t)
	var logs testlog.Buffer
	runWarnLogged(t, &logs, Config{ID: "p1", Etcd: leasetest.EtcdClient(t, e), LeaseURL: "http://" + leaseAddr, RefreshInterval: 300 * time.Millisecond})

	warned := func(msg string) int { return warnings(&logs, msg, leaseAddr) }
	waitFor(t, "warnings naming the lease service's address and the error", 15*time.Second, func() bool {
		return warned("lease watch ended") > 0 && warned("range refresh failed") > 0
	})
	// A watch retry every ~200 ms and a refresh every 300 ms: 15 and 10
	// warnings in 3 s, unbounded.
	time.Sleep(3 * time.Second)
	for _, msg := range []string{"lease watch ended", "range refresh failed"} {
		if n := warned(msg); n != 1 {
			t.Errorf("%d %q warnings, want 1 (at most one per 10s); logs:\n%s", n, msg, logs.String())
		}
	}
}

// warnings counts the warnings logged with an error that contain every
// one of words.
func warnings(logs *testlog.Buffer, words ...string) int {
	n := 0
	for _, line := range strings.Split(logs.String(), "\n") {
		if !strings.Contains(line, "level=WARN") || !strings.Contains(line, "err=") {
			continue
		}
		all := true
		for _, w := range words {
			all = all && strings.Contains(line, w)
		}
		if all {
			n++
		}
	}
	return n
}

// runWarnLogged runs a promoter of cfg, its warnings and errors written to
// logs, until the test ends.
func runWarnLogged(t *testing.T, logs *testlog.Buffer, cfg Config) *Promoter {
	t.Helper()
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return p
}
