package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tenurelog/tenure/services/replica"
)

// Many ranges (issue 29). Every other benchmark drives one range, yet a
// replica exists to host many, each with its own follower loop. These run
// the same 1 KiB appends over many ranges, side by side:
//
//	BenchmarkTenureManyRanges     one tenure range per range, leaders spread evenly over the three replicas
//	BenchmarkJetStreamManyRanges  one R3 stream per range, the durability of BenchmarkJetStream
//	BenchmarkFloorManyRanges      BenchmarkFloor with the same number of one-in-flight producers
//
// each with the shapes of manyShapes. Ranges are made once per benchmark
// and reused by the shapes that follow (the 1,000-range shapes share the
// same thousand; the 100-range shape runs before the other 900 exist, so
// it measures 100 ranges, not 100 busy among 1,000): setup is logged and
// not measured.

// manyShape is a load shape over many ranges.
type manyShape struct {
	Shape      // Clients producers, each with one append of one record in flight
	Ranges int // ranges (tenure ranges, JetStream streams) appended to
	// Random: each client appends to a range picked at random per append;
	// otherwise client i appends to range i only (Clients == Ranges).
	Random bool
}

// manyShapes are the shapes, scaled down under -race: make bench-check
// runs every benchmark once for 300ms to see it works, and a thousand
// ranges on race-built servers only take long to set up. The names stay,
// so that a smoke run reads like a measured one; the counts are logged.
func manyShapes() []manyShape {
	ranges := func(n int) int {
		if raceEnabled {
			return min(n/10, 20) // 100 -> 10, 1000 -> 20
		}
		return n
	}
	clients64 := 64
	if raceEnabled {
		clients64 = 8
	}
	one := func(name string, n int) manyShape {
		return manyShape{Shape: Shape{Name: name, Clients: n, InFlight: 1, Batch: 1}, Ranges: n}
	}
	return []manyShape{
		one("100-ranges", ranges(100)),
		one("1000-ranges", ranges(1000)),
		{Shape: Shape{Name: "1000-ranges-64-clients", Clients: clients64, InFlight: 1, Batch: 1}, Ranges: ranges(1000), Random: true},
	}
}

// manySetupWorkers is how many ranges or streams are created at once.
const manySetupWorkers = 8

// inParallel calls fn(i) for every i in [from, to) on manySetupWorkers
// goroutines and returns the first error (the others stop at their next
// index).
func inParallel(from, to int, fn func(i int) error) error {
	var next atomic.Int64
	next.Store(int64(from))
	var failed atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, manySetupWorkers)
	for range manySetupWorkers {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < to && !failed.Load(); i = int(next.Add(1)) - 1 {
				if err := fn(i); err != nil {
					failed.Store(true)
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs // nil when no worker failed
}

// counter is a process-wide count that runShapeCounting reports per
// acknowledged record as metric unit: read before the run, and after it
// readAfter if set, else read.
type counter struct {
	unit      string
	read      func() (uint64, error)
	readAfter func() (uint64, error)
}

// syncsCounter counts the fsync and fdatasync calls of this process and of
// the server processes it starts (syncs_test.go): every system's flushes,
// its servers in this process or in processes of their own.
var syncsCounter = counter{unit: "syncs/record", read: processSyncs}

// runShapeCounting is runShape that also reports each counter's increase
// over the run per acknowledged record (and diskCounter's, always), and
// returns the result. The
// counters are read just before and after Run, which makes the appenders
// (connections: no syncs) before its clock starts and closes them after; a
// counter that cannot be read is logged as unavailable and not reported.
func runShapeCounting(b *testing.B, newAppender func(client int) (Appender, error), shape Shape, counters ...counter) Result {
	b.Helper()
	counters = append(counters, diskCounter, rwCallsCounter)
	before := make([]uint64, len(counters))
	errs := make([]error, len(counters))
	for i, c := range counters {
		before[i], errs[i] = c.read()
	}
	b.ResetTimer()
	r, err := Run(b.Context(), newAppender, shape, RecordBytes, *benchDuration)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("%s: %v", shape.Name, r)
	Report(b, r)
	for i, c := range counters {
		read := c.read
		if c.readAfter != nil {
			read = c.readAfter
		}
		after, err := read()
		if err = errors.Join(errs[i], err); err != nil {
			b.Logf("%s unavailable: %v", c.unit, err)
			continue
		}
		if r.Records > 0 {
			b.ReportMetric(float64(after-before[i])/float64(r.Records), c.unit)
		}
	}
	return r
}

// BenchmarkTenureManyRanges runs manyShapes on an in-process 3-replica
// cluster (as BenchmarkTenure), range i led by replica i mod 3, every
// client its own HTTP/2 connection to each leader it appends to. Besides
// syncs/record it reports, from the replicas' WAL sync histograms
// (tenure_replica_wal_fsync_duration_seconds): wal-syncs/record, the three
// replicas' WAL group commits (one or, at a WAL file switch, two
// fdatasyncs each), which the store shares across ranges; wal-sync-us,
// their mean duration; and wal-sync-busy, the fraction of the run a
// replica spent in them (the mean over the three). A replica syncs its WAL
// one sync at a time, so a busy fraction near 1 means appends wait for
// syncs, not for CPU.
func BenchmarkTenureManyRanges(b *testing.B) {
	var regs []*prometheus.Registry
	c := startTenureClusterWith(b, 3, func(cfg *replica.Config) {
		reg := prometheus.NewRegistry()
		regs = append(regs, reg)
		cfg.Metrics = reg
	})
	walSyncs := counter{unit: "wal-syncs/record", read: func() (uint64, error) {
		n, _, err := walSyncStats(regs)
		return n, err
	}}
	// Messages between replicas (fetch sessions' and the per-range fetch
	// streams'), each counted once, by its follower.
	fetchMsgs := counter{unit: "fetch-msgs/record", read: func() (uint64, error) {
		return counterSum(regs, "tenure_replica_fetch_messages_sent_total", "tenure_replica_fetch_messages_received_total")
	}}
	runTenureManyShapes(b, c, func(b *testing.B, newAppender func(client int) (Appender, error), shape Shape) {
		n0, sum0, err0 := walSyncStats(regs)
		r := runShapeCounting(b, newAppender, shape, syncsCounter, walSyncs, fetchMsgs)
		n1, sum1, err1 := walSyncStats(regs)
		if err := errors.Join(err0, err1); err != nil {
			b.Logf("WAL sync durations unavailable: %v", err)
		} else if n1 > n0 && r.Elapsed > 0 {
			b.ReportMetric((sum1-sum0)/float64(n1-n0)*1e6, "wal-sync-us")
			b.ReportMetric((sum1-sum0)/float64(len(regs))/r.Elapsed.Seconds(), "wal-sync-busy")
		}
	})
}

// BenchmarkTenureManyRangesProcs is BenchmarkTenureManyRanges with each
// replica a `tenure replica` process, as deployed: each has the Go
// runtime's threads of its own, where in one process the three replicas'
// blocking fdatasyncs hold the same two Ps. It reports syncs/record (the
// processes' fsyncs and fdatasyncs, counted by the kernel) and
// fetch-msgs/record from the processes' metrics.
func BenchmarkTenureManyRangesProcs(b *testing.B) {
	metricsPorts := freePorts(b, 3)
	c, _ := startTenureProcsWith(b, 3, func(i int) []string {
		return []string{"--metrics-listen", fmt.Sprintf("127.0.0.1:%d", metricsPorts[i])}
	})
	fetchMsgs := counter{unit: "fetch-msgs/record", read: func() (uint64, error) {
		var sum float64
		for _, port := range metricsPorts {
			sum += fetchMessages(b, fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
		}
		return uint64(sum), nil
	}}
	runTenureManyShapes(b, c, func(b *testing.B, newAppender func(client int) (Appender, error), shape Shape) {
		runShapeCounting(b, newAppender, shape, syncsCounter, fetchMsgs)
	})
}

// runTenureManyShapes runs manyShapes on c, creating the ranges each needs
// (newManyRanges) and measuring each with measure.
func runTenureManyShapes(b *testing.B, c *tenureCluster, measure func(b *testing.B, newAppender func(client int) (Appender, error), shape Shape)) {
	warmWAL(b, c)
	ready := 0 // ranges many-0..many-(ready-1) exist
	for _, s := range manyShapes() {
		b.Run(s.Name, func(b *testing.B) {
			if ready < s.Ranges {
				start := time.Now()
				if err := c.newManyRanges(b.Context(), ready, s.Ranges); err != nil {
					b.Fatal(err)
				}
				b.Logf("ranges %d..%d adopted and one append acknowledged on each in %v", ready, s.Ranges-1, time.Since(start).Round(time.Millisecond))
				ready = s.Ranges
			}
			b.Logf("%d ranges, %d clients, one append in flight each, %s", s.Ranges, s.Clients, pick(s.Random))
			measure(b, func(client int) (Appender, error) {
				if !s.Random {
					return c.newAppenderAt(client%len(c.nodes), manyRangeID(client), false), nil
				}
				a := &tenureRandomAppender{ranges: s.Ranges}
				for i := range c.nodes {
					a.leaders = append(a.leaders, c.newAppenderAt(i, "", false))
				}
				return a, nil
			}, s.Shape)
		})
	}
}

func pick(random bool) string {
	if random {
		return "each append to a range picked at random"
	}
	return "client i to range i"
}

func manyRangeID(i int) string { return fmt.Sprintf("many-%d", i) }

// newManyRanges creates ranges many-from..many-(to-1), range i led by
// c.nodes[i mod 3], and appends one record to each (a follower must have
// fetched for it to be acknowledged, so every range is then working).
func (c *tenureCluster) newManyRanges(ctx context.Context, from, to int) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	warm := make([]*tenureAppender, len(c.nodes))
	for i := range c.nodes {
		warm[i] = c.newAppenderAt(i, "", false)
		defer warm[i].Close()
	}
	return inParallel(from, to, func(i int) error {
		leader := i % len(c.nodes)
		if err := c.adoptRange(ctx, manyRangeID(i), leader); err != nil {
			return err
		}
		if err := warm[leader].appendTo(ctx, manyRangeID(i), [][]byte{[]byte("warmup")}); err != nil {
			return fmt.Errorf("warm-up append to %s: %w", manyRangeID(i), err)
		}
		return nil
	})
}

// tenureRandomAppender is a client of every replica, one connection each,
// that appends each call to a range picked at random, sent to its leader.
type tenureRandomAppender struct {
	ranges  int
	leaders []*tenureAppender // leaders[i]: connected to c.nodes[i]
}

func (a *tenureRandomAppender) Append(ctx context.Context, records [][]byte) error {
	i := rand.IntN(a.ranges)
	return a.leaders[i%len(a.leaders)].appendTo(ctx, manyRangeID(i), records)
}

func (a *tenureRandomAppender) Close() error {
	for _, l := range a.leaders {
		_ = l.Close()
	}
	return nil
}

// walSyncStats sums the WAL group commits the replicas' registries count,
// and the seconds they took.
func walSyncStats(regs []*prometheus.Registry) (n uint64, seconds float64, err error) {
	const name = "tenure_replica_wal_fsync_duration_seconds"
	for _, reg := range regs {
		mfs, err := reg.Gather()
		if err != nil {
			return 0, 0, err
		}
		found := false
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
				seconds += m.GetHistogram().GetSampleSum()
				found = true
			}
		}
		if !found {
			return 0, 0, fmt.Errorf("no %s in a replica's registry", name)
		}
	}
	return n, seconds, nil
}

// BenchmarkJetStreamManyRanges runs manyShapes on an in-process 3-node
// JetStream cluster set up as BenchmarkJetStream's (every write fsynced
// before it is acknowledged), one R3 file-storage stream per range. Every
// client is its own connection; the cluster routes each publish to its
// stream's leader, wherever the client is connected.
func BenchmarkJetStreamManyRanges(b *testing.B) {
	runJetStreamManyShapes(b, startJetStreamCluster(b, 3))
}

// BenchmarkJetStreamManyRangesProcs is BenchmarkJetStreamManyRanges with
// each server a nats-server process (BenchmarkJetStreamProcs' cluster).
func BenchmarkJetStreamManyRangesProcs(b *testing.B) {
	runJetStreamManyShapes(b, startJetStreamProcs(b))
}

// runJetStreamManyShapes runs manyShapes on c, creating the streams each
// needs (newManyStreams), and reports syncs/record besides the harness's
// metrics.
func runJetStreamManyShapes(b *testing.B, c *jsCluster) {
	ready := 0
	for _, s := range manyShapes() {
		b.Run(s.Name, func(b *testing.B) {
			if ready < s.Ranges {
				start := time.Now()
				if err := c.newManyStreams(b.Context(), ready, s.Ranges); err != nil {
					b.Fatal(err)
				}
				b.Logf("streams %d..%d created, leaders and replicas current, one publish acknowledged on each in %v", ready, s.Ranges-1, time.Since(start).Round(time.Millisecond))
				ready = s.Ranges
			}
			b.Logf("%d streams, %d clients, one publish in flight each, %s", s.Ranges, s.Clients, pick(s.Random))
			newAppender := func(client int) (Appender, error) {
				if !s.Random {
					return c.newAppender(s.Shape, manySubject(client))
				}
				a, err := c.newAppender(s.Shape, "")
				if err != nil {
					return nil, err
				}
				return &jsRandomAppender{jsAppender: a.(*jsAppender), ranges: s.Ranges}, nil
			}
			// The streams stay until the cluster goes: deleting a
			// thousand takes a while and nothing after them needs it.
			runShapeCounting(b, newAppender, s.Shape, syncsCounter)
		})
	}
}

func manyStream(i int) string  { return fmt.Sprintf("MANY%d", i) }
func manySubject(i int) string { return fmt.Sprintf("many.%d", i) }

// newManyStreams creates streams MANYfrom..MANY(to-1), each R3 with
// subject many.<i>, every one with a leader, its replicas current and one
// publish acknowledged (createStream).
func (c *jsCluster) newManyStreams(ctx context.Context, from, to int) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	var conns []*nats.Conn
	var jss []jetstream.JetStream
	defer func() {
		for _, nc := range conns {
			nc.Close()
		}
	}()
	for range manySetupWorkers {
		nc, err := c.connect()
		if err != nil {
			return err
		}
		conns = append(conns, nc)
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		jss = append(jss, js)
	}
	var turn atomic.Int64
	return inParallel(from, to, func(i int) error {
		js := jss[int(turn.Add(1))%len(jss)]
		return createStream(ctx, js, manyStream(i), manySubject(i), 3)
	})
}

// jsRandomAppender publishes each call to a stream picked at random.
type jsRandomAppender struct {
	*jsAppender
	ranges int
}

func (a *jsRandomAppender) Append(ctx context.Context, records [][]byte) error {
	_, err := a.js.Publish(ctx, manySubject(rand.IntN(a.ranges)), records[0], jsPublishOpts...)
	return err
}

// BenchmarkFloorManyRanges runs BenchmarkFloor's cluster with the
// clients of each of manyShapes: as many producers as the shape has, one
// record in flight each. The floor has no ranges (one leader, one file per
// replica, every producer's records in one group commit), so this is the
// physical limit of the machine for the same concurrency: what tenure and
// JetStream reach with that many producers, spread over that many ranges,
// is read against it. A fresh cluster per shape (it starts in
// milliseconds).
func BenchmarkFloorManyRanges(b *testing.B) {
	for _, s := range manyShapes() {
		b.Run(s.Name, func(b *testing.B) {
			c := startFloorCluster(b, false)
			b.Logf("%d clients, one call in flight each (no ranges: the floor's limit for %d producers)", s.Clients, s.Clients)
			own := counter{unit: "own-syncs/record", read: func() (uint64, error) { return uint64(c.syncs.Load()), nil }}
			runShapeCounting(b, c.newAppender, s.Shape, syncsCounter, own)
		})
	}
}

// counterSum sums the counters named in the replicas' registries.
func counterSum(regs []*prometheus.Registry, names ...string) (uint64, error) {
	var sum float64
	for _, reg := range regs {
		mfs, err := reg.Gather()
		if err != nil {
			return 0, err
		}
		for _, name := range names {
			found := false
			for _, mf := range mfs {
				if mf.GetName() != name {
					continue
				}
				for _, m := range mf.GetMetric() {
					sum += m.GetCounter().GetValue()
				}
				found = true
			}
			if !found {
				return 0, fmt.Errorf("no %s in a replica's registry", name)
			}
		}
	}
	return uint64(sum), nil
}
