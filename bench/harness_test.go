package bench

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"runtime/trace"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	var lat []time.Duration
	for i := 1; i <= 1000; i++ {
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{
		{0.50, 500 * time.Millisecond},
		{0.99, 990 * time.Millisecond},
		{0.999, 999 * time.Millisecond},
		{1, 1000 * time.Millisecond},
		{0.0001, 1 * time.Millisecond},
	} {
		if got := Percentile(lat, tc.p); got != tc.want {
			t.Errorf("Percentile(1..1000ms, %v) = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := Percentile([]time.Duration{7}, 0.999); got != 7 {
		t.Errorf("single sample: got %v", got)
	}
	if got := Percentile(nil, 0.5); got != 0 {
		t.Errorf("no samples: got %v", got)
	}
	// 10 samples: p99 and p99.9 are the maximum, p50 the 5th.
	ten := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if Percentile(ten, 0.5) != 5 || Percentile(ten, 0.99) != 10 || Percentile(ten, 0.999) != 10 {
		t.Errorf("ten samples: %v %v %v", Percentile(ten, 0.5), Percentile(ten, 0.99), Percentile(ten, 0.999))
	}
}

// sleepAppender sleeps fast for every call except every slowEvery-th, which
// sleeps slow, and tracks the records outstanding.
type sleepAppender struct {
	fast, slow  time.Duration
	slowEvery   int64
	calls       atomic.Int64
	outstanding atomic.Int64
	mu          sync.Mutex
	maxOut      int64
	closed      atomic.Bool
}

func (a *sleepAppender) Append(ctx context.Context, records [][]byte) error {
	out := a.outstanding.Add(int64(len(records)))
	a.mu.Lock()
	a.maxOut = max(a.maxOut, out)
	a.mu.Unlock()
	defer a.outstanding.Add(-int64(len(records)))
	d := a.fast
	if a.calls.Add(1)%a.slowEvery == 0 {
		d = a.slow
	}
	for _, r := range records {
		if len(r) != RecordBytes {
			return errors.New("wrong record size")
		}
	}
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (a *sleepAppender) Close() error { a.closed.Store(true); return nil }

func TestRunPercentilesWithFakeAppender(t *testing.T) {
	// One call in flight; every 10th call is slow, so p50 is a fast call and
	// p99 and p99.9 are slow ones. Sleeps never end early, so the lower
	// bounds are exact; upper bounds leave room for a loaded machine.
	a := &sleepAppender{fast: 2 * time.Millisecond, slow: 40 * time.Millisecond, slowEvery: 10}
	shape := Shape{Name: "one-in-flight", Clients: 1, InFlight: 1, Batch: 1}
	r, err := Run(context.Background(), func(int) (Appender, error) { return a, nil }, shape, RecordBytes, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(r)
	if r.Records == 0 || r.Records != r.Calls || int64(r.Records) != a.calls.Load() {
		t.Fatalf("records %d, calls %d, appender saw %d calls", r.Records, r.Calls, a.calls.Load())
	}
	if r.P50 < a.fast || r.P50 >= a.slow {
		t.Errorf("p50 %v, want a fast call (>= %v, < %v)", r.P50, a.fast, a.slow)
	}
	if r.P99 < a.slow || r.P999 < a.slow {
		t.Errorf("p99 %v, p99.9 %v: want slow calls (>= %v)", r.P99, r.P999, a.slow)
	}
	if r.Elapsed < 500*time.Millisecond {
		t.Errorf("elapsed %v shorter than the duration", r.Elapsed)
	}
	wantRate := float64(r.Records) / r.Elapsed.Seconds()
	// Within rounding: the harness and this line multiply and divide in
	// different orders, which can differ in the last bit.
	if math.Abs(r.RecordsPerSec-wantRate) > 1e-9*wantRate || math.Abs(r.MBPerSec-wantRate*RecordBytes/1e6) > 1e-9*wantRate {
		t.Errorf("rates %v records/s %v MB/s, want %v records/s", r.RecordsPerSec, r.MBPerSec, wantRate)
	}
	// Every call parks on its timer and is woken by it, and the runtime
	// samples one start in 8 (schedSamples): about 0.125 per record, and
	// well above 0 however the starts fall.
	if r.SchedSamplesPerRecord < 0.05 {
		t.Errorf("%.3f scheduler samples per record, want about 1/8 for the wake of each call's timer", r.SchedSamplesPerRecord)
	}
	if !a.closed.Load() {
		t.Error("appender not closed")
	}
}

// spinAppender burns at least cpu of the process's CPU time per call.
type spinAppender struct{ cpu time.Duration }

func (a spinAppender) Append(context.Context, [][]byte) error {
	for start := processCPU(); processCPU()-start < a.cpu; {
	}
	return nil
}

// The CPU column counts the process's CPU per record: an appender that
// burns 300 us of it per call is reported at no less than that.
func TestRunReportsCPUPerRecord(t *testing.T) {
	a := spinAppender{cpu: 300 * time.Microsecond}
	shape := Shape{Name: "one-in-flight", Clients: 1, InFlight: 1, Batch: 1}
	r, err := Run(context.Background(), func(int) (Appender, error) { return a, nil }, shape, RecordBytes, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(r)
	if r.Records == 0 || r.CPUPerRecord < a.cpu {
		t.Fatalf("%d records, %v CPU per record; want at least %v", r.Records, r.CPUPerRecord, a.cpu)
	}
}

func TestRunShapesInFlight(t *testing.T) {
	for _, shape := range Shapes {
		t.Run(shape.Name, func(t *testing.T) {
			var made atomic.Int64
			var appenders []*sleepAppender
			var mu sync.Mutex
			newAppender := func(int) (Appender, error) {
				made.Add(1)
				a := &sleepAppender{fast: time.Millisecond, slow: time.Millisecond, slowEvery: 1}
				mu.Lock()
				appenders = append(appenders, a)
				mu.Unlock()
				return a, nil
			}
			r, err := Run(context.Background(), newAppender, shape, RecordBytes, 100*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			if made.Load() != int64(shape.Clients) {
				t.Errorf("made %d appenders, want %d", made.Load(), shape.Clients)
			}
			if r.Records != r.Calls*shape.Batch {
				t.Errorf("records %d, calls %d, batch %d", r.Records, r.Calls, shape.Batch)
			}
			for i, a := range appenders {
				if a.maxOut > int64(shape.InFlight) {
					t.Errorf("client %d had %d records outstanding, shape allows %d", i, a.maxOut, shape.InFlight)
				}
			}
			// With 1ms calls for 100ms, the shape's concurrency is reached.
			if shape.InFlight > 1 && appenders[0].maxOut != int64(shape.InFlight) {
				t.Errorf("client 0 peaked at %d records outstanding, want %d", appenders[0].maxOut, shape.InFlight)
			}
		})
	}
}

func TestRunStopsOnError(t *testing.T) {
	boom := errors.New("boom")
	shape := Shape{Name: "x", Clients: 2, InFlight: 4, Batch: 2}
	_, err := Run(context.Background(), func(int) (Appender, error) { return failAppender{boom}, nil }, shape, RecordBytes, time.Minute)
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
}

type failAppender struct{ err error }

func (f failAppender) Append(context.Context, [][]byte) error { return f.err }

// RunRecords issues exactly the records asked (in whole calls, rounded up)
// when its time cap is not reached, and stops at the cap when it is.
func TestRunRecords(t *testing.T) {
	shape := Shape{Name: "x", Clients: 2, InFlight: 8, Batch: 4} // 4 calls at once
	for _, tc := range []struct {
		records, want int
	}{
		{records: 1, want: 4},
		{records: 100, want: 100},
		{records: 101, want: 104},
	} {
		var calls atomic.Int64
		newAppender := func(int) (Appender, error) {
			return countAppender{&calls}, nil
		}
		r, err := RunRecords(context.Background(), newAppender, shape, RecordBytes, tc.records, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if r.Records != tc.want || calls.Load()*int64(shape.Batch) != int64(tc.want) {
			t.Errorf("RunRecords(%d) = %d records in %d calls, want %d records", tc.records, r.Records, calls.Load(), tc.want)
		}
	}
	// A cap shorter than the records take: the run ends at the cap with
	// fewer records.
	a := &sleepAppender{fast: 5 * time.Millisecond, slow: 5 * time.Millisecond, slowEvery: 1}
	r, err := RunRecords(context.Background(), func(int) (Appender, error) { return a, nil }, shape, RecordBytes, 1_000_000, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if r.Records == 0 || r.Records >= 1_000_000 || r.Elapsed < 100*time.Millisecond {
		t.Errorf("capped at 100ms: %d records in %v, want some, fewer than asked, after the cap", r.Records, r.Elapsed)
	}
	if _, err := RunRecords(context.Background(), func(int) (Appender, error) { return a, nil }, shape, RecordBytes, 0, time.Second); err == nil {
		t.Error("RunRecords(0 records) succeeded, want an error")
	}
}

// countAppender counts its calls and returns at once.
type countAppender struct{ calls *atomic.Int64 }

func (a countAppender) Append(context.Context, [][]byte) error {
	a.calls.Add(1)
	return nil
}

// -bench.trace writes an execution trace of the measured window: a Run
// with WindowTrace set leaves a trace in the file (the runtime's header),
// and the trace has stopped when Run returns.
func TestRunWritesTheWindowsTrace(t *testing.T) {
	file := filepath.Join(t.TempDir(), "window.trace")
	defer func(prev string) { WindowTrace = prev }(WindowTrace)
	WindowTrace = file
	shape := Shape{Name: "one-in-flight", Clients: 1, InFlight: 1, Batch: 1}
	if _, err := Run(context.Background(), func(int) (Appender, error) { return spinAppender{cpu: 10 * time.Microsecond}, nil }, shape, RecordBytes, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("go 1.")) {
		t.Fatalf("%s holds %d bytes and no execution trace header (%q)", file, len(b), b[:min(len(b), 16)])
	}
	if trace.IsEnabled() {
		t.Fatal("the window's trace is still running after Run returned")
	}
}
