package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	"maps"
	mathrand "math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/appender"
	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

const benchHelp = `
Measure acknowledged appends against a range's leader: --concurrency
appenders each send batches of --batch records of --size random bytes until
--records records are acknowledged, or for --duration (then --records, when
given, is a cap: the run ends at whichever comes first). Prints throughput
and the latency of one append (send to acknowledgement, i.e. until a quorum
holds it durably) at the 50th, 99th and 99.9th percentiles. Runs longer than
a few seconds print a progress line to stderr every two seconds.

Several RANGEs are benched together, each at its own leader, and the
figures are for all of them: appender i appends to the i-th range (in
turn, when there are more appenders than ranges), so --concurrency
defaults to one appender per range (at least 4); with --random every
append goes to a range drawn at random instead, which lets fewer appenders
than ranges spread over all of them. The report adds how the acknowledged
records fell on the ranges (fewest, median, most); --json lists every
range's leader, epoch and acknowledged records. E.g. one producer with one
append in flight on each of 100 ranges, or 64 producers spreading over
them:
  tenurectl bench $(seq -f 'b%g' 100) --duration 10s
  tenurectl bench $(seq -f 'b%g' 100) --duration 10s --concurrency 64 --random

--disk samples every replica of the range every 500ms (GetStatus): the
bytes its data directory takes on disk (DiskStatus.used_bytes; "-" from a
replica that does not report it) and the range's stored bytes on it
(stored_bytes: its batches from its log start, what retention's max_bytes
is measured against). Each progress line gives the last sample, and the
report each replica's peak of both; with --json every sample. A soak of a
range with retention, e.g. --duration 10m --disk, shows whether its disk
stays bounded.

Each appender keeps one LogService.AppendStream open and sends its
appends on it, one at a time (--unary: one Append call per append instead,
to compare the two client paths). Streamed appends follow a range's leader
when it moves (a promotion, a leader's crash) as pkg/appender does: the
append is sent again to the new leader with the same producer sequence, so
it is written once, and the run goes on; the report says how many leader
changes it followed. An append still failing after about 15 s of retries
ends the run. For that each range has its own producer and pool of
streams (ranges led by one replica share its connection): with --random
over many ranges that is a stream per range, which costs the first
append on each (measured at 1,000 ranges and 64 appenders: about 0.8 of
shared per-leader pools over 5 s, 0.9 over 15 s). Unary appends go to the leader the run started with, and the
first one a leader change fails ends the run.

The records are really appended: bench a range made for it.
`

// benchMaxRecords bounds one run; every append's latency is kept in memory.
const benchMaxRecords = 10_000_000

// benchProgressEvery is how often a long run reports progress.
const benchProgressEvery = 2 * time.Second

// benchDiskEvery is how often --disk samples each replica.
const benchDiskEvery = 500 * time.Millisecond

// benchMaxDuration bounds --duration.
const benchMaxDuration = 7 * 24 * time.Hour

// benchMaxRanges bounds the ranges of one run: each one's leader is looked
// up before the run starts.
const benchMaxRanges = 10_000

// benchMaxConcurrency bounds --concurrency.
const benchMaxConcurrency = 1024

// benchLookups is how many ranges' leaders are looked up at once.
const benchLookups = 16

func runBench(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "bench", "RANGE [RANGE...] [--records N | --duration D] [--size BYTES] [--concurrency N] [--batch N] [--random] [--disk]", benchHelp)
	o := addClusterFlags(e, fs)
	records := fs.Int("records", 10_000, fmt.Sprintf("records to append in all (1-%d); with --duration, a cap (%d unless given)", benchMaxRecords, benchMaxRecords))
	duration := fs.Duration("duration", 0, "run for this long (e.g. 30s, 10m) instead of until --records are acknowledged; appends in flight at the end are waited for and counted")
	disk := fs.Bool("disk", false, "sample every replica's bytes on disk and the range's stored bytes every 500ms; report them with the progress and their peaks")
	size := fs.Int("size", 100, fmt.Sprintf("bytes per record (0-%d)", wire.MaxRecordBytes))
	concurrency := fs.Int("concurrency", 4, fmt.Sprintf("appenders sending at once (1-%d); with several RANGEs, one per range unless given (at least 4)", benchMaxConcurrency))
	batch := fs.Int("batch", 1, fmt.Sprintf("records per append (1-%d)", wire.MaxBatchRecords))
	unary := fs.Bool("unary", false, "send each append as a unary Append call instead of on an AppendStream")
	random := fs.Bool("random", false, "send every append to one of the RANGEs drawn at random, instead of each appender to one range")
	positional, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	recordsSet, concurrencySet := false, false
	fs.Visit(func(f *flag.Flag) {
		recordsSet = recordsSet || f.Name == "records"
		concurrencySet = concurrencySet || f.Name == "concurrency"
	})
	if *duration > 0 && !recordsSet {
		*records = benchMaxRecords // a duration run is capped only by memory (every latency is kept)
	}
	if !concurrencySet && !*random && len(positional) > *concurrency {
		// One producer per range, the shape a replica hosting many ranges
		// exists for; more than the bound is refused below.
		*concurrency = len(positional)
	}
	if dup := firstDuplicate(positional); dup != "" {
		return usagef("range %q is given twice", dup)
	}
	switch {
	case len(positional) == 0:
		return usagef("want a RANGE (or several)")
	case len(positional) > benchMaxRanges:
		return usagef("%d ranges: want at most %d", len(positional), benchMaxRanges)
	case len(positional) > benchMaxConcurrency && !*random:
		return usagef("%d ranges need as many appenders, more than --concurrency allows (%d): give --random to spread fewer appenders over them", len(positional), benchMaxConcurrency)
	case *concurrency < len(positional) && !*random:
		return usagef("--concurrency %d leaves ranges without an appender (%d ranges): give at least %d, or --random to spread the appenders over them", *concurrency, len(positional), len(positional))
	case *disk && len(positional) > 1:
		return usagef("--disk samples one range's replicas: give one RANGE")
	case *records < 1 || *records > benchMaxRecords:
		return usagef("--records %d: want 1 to %d", *records, benchMaxRecords)
	case *duration < 0 || *duration > benchMaxDuration:
		return usagef("--duration %v: want a positive duration, at most %v", *duration, benchMaxDuration)
	case *size < 0 || *size > wire.MaxRecordBytes:
		return usagef("--size %d: want 0 to %d", *size, wire.MaxRecordBytes)
	case *concurrency < 1 || *concurrency > benchMaxConcurrency:
		return usagef("--concurrency %d: want 1 to %d", *concurrency, benchMaxConcurrency)
	case *batch < 1 || *batch > wire.MaxBatchRecords:
		return usagef("--batch %d: want 1 to %d", *batch, wire.MaxBatchRecords)
	case *batch**size > wire.MaxBatchBytes:
		return usagef("--batch %d of --size %d is %d bytes, more than a batch may be (%d)", *batch, *size, *batch**size, wire.MaxBatchBytes)
	}
	c := newClients(o)
	defer c.close()
	targets, err := c.benchTargets(ctx, positional, e.stderr)
	if err != nil {
		return err
	}
	if !*o.json {
		path := "one AppendStream each"
		if *unary {
			path = "unary Append calls"
		}
		what := fmt.Sprintf("%d records", *records)
		if *duration > 0 {
			what = fmt.Sprintf("for %v, records", *duration)
			if recordsSet {
				what = fmt.Sprintf("for %v (at most %d records), records", *duration, *records)
			}
		}
		spread := ""
		switch {
		case *random && len(targets) > 1:
			spread = ", each append to a range drawn at random"
		case len(targets) > 1 && *concurrency > len(targets):
			spread = ", appender i on range i in turn"
		case len(targets) > 1:
			spread = ", one a range"
		}
		fmt.Fprintf(e.stdout, "bench %s: %s of %d bytes, batches of %d, %d concurrent appenders%s (%s)\n",
			describeTargets(targets), what, *size, *batch, *concurrency, spread, path)
	}
	var sampler *diskSampler
	if *disk {
		r, err := c.getRange(ctx, targets[0].rangeID)
		if err != nil {
			return err
		}
		sampler = startDiskSampler(ctx, c, r, benchDiskEvery)
		defer sampler.stop()
	}

	value := make([]byte, *size)
	_, _ = rand.Read(value)
	// One client per leader, which the ranges it leads share (one
	// connection, as producers of many ranges would share it), and one
	// Appender (a pool of streams and an idempotent producer) per range,
	// which follows the range's leader when it moves: a not-leader answer
	// names the new one, and after a leader's crash the lease service
	// does (LeaseLeader); the append is sent again with the same producer
	// sequence, so it is written once. Unary appends go to the leader the
	// run started with.
	clientOf := map[string]tenurev1connect.LogServiceClient{}
	logClient := func(addr string) tenurev1connect.LogServiceClient {
		if lc := clientOf[addr]; lc != nil {
			return lc
		}
		lc := c.log(addr)
		clientOf[addr] = lc
		return lc
	}
	var clientMu sync.Mutex // the Appenders dial followed leaders concurrently
	dial := func(addr string) tenurev1connect.LogServiceClient {
		clientMu.Lock()
		defer clientMu.Unlock()
		return logClient(addr)
	}
	for i := range targets {
		t := &targets[i]
		t.lc = logClient(t.leader.GetAddress())
		t.streams = appender.New(t.lc, appender.FollowLeader(dial),
			appender.LocateLeader(appender.LeaseLeader(c.lease)), appender.WithRetries(benchRetries))
	}
	defer func() {
		for i := range targets {
			targets[i].streams.Close()
		}
	}()
	appendOnce := func(ctx context.Context, t *benchTarget, values [][]byte) error {
		if *unary {
			_, err := t.lc.Append(ctx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: t.rangeID, Records: values}))
			return err
		}
		ack, err := t.streams.Append(ctx, t.rangeID, values)
		if err == nil {
			t.sawEpoch(ack.GetEpoch())
		}
		return err
	}
	var (
		claimed, acked atomic.Int64
		mu             sync.Mutex
		latencies      = make([]time.Duration, 0, min(*records / *batch + 1, 1<<16))
		firstErr       error
		failedOn       *benchTarget
	)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	start := time.Now()
	// With --duration, no append starts after the deadline; the ones in
	// flight finish (each bounded below) and count.
	deadline := start.Add(*duration)
	var wg sync.WaitGroup
	for i := range *concurrency {
		wg.Go(func() {
			for runCtx.Err() == nil {
				if *duration > 0 && !time.Now().Before(deadline) {
					return
				}
				n := int(min(int64(*batch), int64(*records)-claimed.Add(int64(*batch))+int64(*batch)))
				if n <= 0 {
					return
				}
				t := &targets[i%len(targets)]
				if *random {
					t = &targets[mathrand.IntN(len(targets))]
				}
				values := make([][]byte, n)
				for j := range values {
					values[j] = value
				}
				t0 := time.Now()
				cctx, cancel := context.WithTimeout(runCtx, 30*time.Second)
				err := appendOnce(cctx, t, values)
				cancel()
				d := time.Since(t0)
				mu.Lock()
				if err != nil {
					if firstErr == nil && runCtx.Err() == nil {
						firstErr, failedOn = err, t
					}
					mu.Unlock()
					stop()
					return
				}
				latencies = append(latencies, d)
				mu.Unlock()
				acked.Add(int64(n))
				t.acked.Add(int64(n))
				t.appends.Add(1)
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(benchProgressEvery)
	defer tick.Stop()
progress:
	for {
		select {
		case <-done:
			break progress
		case <-tick.C:
			n, el := acked.Load(), time.Since(start)
			of := fmt.Sprintf("%d/%d records acknowledged in %v", n, *records, el.Round(time.Second))
			if *duration > 0 {
				of = fmt.Sprintf("%d records acknowledged in %v of %v", n, el.Round(time.Second), *duration)
			}
			line := fmt.Sprintf("bench: %s (%.0f records/s)", of, float64(n)/el.Seconds())
			if sampler != nil {
				line += "; disk " + sampler.last().describe()
			}
			fmt.Fprintln(e.stderr, line)
		}
	}
	elapsed := time.Since(start)
	n := acked.Load()
	var samples []diskSample
	if sampler != nil {
		samples = sampler.stop() // and a last sample, after the load
	}
	if firstErr != nil {
		outcome := "the failed batch's outcome is unknown"
		if transport.NotHandled(firstErr) {
			outcome = "the failed batch was not written (the leader stopped before handling it)"
		}
		on := ""
		if len(targets) > 1 {
			on = " of range " + failedOn.rangeID
		}
		return fmt.Errorf("append to leader %s%s failed after %d acknowledged records: %v; %s", failedOn.leader.GetId(), on, n, firstErr, outcome)
	}
	if ctx.Err() != nil {
		fmt.Fprintf(e.stderr, "bench: interrupted after %d acknowledged records\n", n)
	}
	slices.Sort(latencies)
	res := benchJSON{
		Records: n, RecordBytes: *size, Batch: *batch, Concurrency: *concurrency, Random: *random, Appends: len(latencies),
		ElapsedMs:     float64(elapsed.Microseconds()) / 1000,
		RecordsPerSec: float64(n) / elapsed.Seconds(),
		MBPerSec:      float64(n) * float64(*size) / elapsed.Seconds() / 1e6,
		P50Ms:         ms(percentile(latencies, 0.50)),
		P99Ms:         ms(percentile(latencies, 0.99)),
		P999Ms:        ms(percentile(latencies, 0.999)),
		MaxMs:         ms(percentile(latencies, 1)),
	}
	for i := range targets {
		t := &targets[i]
		res.Ranges = append(res.Ranges, benchRangeJSON{
			Range: t.rangeID, Leader: t.leader.GetId(), Epoch: t.epoch,
			Records: t.acked.Load(), Appends: t.appends.Load(), LeaderChanges: t.leaderChanges.Load(),
		})
		res.LeaderChanges += t.leaderChanges.Load()
	}
	if len(targets) == 1 {
		res.Range, res.Leader, res.Epoch = targets[0].rangeID, targets[0].leader.GetId(), targets[0].epoch
	}
	if *disk {
		res.Disk = diskJSON(samples, benchDiskEvery, start)
	}
	if *o.json {
		return writeJSON(e.stdout, res)
	}
	fmt.Fprintf(e.stdout, "acknowledged %d records in %v: %.0f records/s, %.2f MB/s, %.0f appends/s\n",
		n, elapsed.Round(time.Millisecond), res.RecordsPerSec, res.MBPerSec, float64(len(latencies))/elapsed.Seconds())
	fmt.Fprintf(e.stdout, "append latency: p50 %v  p99 %v  p99.9 %v  max %v\n",
		roundLatency(percentile(latencies, 0.50)), roundLatency(percentile(latencies, 0.99)),
		roundLatency(percentile(latencies, 0.999)), roundLatency(percentile(latencies, 1)))
	if res.LeaderChanges > 0 {
		fmt.Fprintf(e.stdout, "followed %d leader changes (--json: each range's leader_changes)\n", res.LeaderChanges)
	}
	if len(targets) > 1 {
		// How evenly the load fell: a range far below the median waited on
		// something the others did not (its leader, its followers).
		per := make([]int64, len(targets))
		for i := range targets {
			per[i] = targets[i].acked.Load()
		}
		slices.Sort(per)
		fmt.Fprintf(e.stdout, "records per range: fewest %d, median %d, most %d (%d ranges)\n",
			per[0], per[len(per)/2], per[len(per)-1], len(per))
	}
	if *disk {
		return writeDiskPeaks(e.stdout, res.Disk)
	}
	return nil
}

// benchTarget is one benched range: its leader when the run started, and
// what was acknowledged on it.
type benchTarget struct {
	rangeID string
	leader  *tenurev1.Replica
	epoch   uint64
	acked   atomic.Int64 // records
	appends atomic.Int64
	// lc is the start leader's client (unary appends); streams appends on
	// AppendStreams, following the leader.
	lc      tenurev1connect.LogServiceClient
	streams *appender.Appender
	// lastEpoch is the highest epoch an acknowledgement named, and
	// leaderChanges how many times it rose: the leader changes the run
	// followed.
	lastEpoch     atomic.Uint64
	leaderChanges atomic.Int64
}

// sawEpoch takes the epoch of an acknowledgement: a higher one than any
// before is a leader change the run followed. A duplicate's epoch (the
// one that first wrote it, perhaps older) moves nothing.
func (t *benchTarget) sawEpoch(e uint64) {
	for {
		cur := t.lastEpoch.Load()
		if e <= max(cur, t.epoch) {
			return
		}
		if t.lastEpoch.CompareAndSwap(cur, e) {
			t.leaderChanges.Add(1)
			return
		}
	}
}

// benchRetries is how many times an append whose outcome is unknown is
// sent again (pkg/appender's backoff: about 15 s in all), enough to follow
// a leader's crash: its lease runs out, then a promotion.
const benchRetries = 18

// benchTargets finds every range's serving leader, benchLookups at a
// time, each waiting up to leaderWait for one. Any range without one fails
// the run before anything is appended. Looking up many ranges takes a
// while: past a few seconds it reports progress on progressTo.
func (c *clients) benchTargets(ctx context.Context, rangeIDs []string, progressTo io.Writer) ([]benchTarget, error) {
	targets := make([]benchTarget, len(rangeIDs))
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next, found atomic.Int64
		mu          sync.Mutex
		firstErr    error
		wg          sync.WaitGroup
	)
	for range min(benchLookups, len(rangeIDs)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(rangeIDs) || lctx.Err() != nil {
					return
				}
				leader, epoch, err := c.findLeader(lctx, rangeIDs[i], leaderWait)
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
						if len(rangeIDs) > 1 && !strings.Contains(err.Error(), rangeIDs[i]) {
							firstErr = fmt.Errorf("range %s: %w", rangeIDs[i], err)
						}
					}
					mu.Unlock()
					cancel()
					return
				}
				targets[i].rangeID, targets[i].leader, targets[i].epoch = rangeIDs[i], leader, epoch
				found.Add(1)
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(benchProgressEvery)
	defer tick.Stop()
	for {
		select {
		case <-done:
			if firstErr != nil {
				return nil, firstErr
			}
			return targets, ctx.Err()
		case <-tick.C:
			fmt.Fprintf(progressTo, "bench: found the leaders of %d/%d ranges\n", found.Load(), len(rangeIDs))
		}
	}
}

// describeTargets is the header's account of the ranges: "range R, leader
// L at epoch E" for one; for several, how many, the first few, and how
// many each leader leads.
func describeTargets(targets []benchTarget) string {
	if len(targets) == 1 {
		return fmt.Sprintf("range %s, leader %s at epoch %d", targets[0].rangeID, targets[0].leader.GetId(), targets[0].epoch)
	}
	const shown = 3
	names := make([]string, 0, shown+1)
	for i := range min(shown, len(targets)) {
		names = append(names, targets[i].rangeID)
	}
	if len(targets) > shown {
		names = append(names, "...")
	}
	led := map[string]int{}
	for i := range targets {
		led[targets[i].leader.GetId()]++
	}
	leaders := make([]string, 0, len(led))
	for _, id := range slices.Sorted(maps.Keys(led)) {
		leaders = append(leaders, fmt.Sprintf("%s %d", id, led[id]))
	}
	return fmt.Sprintf("%d ranges (%s), leaders %s", len(targets), strings.Join(names, ", "), strings.Join(leaders, ", "))
}

// firstDuplicate is the first id given twice, or "".
func firstDuplicate(ids []string) string {
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		if seen[id] {
			return id
		}
		seen[id] = true
	}
	return ""
}

type benchJSON struct {
	// Range, Leader and Epoch are set when one range was benched; Ranges
	// lists every range, that one too.
	Range       string           `json:"range_id,omitempty"`
	Leader      string           `json:"leader_id,omitempty"`
	Epoch       uint64           `json:"epoch,omitempty"`
	Ranges      []benchRangeJSON `json:"ranges"`
	Records     int64            `json:"records"`
	RecordBytes int              `json:"record_bytes"`
	Batch       int              `json:"batch"`
	Concurrency int              `json:"concurrency"`
	Random      bool             `json:"random"`
	Appends     int              `json:"appends"`
	// LeaderChanges is how many leader changes the run followed, over
	// every range.
	LeaderChanges int64   `json:"leader_changes"`
	ElapsedMs     float64 `json:"elapsed_ms"`
	RecordsPerSec float64 `json:"records_per_sec"`
	MBPerSec      float64 `json:"mb_per_sec"`
	P50Ms         float64 `json:"p50_ms"`
	P99Ms         float64 `json:"p99_ms"`
	P999Ms        float64 `json:"p999_ms"`
	MaxMs         float64 `json:"max_ms"`
	// Disk is set with --disk.
	Disk *benchDiskJSON `json:"disk,omitempty"`
}

// benchRangeJSON is one benched range: its leader when the run started and
// what was acknowledged on it.
type benchRangeJSON struct {
	Range   string `json:"range_id"`
	Leader  string `json:"leader_id"`
	Epoch   uint64 `json:"epoch"`
	Records int64  `json:"records"`
	Appends int64  `json:"appends"`
	// LeaderChanges is how many times an acknowledgement named a higher
	// epoch than any before: the leader changes the run followed.
	LeaderChanges int64 `json:"leader_changes"`
}

// percentile is the nearest-rank percentile q (0 < q <= 1) of sorted
// latencies; 0 when there are none.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func roundLatency(d time.Duration) time.Duration {
	if d >= 10*time.Millisecond {
		return d.Round(time.Millisecond)
	}
	return d.Round(10 * time.Microsecond)
}
