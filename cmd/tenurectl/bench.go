package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/appender"
	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

const benchHelp = `
Measure acknowledged appends against a range's leader: --concurrency
appenders each send batches of --batch records of --size random bytes until
--records records are acknowledged, or for --duration (then --records, when
given, is a cap: the run ends at whichever comes first). Prints throughput
and the latency of one append (send to acknowledgement, i.e. until a quorum
holds it durably) at the 50th, 99th and 99.9th percentiles. Runs longer than
a few seconds print a progress line to stderr every two seconds.

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
to compare the two client paths).

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

func runBench(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "bench", "RANGE [--records N | --duration D] [--size BYTES] [--concurrency N] [--batch N] [--disk]", benchHelp)
	o := addClusterFlags(e, fs)
	records := fs.Int("records", 10_000, fmt.Sprintf("records to append in all (1-%d); with --duration, a cap (%d unless given)", benchMaxRecords, benchMaxRecords))
	duration := fs.Duration("duration", 0, "run for this long (e.g. 30s, 10m) instead of until --records are acknowledged; appends in flight at the end are waited for and counted")
	disk := fs.Bool("disk", false, "sample every replica's bytes on disk and the range's stored bytes every 500ms; report them with the progress and their peaks")
	size := fs.Int("size", 100, fmt.Sprintf("bytes per record (0-%d)", wire.MaxRecordBytes))
	concurrency := fs.Int("concurrency", 4, "appenders sending at once (1-1024)")
	batch := fs.Int("batch", 1, fmt.Sprintf("records per append (1-%d)", wire.MaxBatchRecords))
	unary := fs.Bool("unary", false, "send each append as a unary Append call instead of on an AppendStream")
	positional, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	recordsSet := false
	fs.Visit(func(f *flag.Flag) { recordsSet = recordsSet || f.Name == "records" })
	if *duration > 0 && !recordsSet {
		*records = benchMaxRecords // a duration run is capped only by memory (every latency is kept)
	}
	switch {
	case len(positional) != 1:
		return usagef("want exactly one RANGE, got %d arguments", len(positional))
	case *records < 1 || *records > benchMaxRecords:
		return usagef("--records %d: want 1 to %d", *records, benchMaxRecords)
	case *duration < 0 || *duration > benchMaxDuration:
		return usagef("--duration %v: want a positive duration, at most %v", *duration, benchMaxDuration)
	case *size < 0 || *size > wire.MaxRecordBytes:
		return usagef("--size %d: want 0 to %d", *size, wire.MaxRecordBytes)
	case *concurrency < 1 || *concurrency > 1024:
		return usagef("--concurrency %d: want 1 to 1024", *concurrency)
	case *batch < 1 || *batch > wire.MaxBatchRecords:
		return usagef("--batch %d: want 1 to %d", *batch, wire.MaxBatchRecords)
	case *batch**size > wire.MaxBatchBytes:
		return usagef("--batch %d of --size %d is %d bytes, more than a batch may be (%d)", *batch, *size, *batch**size, wire.MaxBatchBytes)
	}
	rangeID := positional[0]
	c := newClients(o)
	defer c.close()
	leader, epoch, err := c.findLeader(ctx, rangeID, leaderWait)
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
		fmt.Fprintf(e.stdout, "bench range %s, leader %s at epoch %d: %s of %d bytes, batches of %d, %d concurrent appenders (%s)\n",
			rangeID, leader.GetId(), epoch, what, *size, *batch, *concurrency, path)
	}
	var sampler *diskSampler
	if *disk {
		r, err := c.getRange(ctx, rangeID)
		if err != nil {
			return err
		}
		sampler = startDiskSampler(ctx, c, r, benchDiskEvery)
		defer sampler.stop()
	}

	value := make([]byte, *size)
	_, _ = rand.Read(value)
	lc := c.log(leader.GetAddress())
	streams := appender.New(lc)
	defer streams.Close()
	appendOnce := func(ctx context.Context, values [][]byte) error {
		if *unary {
			_, err := lc.Append(ctx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: rangeID, Records: values}))
			return err
		}
		_, err := streams.Append(ctx, rangeID, values)
		return err
	}
	var (
		claimed, acked atomic.Int64
		mu             sync.Mutex
		latencies      = make([]time.Duration, 0, min(*records / *batch + 1, 1<<16))
		firstErr       error
	)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	start := time.Now()
	// With --duration, no append starts after the deadline; the ones in
	// flight finish (each bounded below) and count.
	deadline := start.Add(*duration)
	var wg sync.WaitGroup
	for range *concurrency {
		wg.Go(func() {
			for runCtx.Err() == nil {
				if *duration > 0 && !time.Now().Before(deadline) {
					return
				}
				n := int(min(int64(*batch), int64(*records)-claimed.Add(int64(*batch))+int64(*batch)))
				if n <= 0 {
					return
				}
				values := make([][]byte, n)
				for i := range values {
					values[i] = value
				}
				t0 := time.Now()
				cctx, cancel := context.WithTimeout(runCtx, 30*time.Second)
				err := appendOnce(cctx, values)
				cancel()
				d := time.Since(t0)
				mu.Lock()
				if err != nil {
					if firstErr == nil && runCtx.Err() == nil {
						firstErr = err
					}
					mu.Unlock()
					stop()
					return
				}
				latencies = append(latencies, d)
				mu.Unlock()
				acked.Add(int64(n))
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
		return fmt.Errorf("append to leader %s failed after %d acknowledged records: %v; %s", leader.GetId(), n, firstErr, outcome)
	}
	if ctx.Err() != nil {
		fmt.Fprintf(e.stderr, "bench: interrupted after %d acknowledged records\n", n)
	}
	slices.Sort(latencies)
	res := benchJSON{
		Range: rangeID, Leader: leader.GetId(), Epoch: epoch,
		Records: n, RecordBytes: *size, Batch: *batch, Concurrency: *concurrency, Appends: len(latencies),
		ElapsedMs:     float64(elapsed.Microseconds()) / 1000,
		RecordsPerSec: float64(n) / elapsed.Seconds(),
		MBPerSec:      float64(n) * float64(*size) / elapsed.Seconds() / 1e6,
		P50Ms:         ms(percentile(latencies, 0.50)),
		P99Ms:         ms(percentile(latencies, 0.99)),
		P999Ms:        ms(percentile(latencies, 0.999)),
		MaxMs:         ms(percentile(latencies, 1)),
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
	if *disk {
		return writeDiskPeaks(e.stdout, res.Disk)
	}
	return nil
}

type benchJSON struct {
	Range         string  `json:"range_id"`
	Leader        string  `json:"leader_id"`
	Epoch         uint64  `json:"epoch"`
	Records       int64   `json:"records"`
	RecordBytes   int     `json:"record_bytes"`
	Batch         int     `json:"batch"`
	Concurrency   int     `json:"concurrency"`
	Appends       int     `json:"appends"`
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
