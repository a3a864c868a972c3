package bench

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/tenurelog/tenure/pkg/appender"
	"github.com/tenurelog/tenure/pkg/auth"
	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
	"github.com/tenurelog/tenure/services/replica"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// BenchmarkTenure measures acknowledged appends to a range replicated on an
// in-process 3-replica tenure cluster: every append is acknowledged only once
// the leader's high-water mark passes it, that is once a quorum (the leader
// and at least one follower) has fsynced it.
//
// Appends go through LogService.AppendStream (pkg/appender), one stream per
// append in flight, as a producer keeping its connection would send them.
func BenchmarkTenure(b *testing.B) { benchTenure(b, false) }

// BenchmarkTenureUnary is BenchmarkTenure with one unary LogService.Append
// per append, for comparing the two client paths in one run.
func BenchmarkTenureUnary(b *testing.B) { benchTenure(b, true) }

// BenchmarkTenurePlain is BenchmarkTenure without idempotent producers (no
// producer id or sequence on the appends, as an old client sends them):
// the cost of exactly-once appends, side by side with BenchmarkTenure in one
// run (docs/idempotence.md).
func BenchmarkTenurePlain(b *testing.B) {
	runTenureShapes(b, startTenureCluster(b, 3), false, appender.WithoutIdempotence())
}

// BenchmarkTenureTLS is BenchmarkTenure with every hop mutual TLS (a CA
// and certificate of its own, pkg/auth; the authorisation table checked on
// every request): the cost of TLS, side by side with BenchmarkTenure in one
// run.
func BenchmarkTenureTLS(b *testing.B) {
	dir := b.TempDir()
	if _, err := auth.Init(dir, []auth.Spec{{Name: "bench", Identity: auth.Identity{Roles: auth.Roles}}}); err != nil {
		b.Fatal(err)
	}
	src, err := auth.Load(auth.Files{Cert: filepath.Join(dir, "bench.pem"), Key: filepath.Join(dir, "bench-key.pem"), CA: filepath.Join(dir, auth.CAFile)}, nil)
	if err != nil {
		b.Fatal(err)
	}
	transport.SetTLS(src)
	b.Cleanup(func() { transport.SetTLS(nil) })
	benchTenure(b, false)
}

func benchTenure(b *testing.B, unary bool) {
	runTenureShapes(b, startTenureCluster(b, 3), unary)
}

// runTenureShapes runs every shape against c, each on a fresh range; opts
// configure the stream appenders.
func runTenureShapes(b *testing.B, c *tenureCluster, unary bool, opts ...appender.Option) {
	warmWAL(b, c)
	for i, shape := range Shapes {
		b.Run(shape.Name, func(b *testing.B) {
			rangeID := fmt.Sprintf("bench-%d", i)
			c.newRange(b, rangeID)
			newAppender := func(int) (Appender, error) { return c.newAppender(rangeID, unary, opts...), nil }
			runShape(b, newAppender, shape)
		})
	}
}

// warmWAL writes every replica's WAL through once before anything is
// measured, so that the benchmarks measure replicas as they run once
// their WAL has reached its size, not new ones. A new store's two WAL files grow
// during their first pass, each entry past a file's end zeroing 256 KiB
// ahead (services/replica/logstore/wal.go), so until
// logstore.WALFixedBytes() have gone through it a store writes its WAL
// twice; from then on it overwrites it in place. The floor zeroes its
// circle in setup likewise (floor_test.go). Measured against no warm-up
// (BenchmarkTenure, three rounds alternating, 2026-12-07): disk bytes per
// record 0.88x at 256 in flight and 0.85x at one in flight, whose runs
// wrote the first passes; records/s 1.14x at one in flight (p50 0.97 ->
// 0.87 ms), and within this box's noise at the other two (0.98x, 0.92x).
// Range wal-warm-up is led by c.nodes[0] and followed by the others, so
// its records go through every replica's WAL; it is idle afterwards.
func warmWAL(b *testing.B, c *tenureCluster) {
	b.Helper()
	// WAL bytes per record exceed RecordBytes (the record's header, its
	// key), so this many records pass both files' first passes.
	records := int(logstore.WALFixedBytes()/RecordBytes) + 1
	if raceEnabled {
		records = 1000 // a smoke run measures nothing: the path only
	}
	const rangeID = "wal-warm-up"
	c.newRange(b, rangeID)
	start := time.Now()
	r, err := RunRecords(b.Context(), func(int) (Appender, error) { return c.newAppender(rangeID, false), nil },
		Shape{Name: rangeID, Clients: 1, InFlight: 256, Batch: 32}, RecordBytes, records, 2*time.Minute)
	if err != nil {
		b.Fatalf("warm-up: %v", err)
	}
	if r.Records < records {
		b.Fatalf("warm-up: %d records acknowledged in %v, want %d", r.Records, r.Elapsed, records)
	}
	// What the warm-up left dirty is written back now, not during the
	// first measured run (diskCounter).
	unix.Sync()
	b.Logf("warm-up: %d records through every replica's WAL in %v", r.Records, time.Since(start).Round(time.Millisecond))
}

// tenureNode is one replica of the benchmark cluster and the driver's
// client to it. r and srv are set for a replica in this process (nil for
// one in its own process, procs_test.go).
type tenureNode struct {
	id, address string
	dir         string // data directory (in-process replicas only)
	r           *replica.Replica
	srv         *transport.Server
	hc          *http.Client
	rc          tenurev1connect.ReplicaServiceClient
}

type tenureCluster struct {
	nodes []*tenureNode
}

// startTenureCluster starts n replicas r1..rn on 127.0.0.1 with data under
// tb.TempDir() and stops them when tb ends.
func startTenureCluster(tb testing.TB, n int) *tenureCluster {
	tb.Helper()
	return startTenureClusterWith(tb, n, nil)
}

// startTenureClusterWith is startTenureCluster with configure, when not
// nil, changing each replica's Config before it starts.
func startTenureClusterWith(tb testing.TB, n int, configure func(*replica.Config)) *tenureCluster {
	tb.Helper()
	c := &tenureCluster{}
	// The data directories first: cleanups run in reverse order, and each
	// Badger must be closed before its directory is removed.
	dirs := make([]string, n)
	for i := range dirs {
		dirs[i] = tb.TempDir()
	}
	tb.Cleanup(func() {
		for _, nd := range c.nodes {
			_ = nd.srv.Close()
			nd.hc.CloseIdleConnections()
			if err := nd.r.Close(); err != nil {
				tb.Errorf("close replica: %v", err)
			}
		}
	})
	// Replica warnings and errors only, on stderr: an info line per fence
	// and adoption is noise here.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	for i := 1; i <= n; i++ {
		cfg := replica.Config{
			ID:      fmt.Sprintf("r%d", i),
			DataDir: dirs[i-1],
			Logger:  log,
		}
		if configure != nil {
			configure(&cfg)
		}
		r, srv, err := replica.Start(cfg, "127.0.0.1:0")
		if err != nil {
			tb.Fatalf("start replica r%d: %v", i, err)
		}
		hc := transport.NewHTTPClient()
		c.nodes = append(c.nodes, &tenureNode{
			id: r.ID(), address: r.Address(), dir: dirs[i-1], r: r, srv: srv, hc: hc,
			rc: tenurev1connect.NewReplicaServiceClient(hc, srv.URL(), transport.ClientOptions()...),
		})
	}
	return c
}

// newRange plays the promoter for a fresh range at epoch 1: fence every
// replica, adopt r1 as leader and the others as its followers, and wait for
// one acknowledged append, which needs a follower to have fetched.
func (c *tenureCluster) newRange(tb testing.TB, rangeID string) {
	tb.Helper()
	c.newRangeRetained(tb, rangeID, nil)
}

// newRangeRetained is newRange with the leader's Adopt carrying retention
// (nil: none, the range keeps everything).
func (c *tenureCluster) newRangeRetained(tb testing.TB, rangeID string, retention *tenurev1.RetentionPolicy) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), 30*time.Second)
	defer cancel()
	if err := c.adoptRangeRetained(ctx, rangeID, 0, retention); err != nil {
		tb.Fatal(err)
	}
	a := c.newAppender(rangeID, false)
	defer a.Close()
	if err := a.Append(ctx, [][]byte{[]byte("warmup")}); err != nil {
		tb.Fatalf("warm-up append: %v", err)
	}
}

// adoptRange plays the promoter for a fresh range at epoch 1: fence every
// replica, adopt c.nodes[leader] as leader and the others as its followers.
func (c *tenureCluster) adoptRange(ctx context.Context, rangeID string, leader int) error {
	return c.adoptRangeRetained(ctx, rangeID, leader, nil)
}

// adoptRangeRetained is adoptRange with every Adopt carrying retention
// (nil: none). Only the leader applies it (services/replica/retention.go).
func (c *tenureCluster) adoptRangeRetained(ctx context.Context, rangeID string, leader int, retention *tenurev1.RetentionPolicy) error {
	const epoch = 1
	set := make([]*tenurev1.Replica, len(c.nodes))
	for i, nd := range c.nodes {
		set[i] = &tenurev1.Replica{Id: nd.id, Address: nd.address}
	}
	var bound uint64
	for _, nd := range c.nodes {
		resp, err := nd.rc.Fence(ctx, connect.NewRequest(&tenurev1.FenceRequest{RangeId: rangeID, Epoch: epoch, FencerId: "bench"}))
		if err != nil {
			return fmt.Errorf("fence %s on %s: %w", rangeID, nd.id, err)
		}
		bound = max(bound, resp.Msg.GetHighWaterMark())
	}
	lead := c.nodes[leader]
	for i, nd := range c.nodes {
		role := tenurev1.Role_ROLE_FOLLOWER
		if i == leader {
			role = tenurev1.Role_ROLE_LEADER
		}
		_, err := nd.rc.Adopt(ctx, connect.NewRequest(&tenurev1.AdoptRequest{
			RangeId: rangeID, Epoch: epoch, Role: role,
			LeaderId: lead.id, LeaderAddress: lead.address,
			Replicas: set, CommittedBound: bound, Retention: retention,
		}))
		if err != nil {
			return fmt.Errorf("adopt %s on %s as %s: %w", rangeID, nd.id, role, err)
		}
	}
	return nil
}

// newAppender connects one client (its own HTTP/2 connection) to the
// leader, appending through AppendStream or, if unary, with Append calls.
func (c *tenureCluster) newAppender(rangeID string, unary bool, opts ...appender.Option) *tenureAppender {
	return c.newAppenderAt(0, rangeID, unary, opts...)
}

// newAppenderAt is newAppender connected to c.nodes[node], the leader of
// rangeID.
func (c *tenureCluster) newAppenderAt(node int, rangeID string, unary bool, opts ...appender.Option) *tenureAppender {
	hc := transport.NewHTTPClient()
	lc := tenurev1connect.NewLogServiceClient(hc, c.nodes[node].address, transport.ClientOptions()...)
	a := &tenureAppender{hc: hc, lc: lc, rangeID: rangeID}
	if !unary {
		a.stream = appender.New(lc, opts...)
	}
	return a
}

// tenureAppender appends each call's records as one append, which returns
// once they are committed. Safe for concurrent use.
type tenureAppender struct {
	hc      *http.Client
	lc      tenurev1connect.LogServiceClient
	stream  *appender.Appender // nil: unary Append calls
	rangeID string
}

func (a *tenureAppender) Append(ctx context.Context, records [][]byte) error {
	return a.appendTo(ctx, a.rangeID, records)
}

// appendTo appends records to rangeID, which the replica a is connected to
// must lead.
func (a *tenureAppender) appendTo(ctx context.Context, rangeID string, records [][]byte) error {
	if a.stream != nil {
		_, err := a.stream.Append(ctx, rangeID, records)
		return err
	}
	_, err := a.lc.Append(ctx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: rangeID, Records: records}))
	return err
}

func (a *tenureAppender) Close() error {
	if a.stream != nil {
		a.stream.Close()
	}
	a.hc.CloseIdleConnections()
	return nil
}
