// Package bench is a side-by-side harness for acknowledged appends: it drives
// any system behind the small Appender interface with the same load shapes and
// reports throughput and per-call latency percentiles, so tenure and a
// baseline (NATS JetStream, see jetstream_test.go) are measured identically.
//
// It is a separate Go module so that the baseline's dependencies never enter
// the product's go.mod.
package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Appender appends records to a log. Append returns only when every record
// of the call is acknowledged durably (fsynced on the replicas the system
// requires for an acknowledgement), or with an error.
//
// When a shape has more than one call in flight per client
// (InFlight/Batch > 1), Run calls Append on the same Appender concurrently,
// so such an Appender must be safe for concurrent use. Append must not modify
// or keep the records slices after it returns: Run reuses them.
//
// If an Appender also implements io.Closer, Run closes it when the run ends.
type Appender interface {
	Append(ctx context.Context, records [][]byte) error
}

// Shape is a load shape.
type Shape struct {
	Name     string
	Clients  int // independent clients; Run asks newAppender for one Appender each
	InFlight int // records outstanding per client
	Batch    int // records per Append call; InFlight/Batch calls run concurrently per client
}

// Calls is the number of concurrent Append calls per client.
func (s Shape) Calls() int { return max(1, s.InFlight/max(1, s.Batch)) }

// Shapes are the shapes every system is measured with.
var Shapes = []Shape{
	{Name: "one-in-flight", Clients: 1, InFlight: 1, Batch: 1},
	{Name: "256-in-flight", Clients: 1, InFlight: 256, Batch: 32}, // 8 concurrent calls of 32 records
	{Name: "64-clients", Clients: 64, InFlight: 1, Batch: 1},
}

// RecordBytes is the record size every shape is measured with.
const RecordBytes = 1024

// DrainTimeout bounds how long Run waits, after the measured duration, for
// calls already in flight to be acknowledged before it cancels them.
var DrainTimeout = 30 * time.Second

// Result is the outcome of one Run.
type Result struct {
	Records       int           // acknowledged records
	Calls         int           // acknowledged Append calls (latency samples)
	Elapsed       time.Duration // from the first call to the last acknowledgement (includes the drain)
	RecordsPerSec float64
	MBPerSec      float64 // 1 MB = 1e6 bytes of record payload
	P50           time.Duration
	P99           time.Duration
	P999          time.Duration
	// CPUPerRecord is the process's CPU time (user and system, every
	// goroutine: clients, servers and the kernel's work for them; plus that
	// of the server processes registered with AddServerProcess) per
	// acknowledged record, and SchedSamplesPerRecord the runtime's sampled
	// count of goroutines it started running, per record (schedSamples: a
	// fixed fraction of the starts, about one in 8 in Go 1.26, so compare
	// it between runs and systems, not with a count of hand-offs). Both
	// count work rather than waiting, so they move far less than throughput when other load
	// shares the machine: a change that saves work shows in them even on a
	// day whose throughput varies 2x from run to run. Process-wide, so
	// they describe a system only when it runs alone in the process, as
	// each benchmark here does. (With servers in processes of their own,
	// the scheduler samples count this process's goroutines only.)
	CPUPerRecord          time.Duration
	SchedSamplesPerRecord float64
}

func (r Result) String() string {
	return fmt.Sprintf("%d records in %v: %.0f records/s, %.2f MB/s, p50 %v, p99 %v, p99.9 %v, %v CPU and %.2f scheduler samples per record",
		r.Records, r.Elapsed.Round(time.Millisecond), r.RecordsPerSec, r.MBPerSec,
		r.P50.Round(10*time.Microsecond), r.P99.Round(10*time.Microsecond), r.P999.Round(10*time.Microsecond),
		r.CPUPerRecord.Round(time.Microsecond), r.SchedSamplesPerRecord)
}

// Run drives shape against the appenders newAppender makes (one per client,
// made before the clock starts) with records of recordBytes random bytes.
// Every caller issues calls back to back until d has passed, then issues no
// more; calls already in flight are drained (bounded by DrainTimeout) and
// counted. Latency is measured per acknowledged call, which is per record
// for batch 1. The first error ends the run and is returned.
func Run(ctx context.Context, newAppender func(client int) (Appender, error), shape Shape, recordBytes int, d time.Duration) (Result, error) {
	return run(ctx, newAppender, shape, recordBytes, d, 0)
}

// RunRecords is Run sized by records rather than time: the callers issue
// calls until records records (rounded up to whole calls of shape.Batch)
// have been issued, or until d has passed, whichever comes first. A run
// that d cut short reports fewer records: a caller that needs them all
// checks Result.Records.
func RunRecords(ctx context.Context, newAppender func(client int) (Appender, error), shape Shape, recordBytes, records int, d time.Duration) (Result, error) {
	if records < 1 {
		return Result{}, fmt.Errorf("bench: bad record count %d", records)
	}
	return run(ctx, newAppender, shape, recordBytes, d, records)
}

// run is Run, and with records > 0 RunRecords.
func run(ctx context.Context, newAppender func(client int) (Appender, error), shape Shape, recordBytes int, d time.Duration, records int) (Result, error) {
	if shape.Clients < 1 || shape.InFlight < 1 || shape.Batch < 1 || shape.InFlight%shape.Batch != 0 {
		return Result{}, fmt.Errorf("bench: bad shape %+v: need Clients, InFlight, Batch >= 1 and Batch dividing InFlight", shape)
	}
	if recordBytes < 1 || d <= 0 {
		return Result{}, fmt.Errorf("bench: bad recordBytes %d or duration %v", recordBytes, d)
	}

	appenders := make([]Appender, 0, shape.Clients)
	defer func() {
		for _, a := range appenders {
			if c, ok := a.(io.Closer); ok {
				_ = c.Close()
			}
		}
	}()
	for i := range shape.Clients {
		a, err := newAppender(i)
		if err != nil {
			return Result{}, fmt.Errorf("bench: appender for client %d: %w", i, err)
		}
		appenders = append(appenders, a)
	}

	// One random payload shared (read-only) by every record.
	payload := make([]byte, recordBytes)
	for i := range payload {
		payload[i] = byte(rand.Uint32())
	}

	callCtx, cancel := context.WithCancel(ctx)
	defer cancel()

	type sample struct {
		lat     []time.Duration
		records int
		err     error
	}
	calls := shape.Calls()
	samples := make([]sample, shape.Clients*calls)

	// claim takes one call's records from the run's count, false once it
	// is spent (always true for a run sized by time).
	var issued atomic.Int64
	claim := func() bool {
		return records == 0 || issued.Add(int64(shape.Batch))-int64(shape.Batch) < int64(records)
	}
	var wg sync.WaitGroup
	stopProfile, err := startWindowProfile()
	if err != nil {
		return Result{}, err
	}
	cpu0, sched0 := processCPU(), schedSamples()
	start := time.Now()
	deadline := start.Add(d)
	drain := time.AfterFunc(d+DrainTimeout, cancel)
	defer drain.Stop()
	for c, a := range appenders {
		for k := range calls {
			s := &samples[c*calls+k]
			wg.Go(func() {
				records := make([][]byte, shape.Batch)
				for i := range records {
					records[i] = payload
				}
				s.lat = make([]time.Duration, 0, 1024)
				for time.Now().Before(deadline) && callCtx.Err() == nil && claim() {
					t0 := time.Now()
					if err := a.Append(callCtx, records); err != nil {
						s.err = err
						cancel() // first error stops everyone
						return
					}
					s.lat = append(s.lat, time.Since(t0))
					s.records += len(records)
				}
			})
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu, sched := processCPU()-cpu0, schedSamples()-sched0
	stopProfile()

	var r Result
	var lat []time.Duration
	var errs []error
	for _, s := range samples {
		r.Records += s.records
		lat = append(lat, s.lat...)
		if s.err != nil && !errors.Is(s.err, context.Canceled) {
			errs = append(errs, s.err)
		}
	}
	if len(errs) == 0 {
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
		} else if elapsed > d+DrainTimeout {
			errs = append(errs, fmt.Errorf("bench: in-flight calls not acknowledged within drain timeout %v", DrainTimeout))
		}
	}
	if len(errs) > 0 {
		return Result{}, fmt.Errorf("bench: shape %s: %w", shape.Name, errors.Join(errs...))
	}
	r.Calls = len(lat)
	r.Elapsed = elapsed
	secs := elapsed.Seconds()
	r.RecordsPerSec = float64(r.Records) / secs
	r.MBPerSec = float64(r.Records) * float64(recordBytes) / 1e6 / secs
	slices.Sort(lat)
	r.P50 = Percentile(lat, 0.50)
	r.P99 = Percentile(lat, 0.99)
	r.P999 = Percentile(lat, 0.999)
	if r.Records > 0 {
		r.CPUPerRecord = cpu / time.Duration(r.Records)
		r.SchedSamplesPerRecord = float64(sched) / float64(r.Records)
	}
	return r, nil
}

// processCPU is the user and system CPU time so far of this process and of
// the server processes registered with AddServerProcess: a system whose
// servers run in processes of their own (procs_test.go) is charged their
// work as an in-process one is.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	serverProcs.Lock()
	defer serverProcs.Unlock()
	for pid := range serverProcs.pids {
		cpu += procCPU(pid)
	}
	return cpu
}

// serverProcs are the running server processes whose CPU processCPU adds.
var serverProcs = struct {
	sync.Mutex
	pids map[int]struct{}
}{pids: map[int]struct{}{}}

// AddServerProcess makes processCPU count process pid's CPU time, until the
// returned function is called (before the process is reaped: a reaped
// pid's time is gone, and the pid may be reused).
func AddServerProcess(pid int) (remove func()) {
	serverProcs.Lock()
	defer serverProcs.Unlock()
	serverProcs.pids[pid] = struct{}{}
	return func() {
		serverProcs.Lock()
		defer serverProcs.Unlock()
		delete(serverProcs.pids, pid)
	}
}

// procCPU is process pid's user and system CPU time from /proc/PID/stat
// (0 if it cannot be read). The counts are in USER_HZ ticks, 100 per second
// on Linux whatever the kernel's own tick: 10 ms resolution, fine for runs
// of seconds.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name, field 2, is in parentheses and may hold spaces:
	// count fields from after its closing one, where field 3 begins.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	const utime, stime = 14 - 3, 15 - 3 // fields 14 and 15, counted from field 3
	if len(f) <= stime {
		return 0
	}
	u, err1 := strconv.ParseUint(f[utime], 10, 64)
	s, err2 := strconv.ParseUint(f[stime], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	const userHZ = 100
	return time.Duration(u+s) * time.Second / userHZ
}

// schedSamples is the sample count of the runtime's scheduling-latency
// histogram so far. The runtime times only every gTrackingPeriod-th (8)
// transition of a goroutine from runnable to running, so this counts a
// fixed fraction of the goroutine starts: an appender whose every call
// parks and is woken shows ~0.12 per call.
func schedSamples() uint64 {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return 0
	}
	var n uint64
	for _, c := range s[0].Value.Float64Histogram().Counts {
		n += c
	}
	return n
}

// Percentile returns the nearest-rank p-quantile (0 < p <= 1) of sorted,
// ascending latencies: the smallest sample that at least p of the samples do
// not exceed. It returns 0 for no samples.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// Report reports r as the benchmark's metrics and suppresses ns/op, which is
// meaningless for a run of fixed duration.
func Report(b *testing.B, r Result) {
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(r.RecordsPerSec, "records/s")
	b.ReportMetric(r.MBPerSec, "MB/s")
	b.ReportMetric(ms(r.P50), "p50-ms")
	b.ReportMetric(ms(r.P99), "p99-ms")
	b.ReportMetric(ms(r.P999), "p99.9-ms")
	b.ReportMetric(float64(r.CPUPerRecord)/float64(time.Microsecond), "cpu-us/record")
	b.ReportMetric(r.SchedSamplesPerRecord, "sched-samples/record")
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
