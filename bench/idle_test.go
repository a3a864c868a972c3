package bench

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// What idle ranges cost (issue 29): every range a replica follows runs its
// own fetch loop, a long poll re-asked every FetchWait (1 s) when nothing
// happens, so a thousand idle ranges at RF 3 are two thousand polls a
// second between replicas, each with its own wake-ups. This measures it as
// deployed: three `tenure replica` processes, the ranges' leaders spread
// evenly over them, nothing appended.
var idleRanges = flag.Int("bench.idle-ranges", 1000, "ranges BenchmarkIdleRangesProcs creates (30 under -race)")

// BenchmarkIdleRangesProcs reports, over -bench.duration with every range
// idle: the busiest replica process's CPU as a percentage of one core
// (max-cpu-%), the mean over the three (cpu-%), and the write system calls
// per second all three make (writes/s). Idle replicas write no records, so
// nearly every write is a message on a socket: a fetch asked or answered.
// The target (issue 29): under 2% of a core per process and fewer than 50
// messages a second between replicas.
func BenchmarkIdleRangesProcs(b *testing.B) {
	n := *idleRanges
	if raceEnabled {
		// make bench-check runs every benchmark once to see it works;
		// a thousand ranges on race-built servers only take long.
		n = min(n, 30)
	}
	c, pids := startTenureProcs(b, 3)
	ctx, cancel := context.WithTimeout(b.Context(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	if err := adoptIdleRanges(ctx, c, n); err != nil {
		b.Fatal(err)
	}
	b.Logf("%d ranges adopted in %v (leaders spread over %d replicas)", n, time.Since(start).Round(time.Millisecond), len(c.nodes))
	// Let every follower loop make its first fetch and settle into its
	// long poll before measuring.
	time.Sleep(3 * time.Second)
	for b.Loop() {
		cpu0, w0 := make([]time.Duration, len(pids)), make([]uint64, len(pids))
		for i, pid := range pids {
			cpu0[i], w0[i] = procCPU(pid), procWrites(pid)
		}
		t0 := time.Now()
		time.Sleep(*benchDuration)
		wall := time.Since(t0)
		var maxPct, sumPct, writes float64
		for i, pid := range pids {
			pct := 100 * float64(procCPU(pid)-cpu0[i]) / float64(wall)
			w := float64(procWrites(pid)-w0[i]) / wall.Seconds()
			b.Logf("%s: %.2f%% of a core, %.0f writes/s", c.nodes[i].id, pct, w)
			maxPct, sumPct, writes = max(maxPct, pct), sumPct+pct, writes+w
		}
		b.ReportMetric(maxPct, "max-cpu-%")
		b.ReportMetric(sumPct/float64(len(pids)), "cpu-%")
		b.ReportMetric(writes, "writes/s")
		b.ReportMetric(float64(n), "ranges")
	}
}

// adoptIdleRanges creates n ranges idle-0..idle-(n-1), range i led by node
// i mod 3, by a few workers in parallel (each range is six calls).
func adoptIdleRanges(ctx context.Context, c *tenureCluster, n int) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				if err := c.adoptRange(ctx, fmt.Sprintf("idle-%d", i), i%len(c.nodes)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs // nil when no worker failed
}

// procWrites is how many write system calls process pid made so far
// (syscw in /proc/PID/io: write, writev, sendmsg and the like), or 0 if it
// cannot be read.
func procWrites(pid int) uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("syscw: ")); ok {
			n, _ := strconv.ParseUint(string(v), 10, 64)
			return n
		}
	}
	return 0
}
