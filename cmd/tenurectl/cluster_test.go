package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tenurelog/tenure/internal/testgate"
	"github.com/tenurelog/tenure/internal/testnet"
	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/services/lease"
	"github.com/tenurelog/tenure/services/lease/leasetest"
	"github.com/tenurelog/tenure/services/promoter"
	"github.com/tenurelog/tenure/services/replica"
)

// This file runs tenurectl's commands against a real cluster in the test
// process: embedded etcd and the lease service (leasetest), three replicas
// on real HTTP/2 loopback with Badger in temp dirs, and a promoter. The
// tests assert what a user sees: the printed tables, reports and errors.

type testReplica struct {
	id, dir, listen string
	gate            *testgate.Gate
	keeper          *lease.Keeper
	r               *replica.Replica
	srv             *transport.Server
}

type testCluster struct {
	t        *testing.T
	lease    *leasetest.Env
	replicas []*testReplica
	byID     map[string]*testReplica
	log      *slog.Logger

	promoterURL  string
	stopPromoter func()
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(&bytes.Buffer{}, &slog.HandlerOptions{Level: slog.LevelError + 1}))
}

func newTestCluster(t *testing.T) *testCluster {
	t.Helper()
	if testing.Short() {
		t.Skip("runs a whole cluster")
	}
	c := &testCluster{t: t, lease: leasetest.Start(t), byID: map[string]*testReplica{}, log: quietLogger()}
	for i := 1; i <= 3; i++ {
		tr := &testReplica{id: fmt.Sprintf("r%d", i), dir: t.TempDir(), listen: testnet.FreeAddr(t), gate: testgate.New()}
		c.replicas = append(c.replicas, tr)
		c.byID[tr.id] = tr
		c.start(tr)
	}
	t.Cleanup(func() {
		if c.stopPromoter != nil {
			c.stopPromoter()
		}
		for _, tr := range c.replicas {
			c.stop(tr)
		}
	})
	c.startPromoter("p1")
	return c
}

// start (re)starts a replica on its data dir, on the same address after
// the first start, so the range's membership stays true. That address is
// below the ephemeral range (testnet.FreeAddr), so no other test takes it
// while the replica is down; the retries wait out only a lingering close.
func (c *testCluster) start(tr *testReplica) {
	c.t.Helper()
	// 5 s, not 2: under -race on a loaded two-core host a keeper's renewal
	// ran late past 2 s and the leader lost its lease mid-test (a read or
	// append refused "no valid lease", and a re-promotion moved offsets the
	// test expects). A crash test waits the longer TTL out instead.
	k, err := lease.NewKeeper(c.lease.Client, tr.id, "", lease.WithSessionTTL(5*time.Second), lease.WithKeeperLogger(c.log))
	if err != nil {
		c.t.Fatalf("keeper for %s: %v", tr.id, err)
	}
	for attempt := 0; attempt < 50; attempt++ {
		tr.r, tr.srv, err = replica.Start(replica.Config{ID: tr.id, DataDir: tr.dir, Logger: c.log, Lease: k, HTTPClient: tr.gate, FetchWait: 200 * time.Millisecond,
			// Retention passes often, so testRetention sees its effect in
			// a second; every other range has the 7-day default, which
			// removes nothing of a test's records.
			RetentionInterval: retentionTestInterval, Policies: k}, tr.listen)
		if err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		c.t.Fatalf("start %s: %v", tr.id, err)
	}
	tr.keeper, tr.listen = k, tr.srv.Addr
}

// stop kills a replica as a crash would: connections dropped at once, the
// lease session left to expire.
func (c *testCluster) stop(tr *testReplica) {
	if tr.srv == nil {
		return
	}
	tr.srv.Close()
	tr.r.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = tr.keeper.Close(ctx)
	tr.srv, tr.r = nil, nil
}

func (c *testCluster) startPromoter(id string) {
	c.t.Helper()
	// Patient probes: on a saturated test machine (the race detector, the
	// whole suite in parallel) a leader can miss a few 300ms probes before
	// its lease is bound to it, and the promoter would promote again,
	// moving epochs and offsets under the assertions. Killed replicas are
	// still found at once: their connections are refused.
	p, err := promoter.New(promoter.Config{ID: id, Etcd: c.lease.EtcdClient, LeaseURL: c.lease.Server.URL(), Logger: c.log,
		RefreshInterval: 300 * time.Millisecond, ProbeTimeout: 2 * time.Second, ProbeMisses: 10,
		// Wait for every fence answer, not only a quorum's, so reports
		// list each replica as fenced even when one answers slowly.
		FenceGrace: time.Second})
	if err != nil {
		c.t.Fatal(err)
	}
	srv, err := transport.Serve("127.0.0.1:0", p.Handlers()...)
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	c.promoterURL = srv.URL()
	c.stopPromoter = func() { cancel(); <-done; srv.Close() }
	waitFor(c.t, "the promoter to be elected", 20*time.Second, p.Elected)
}

func (c *testCluster) members() string {
	var parts []string
	for _, tr := range c.replicas {
		parts = append(parts, tr.id+"=http://"+tr.listen)
	}
	return strings.Join(parts, ",")
}

// ctl runs tenurectl in-process against the cluster, stdin as given.
func (c *testCluster) ctl(stdin string, args ...string) (code int, stdout, stderr string) {
	return c.ctlContext(context.Background(), stdin, args...)
}

func (c *testCluster) ctlContext(ctx context.Context, stdin string, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	e := &env{stdout: &out, stderr: &errOut, stdin: strings.NewReader(stdin), getenv: func(string) string { return "" }}
	code = run(ctx, e, append([]string{"--lease", c.lease.Server.URL(), "--promoter", c.promoterURL}, args...))
	return code, out.String(), errOut.String()
}

// mustCtl runs tenurectl and fails the test unless it succeeds.
func (c *testCluster) mustCtl(stdin string, args ...string) string {
	c.t.Helper()
	code, stdout, stderr := c.ctl(stdin, args...)
	if code != exitOK {
		c.t.Fatalf("tenurectl %s: status %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, stdout, stderr)
	}
	return stdout
}

// createRange creates a range on all three replicas and waits for its
// first leader, which it returns. That is usually the preferred replica,
// but not always: a promotion counts the first quorum of fence answers, and
// on a loaded machine the preferred one's may come too late to be among them.
func (c *testCluster) createRange(id, preferred string) string {
	c.t.Helper()
	out := c.mustCtl("", "range", "create", id, "--replicas", c.members(), "--preferred", preferred)
	if !strings.Contains(out, "created range "+id) {
		c.t.Fatalf("range create output:\n%s", out)
	}
	return c.waitLeader(id, 1)
}

// waitLeader waits until tenurectl status --json names a leader of the
// range at epoch, and returns it.
func (c *testCluster) waitLeader(rangeID string, epoch uint64) string {
	c.t.Helper()
	var leader string
	waitFor(c.t, fmt.Sprintf("a leader of %s at epoch %d", rangeID, epoch), 20*time.Second, func() bool {
		code, out, _ := c.ctl("", "status", rangeID, "--json")
		var st []statusJSON
		if code != exitOK || json.Unmarshal([]byte(out), &st) != nil || len(st) != 1 || st[0].Leader == "" {
			return false
		}
		for _, r := range st[0].Replicas {
			if r.ID == st[0].Leader && r.Epoch == epoch {
				leader = r.ID
				return true
			}
		}
		return false
	})
	return leader
}

// others are the replica ids other than id, in order.
func (c *testCluster) others(id string) []string {
	var out []string
	for _, tr := range c.replicas {
		if tr.id != id {
			out = append(out, tr.id)
		}
	}
	return out
}

func waitFor(t testing.TB, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("timed out after %v waiting for %s", within, what)
}

// wantLines fails unless every line of want appears in got, in order, each
// as a substring of a later line than the previous one's.
func wantLines(t testing.TB, what, got string, want ...string) {
	t.Helper()
	lines := strings.Split(got, "\n")
	i := 0
	for _, w := range want {
		for i < len(lines) && !strings.Contains(normalize(lines[i]), normalize(w)) {
			i++
		}
		if i == len(lines) {
			t.Fatalf("%s: no line containing %q (in order)\ngot:\n%s", what, w, got)
		}
		i++
	}
}

// normalize collapses runs of spaces, so table assertions do not depend on
// column widths.
func normalize(s string) string { return strings.Join(strings.Fields(s), " ") }
