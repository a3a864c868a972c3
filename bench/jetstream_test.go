package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// benchDuration is how long each shape runs. The benchmarks in this package
// do not scale with b.N: each invocation runs its shape once for this long
// (setup excluded) and reports the run's own metrics; ns/op is suppressed.
// The testing framework only calls a benchmark again with a larger b.N when
// the first call took less than -benchtime (default 1s), so keep
// -bench.duration >= -benchtime (or pass -benchtime=1x). Use -count for
// repetitions.
var benchDuration = flag.Duration("bench.duration", 5*time.Second, "measured duration of each benchmark shape")

func init() {
	flag.StringVar(&WindowCPUProfile, "bench.cpuprofile", "", "write a CPU profile of each run's measured window (setup left out) to this file; each run overwrites it")
	flag.StringVar(&WindowTrace, "bench.trace", "", "write an execution trace of each run's measured window (setup left out) to this file; each run overwrites it; go tool trace -pprof=sched FILE shows what goroutines waited for")
}

// BenchmarkJetStream measures acknowledged publishes to an R3 file-storage
// stream on an in-process 3-node JetStream cluster whose servers fsync every
// write before acknowledging (jetstream { sync_interval: always }).
func BenchmarkJetStream(b *testing.B) {
	runJetStreamShapes(b, startJetStreamCluster(b, 3))
}

// runJetStreamShapes runs every shape against c, each on a fresh R3 stream.
func runJetStreamShapes(b *testing.B, c *jsCluster) {
	for i, shape := range Shapes {
		b.Run(shape.Name, func(b *testing.B) {
			stream := fmt.Sprintf("BENCH%d", i)
			subject := "bench." + stream
			c.createStream(b, stream, subject, 3)
			defer c.deleteStream(b, stream)
			newAppender := func(int) (Appender, error) { return c.newAppender(shape, subject) }
			runShape(b, newAppender, shape)
		})
	}
}

// runShape runs shape once for -bench.duration and reports the result. It is
// the common body of every system's sub-benchmarks. It also reports
// syncs/record (runShapeCounting), which counts the servers' syncs whether
// they run in this process or in processes of their own (startServer).
func runShape(b *testing.B, newAppender func(client int) (Appender, error), shape Shape) {
	b.Helper()
	runShapeCounting(b, newAppender, shape, syncsCounter)
}

type jsCluster struct {
	servers []*server.Server
	urls    []string
}

// startJetStreamCluster starts n clustered JetStream servers on 127.0.0.1 with
// file storage under tb.TempDir() and every write fsynced before it is
// acknowledged, and shuts them down when tb ends.
func startJetStreamCluster(tb testing.TB, n int) *jsCluster {
	tb.Helper()
	ports := freePorts(tb, n)
	routes := make([]*url.URL, n)
	for i, p := range ports {
		routes[i] = &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", p)}
	}
	// The store directories are made before the shutdown is registered:
	// cleanups run last-registered first, and TempDir's removal running
	// while the servers still write (a deleted stream's files go
	// asynchronously) failed the whole benchmark with "directory not empty".
	dirs := make([]string, n)
	for i := range dirs {
		dirs[i] = tb.TempDir()
	}
	c := &jsCluster{}
	tb.Cleanup(func() {
		for _, s := range c.servers {
			s.Shutdown()
		}
		for _, s := range c.servers {
			s.WaitForShutdown()
		}
	})
	for i := range n {
		opts := &server.Options{
			ServerName: fmt.Sprintf("js%d", i),
			Host:       "127.0.0.1",
			Port:       -1, // random
			HTTPPort:   0,  // no monitoring
			NoLog:      true,
			NoSigs:     true,
			JetStream:  true,
			StoreDir:   dirs[i],
			// Same as `jetstream { sync_interval: always }` (see opts.go,
			// parseJetStream): fsync every write before it is acknowledged.
			// With R>1 the server fsyncs the stream's Raft WAL on every
			// append and flushes the message store on WAL compaction.
			SyncAlways:   true,
			SyncInterval: 2 * time.Minute, // server's defaultSyncInterval, as the config parser sets it
			Cluster: server.ClusterOpts{
				Name: "bench",
				Host: "127.0.0.1",
				Port: ports[i],
			},
			Routes: routes,
		}
		s, err := server.NewServer(opts)
		if err != nil {
			tb.Fatalf("nats server %d: %v", i, err)
		}
		// No logger is configured (NoLog, no ConfigureLogger): the servers are silent.
		go s.Start()
		c.servers = append(c.servers, s)
	}
	for i, s := range c.servers {
		if !s.ReadyForConnections(10 * time.Second) {
			tb.Fatalf("nats server %d not ready", i)
		}
		c.urls = append(c.urls, s.ClientURL())
	}
	// Wait for the full route mesh and a JetStream meta leader.
	waitFor(tb, 30*time.Second, "JetStream cluster formed", func() error {
		leaders := 0
		for i, s := range c.servers {
			if got := s.NumRoutes(); got < n-1 {
				return fmt.Errorf("server %d has %d routes, want >= %d", i, got, n-1)
			}
			if !s.JetStreamIsCurrent() {
				return fmt.Errorf("server %d: JetStream meta not current", i)
			}
			if s.JetStreamIsLeader() {
				leaders++
			}
		}
		if leaders != 1 {
			return fmt.Errorf("%d meta leaders", leaders)
		}
		return nil
	})
	return c
}

func (c *jsCluster) connect() (*nats.Conn, error) {
	return nats.Connect(c.urls[0]+","+c.urls[1]+","+c.urls[2], nats.Name("tenure-bench"), nats.RetryOnFailedConnect(false))
}

// jsAttemptTimeout bounds one request of the harness's setup to the
// cluster (create a stream, read its info, the warm-up publish), so that
// the waitFor loops around them retry a request that was lost.
const jsAttemptTimeout = 3 * time.Second

func (c *jsCluster) createStream(tb testing.TB, name, subject string, replicas int) {
	tb.Helper()
	nc, err := c.connect()
	if err != nil {
		tb.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	if err := createStream(tb.Context(), js, name, subject, replicas); err != nil {
		tb.Fatal(err)
	}
}

// createStream creates an R(replicas) file-storage stream and returns
// once it has a leader, every replica is current and one publish to it
// was acknowledged; each wait is bounded (30s).
func createStream(ctx context.Context, js jetstream.JetStream, name, subject string, replicas int) error {
	// The meta leader may still be settling: retry creation within the
	// bound. Each attempt has a bound of its own: a request the cluster
	// drops (seen once in ~10 runs, with one context for all attempts)
	// otherwise waits out the whole 30s instead of being sent again.
	err := poll(30*time.Second, "stream "+name+" created", func() error {
		ctx, cancel := context.WithTimeout(ctx, jsAttemptTimeout)
		defer cancel()
		_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
			Name:      name,
			Subjects:  []string{subject},
			Storage:   jetstream.FileStorage,
			Replicas:  replicas,
			Retention: jetstream.LimitsPolicy,
			Discard:   jetstream.DiscardOld,
		})
		return err
	})
	if err != nil {
		return err
	}
	// Wait until the stream has a leader and every replica is current, then
	// prove the write path works with one acknowledged publish.
	return poll(30*time.Second, "stream "+name+" leader and replicas current", func() error {
		ctx, cancel := context.WithTimeout(ctx, jsAttemptTimeout)
		defer cancel()
		s, err := js.Stream(ctx, name)
		if err != nil {
			return err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		if info.Cluster == nil || info.Cluster.Leader == "" {
			return errors.New("no stream leader")
		}
		if len(info.Cluster.Replicas) != replicas-1 {
			return fmt.Errorf("%d followers, want %d", len(info.Cluster.Replicas), replicas-1)
		}
		for _, p := range info.Cluster.Replicas {
			if !p.Current {
				return fmt.Errorf("replica %s not current", p.Name)
			}
		}
		_, err = js.Publish(ctx, subject, []byte("warmup"))
		return err
	})
}

func (c *jsCluster) deleteStream(tb testing.TB, name string) {
	nc, err := c.connect()
	if err != nil {
		tb.Error(err)
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Error(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := js.DeleteStream(ctx, name); err != nil {
		tb.Errorf("delete stream %s: %v", name, err)
	}
}

// newAppender connects one client (its own connection). Shapes with batch 1
// publish synchronously (js.Publish: one request, one ack); larger batches
// publish the batch asynchronously and wait for every ack.
func (c *jsCluster) newAppender(shape Shape, subject string) (Appender, error) {
	nc, err := c.connect()
	if err != nil {
		return nil, err
	}
	// Allow exactly the shape's records outstanding per client; the harness
	// never exceeds it, so publishers do not stall on the client's limit.
	// A publish waits for its ack as long as the harness waits for a call
	// in flight (DrainTimeout), not the client's default 5 s (the run's
	// context has no deadline, so the client would add one): at 1,000
	// streams JetStream's p99 is 2-4 s, and one run in ten on a loaded box
	// failed, its tail past 5 s. A slow ack is a latency to report, not a
	// failed append.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(shape.InFlight), jetstream.WithDefaultTimeout(DrainTimeout))
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &jsAppender{nc: nc, js: js, subject: subject}, nil
}

// jsLeaderChangeRetries is how many times a publish is sent again when no
// server answers its subject (no responders), jsLeaderChangeWait apart: the
// stream's leadership is moving. The client's default, 2 times 250 ms,
// failed a CI run under -race (2026-12-07: "nats: no response from
// stream"); like a slow ack, a leader change is latency to report, not a
// failed append. 10 s in all, and the run's drain timeout still bounds it.
const (
	jsLeaderChangeRetries = 40
	jsLeaderChangeWait    = 250 * time.Millisecond
)

// jsPublishOpts are the options of every measured publish; the
// asynchronous ones also wait for room in the client's pending set.
var (
	jsPublishOpts = []jetstream.PublishOpt{
		jetstream.WithRetryAttempts(jsLeaderChangeRetries),
		jetstream.WithRetryWait(jsLeaderChangeWait),
	}
	// The stall wait only matters if acks are slow to be cleared from
	// the client's pending set; be generous rather than fail the run.
	jsAsyncPublishOpts = append(slices.Clip(jsPublishOpts), jetstream.WithStallWait(5*time.Second))
)

type jsAppender struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	subject string
}

func (a *jsAppender) Append(ctx context.Context, records [][]byte) error {
	if len(records) == 1 {
		_, err := a.js.Publish(ctx, a.subject, records[0], jsPublishOpts...)
		return err
	}
	futures := make([]jetstream.PubAckFuture, 0, len(records))
	for _, r := range records {
		f, err := a.js.PublishAsync(a.subject, r, jsAsyncPublishOpts...)
		if err != nil {
			return err
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (a *jsAppender) Close() error {
	a.nc.Close()
	return nil
}

// freePorts returns n distinct TCP ports on 127.0.0.1 that were free a moment ago.
func freePorts(tb testing.TB, n int) []int {
	tb.Helper()
	ls := make([]net.Listener, n)
	ports := make([]int, n)
	for i := range ls {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		ls[i] = l
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}

// waitFor polls check every 50ms until it returns nil, failing tb if it has
// not within timeout.
func waitFor(tb testing.TB, timeout time.Duration, what string, check func() error) {
	tb.Helper()
	if err := poll(timeout, what, check); err != nil {
		tb.Fatal(err)
	}
}

// poll calls check every 50ms until it returns nil, or returns an error
// once timeout has passed, for goroutines that may not fail a test.
func poll(timeout time.Duration, what string, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s: %w", timeout, what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
