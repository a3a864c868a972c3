package main

import (
	"strings"
	"testing"
)

const sample = `goos: linux
BenchmarkJetStream/one-in-flight-2   1   1.62 MB/s   0.5857 p50-ms   0.9554 p99-ms   5.002 p99.9-ms   1000 records/s   100 cpu-us/record   1 sched-samples/record
--- BENCH: BenchmarkJetStream/one-in-flight-2
BenchmarkTenure/one-in-flight-2      1   2.57 MB/s   0.3823 p50-ms   0.6829 p99-ms   1.527 p99.9-ms   2000 records/s
PASS
goos: linux
--- FAIL: BenchmarkJetStream/one-in-flight
BenchmarkTenure/one-in-flight-2      1   2.57 MB/s   0.3000 p50-ms   0.6000 p99-ms   1.527 p99.9-ms   2500 records/s
goos: linux
BenchmarkJetStream/one-in-flight-2   1   1.62 MB/s   0.5000 p50-ms   0.9000 p99-ms   5.002 p99.9-ms   1250 records/s   200 cpu-us/record   3 sched-samples/record
BenchmarkTenure/one-in-flight-2      1   2.57 MB/s   0.2000 p50-ms   0.5000 p99-ms   1.527 p99.9-ms   3000 records/s
`

func TestSummary(t *testing.T) {
	runs, err := parse(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	// The second run lost JetStream (it failed); the third has both.
	if len(runs) != 3 {
		t.Fatalf("%d runs, want 3: %v", len(runs), runs)
	}
	var out strings.Builder
	summarize(&out, runs)
	want := []string{
		// Lines without CPU and scheduler samples (an older harness) print none.
		"one-in-flight  JetStream    records/s 1000/1250 median 1125  p50 0.543 ms  p99 0.93 ms  per record 150 us CPU, 2.00 sched samples\n",
		"one-in-flight  Tenure       records/s 2000/2500/3000 median 2500  p50 0.300 ms  p99 0.60 ms  vs JetStream 2.00/2.40 median 2.20x\n",
	}
	for _, w := range want {
		if !strings.Contains(out.String(), w) {
			t.Errorf("summary lacks %q:\n%s", w, out.String())
		}
	}
}

func TestParseRejectsGarbledValues(t *testing.T) {
	if _, err := parse(strings.NewReader("BenchmarkTenure/x-2 1 abc records/s\n")); err == nil {
		t.Fatal("a garbled value parsed")
	}
	if _, err := parse(strings.NewReader("nothing here\n")); err == nil {
		t.Fatal("no results parsed without an error")
	}
}

// A system whose servers are processes of their own is compared with
// JetStream measured the same way, not with in-process JetStream.
func TestProcsCompareWithJetStreamProcs(t *testing.T) {
	checkSummary(t, `goos: linux
BenchmarkJetStream/one-in-flight-2       1   1000 records/s
BenchmarkJetStreamProcs/one-in-flight-2  1    400 records/s
BenchmarkTenure/one-in-flight-2          1   2000 records/s
BenchmarkTenureProcs/one-in-flight-2     1    600 records/s
`,
		"one-in-flight  JetStreamProcs records/s 400 median 400  p50 0.000 ms  p99 0.00 ms\n",
		"one-in-flight  Tenure       records/s 2000 median 2000  p50 0.000 ms  p99 0.00 ms  vs JetStream 2.00 median 2.00x\n",
		"one-in-flight  TenureProcs  records/s 600 median 600  p50 0.000 ms  p99 0.00 ms  vs JetStreamProcs 1.50 median 1.50x\n",
	)
}

// The many-range systems are compared with JetStream's and the floor's
// many-range runs of the same shape; syncs per record are summarized when
// the lines carry them.
func TestManyRangesCompareWithTheirFamily(t *testing.T) {
	checkSummary(t, `goos: linux
BenchmarkJetStream/64-clients-2                 1   1000 records/s
BenchmarkTenureManyRanges/100-ranges-2          1   3000 records/s   2.5 syncs/record
BenchmarkJetStreamManyRanges/100-ranges-2       1   1000 records/s   3 syncs/record
BenchmarkFloorManyRanges/100-ranges-2           1   6000 records/s   0.1 syncs/record
goos: linux
BenchmarkTenureManyRanges/100-ranges-2          1   4000 records/s   0.5 syncs/record
BenchmarkJetStreamManyRanges/100-ranges-2       1   1000 records/s   3 syncs/record
BenchmarkFloorManyRanges/100-ranges-2           1   5000 records/s   0.1 syncs/record
`,
		"100-ranges     TenureManyRanges records/s 3000/4000 median 3500  p50 0.000 ms  p99 0.00 ms, 1.500 syncs  vs JetStreamManyRanges 3.00/4.00 median 3.50x  vs FloorManyRanges 0.50/0.80 median 0.65x\n",
		"100-ranges     FloorManyRanges records/s 6000/5000 median 5500  p50 0.000 ms  p99 0.00 ms, 0.100 syncs  vs JetStreamManyRanges 6.00/5.00 median 5.50x\n",
		"100-ranges     JetStreamManyRanges records/s 1000/1000 median 1000  p50 0.000 ms  p99 0.00 ms, 3.000 syncs\n",
	)
}

// Every system is compared with each floor the run has: Floor and
// FloorKept, and each floor with the other.
func TestComparedWithBothFloors(t *testing.T) {
	checkSummary(t, `goos: linux
BenchmarkJetStream/256-in-flight-2   1   1000 records/s
BenchmarkFloor/256-in-flight-2       1   8000 records/s
BenchmarkFloorKept/256-in-flight-2   1   5000 records/s
BenchmarkTenure/256-in-flight-2      1   4000 records/s
`,
		"256-in-flight  Tenure       records/s 4000 median 4000  p50 0.000 ms  p99 0.00 ms  vs JetStream 4.00 median 4.00x  vs Floor 0.50 median 0.50x  vs FloorKept 0.80 median 0.80x\n",
		"256-in-flight  FloorKept    records/s 5000 median 5000  p50 0.000 ms  p99 0.00 ms  vs JetStream 5.00 median 5.00x  vs Floor 0.62 median 0.62x\n",
		"256-in-flight  Floor        records/s 8000 median 8000  p50 0.000 ms  p99 0.00 ms  vs JetStream 8.00 median 8.00x  vs FloorKept 1.60 median 1.60x\n",
		"256-in-flight  JetStream    records/s 1000 median 1000  p50 0.000 ms  p99 0.00 ms\n",
	)
}

// checkSummary summarizes the runs in input and checks that the summary
// holds each of the lines want.
func checkSummary(t *testing.T, input string, want ...string) {
	t.Helper()
	runs, err := parse(strings.NewReader(input))
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	summarize(&out, runs)
	for _, w := range want {
		if !strings.Contains(out.String(), w) {
			t.Errorf("summary lacks %q:\n%s", w, out.String())
		}
	}
}
