package bench

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// What idle ranges cost (issue 29). Before fetch sessions every range a
// replica follows ran its own long poll, re-asked every FetchWait (1 s)
// when nothing happened: a thousand idle ranges at RF 3 were two thousand
// polls a second between replicas. With sessions a follower holds one
// stream per leader replica and an idle range's pull is held until it has
// news: the streams' heartbeats are all that remain. This measures it as
// deployed: three `tenure replica` processes, the ranges' leaders spread
// evenly over them, nothing appended.
var idleRanges = flag.Int("bench.idle-ranges", 1000, "ranges BenchmarkIdleRangesProcs creates (30 under -race)")

// BenchmarkIdleRangesProcs reports, over -bench.duration with every range
// idle: the busiest replica process's CPU as a percentage of one core
// (max-cpu-%), the mean over the three (cpu-%), and the write system calls
// per second all three make (writes/s), and the fetch messages between
// them per second (msgs/s, from their metrics). The target (issue 29):
// under 2% of a core per process and fewer than 50 messages a second
// between replicas.
func BenchmarkIdleRangesProcs(b *testing.B) {
	n := *idleRanges
	if raceEnabled {
		// make bench-check runs every benchmark once to see it works;
		// a thousand ranges on race-built servers only take long.
		n = min(n, 30)
	}
	// Each replica serves its metrics, for the fetch messages it sent and
	// received: the messages between replicas, counted once each (by the
	// follower, which sends every pull and receives every answer).
	metricsPorts := freePorts(b, 3)
	c, pids := startTenureProcsWith(b, 3, func(i int) []string {
		return []string{"--metrics-listen", fmt.Sprintf("127.0.0.1:%d", metricsPorts[i])}
	})
	metricsURL := func(i int) string { return fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPorts[i]) }
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
		cpu0, w0, m0 := make([]time.Duration, len(pids)), make([]uint64, len(pids)), make([]float64, len(pids))
		for i, pid := range pids {
			cpu0[i], w0[i], m0[i] = procCPU(pid), procWrites(pid), fetchMessages(b, metricsURL(i))
		}
		t0 := time.Now()
		time.Sleep(*benchDuration)
		wall := time.Since(t0)
		var maxPct, sumPct, writes, msgs float64
		for i, pid := range pids {
			pct := 100 * float64(procCPU(pid)-cpu0[i]) / float64(wall)
			w := float64(procWrites(pid)-w0[i]) / wall.Seconds()
			m := (fetchMessages(b, metricsURL(i)) - m0[i]) / wall.Seconds()
			b.Logf("%s: %.2f%% of a core, %.0f writes/s, %.1f fetch messages/s sent and received", c.nodes[i].id, pct, w, m)
			maxPct, sumPct, writes, msgs = max(maxPct, pct), sumPct+pct, writes+w, msgs+m
		}
		b.ReportMetric(maxPct, "max-cpu-%")
		b.ReportMetric(sumPct/float64(len(pids)), "cpu-%")
		b.ReportMetric(writes, "writes/s")
		b.ReportMetric(msgs, "msgs/s")
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

// fetchMessages is the fetch messages a replica sent and received so far,
// from its metrics at url (tenure_replica_fetch_messages_*_total).
func fetchMessages(b *testing.B, url string) float64 {
	resp, err := http.Get(url)
	if err != nil {
		b.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		b.Fatalf("scrape %s: %v", url, err)
	}
	var sum float64
	found := 0
	for _, line := range strings.Split(string(body), "\n") {
		for _, name := range []string{"tenure_replica_fetch_messages_sent_total ", "tenure_replica_fetch_messages_received_total "} {
			if v, ok := strings.CutPrefix(line, name); ok {
				f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
				if err != nil {
					b.Fatalf("scrape %s: %q: %v", url, line, err)
				}
				sum += f
				found++
			}
		}
	}
	if found != 2 {
		b.Fatalf("scrape %s: the fetch message counters are missing (a tenure binary older than fetch sessions?)", url)
	}
	return sum
}
