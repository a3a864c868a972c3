package replica_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// BenchmarkAppend3 appends 1 KiB records to a leader replicating to two
// followers, three real replicas on loopback, each with its own Badger. An
// op is one record. Shapes:
//
//   - inflight=1: one client, one single-record append at a time: the
//     latency of a commit (leader write, follower fetch, write and fsync,
//     ack fetch, HWM).
//   - inflight=256: one pipelined client keeping 256 records outstanding,
//     as 8 concurrent batches of 32.
//   - clients=64: 64 independent clients with one single-record append each
//     in flight, sharing fsyncs through group commit.
//
// Reported: records/s, MB/s (of values) and append latency percentiles.
func BenchmarkAppend3(b *testing.B) {
	c := newCluster(b, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	value := make([]byte, 1024)
	for i := range value {
		value[i] = byte(i)
	}

	run := func(b *testing.B, workers, batch int) {
		batches := max(1, b.N/batch)
		var (
			mu   sync.Mutex
			lats []time.Duration
			next int
		)
		vals := make([][]byte, batch)
		for i := range vals {
			vals[i] = value
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		b.SetBytes(int64(len(value)))
		b.ResetTimer()
		start := time.Now()
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				mine := make([]time.Duration, 0, batches/workers+1)
				defer func() {
					mu.Lock()
					lats = append(lats, mine...)
					mu.Unlock()
				}()
				for {
					mu.Lock()
					if next == batches {
						mu.Unlock()
						return
					}
					next++
					mu.Unlock()
					t0 := time.Now()
					if _, err := c.append(ctx, r1, vals...); err != nil {
						b.Errorf("append: %v", err)
						return
					}
					mine = append(mine, time.Since(t0))
				}
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		b.StopTimer()
		records := float64(batches * batch)
		b.ReportMetric(records/elapsed.Seconds(), "records/s")
		b.ReportMetric(records*float64(len(value))/elapsed.Seconds()/1e6, "MB/s")
		slices.Sort(lats)
		pct := func(p float64) float64 {
			if len(lats) == 0 {
				return 0
			}
			i := min(len(lats)-1, int(p*float64(len(lats))))
			return float64(lats[i].Microseconds()) / 1000
		}
		b.ReportMetric(pct(0.50), "p50-ms")
		b.ReportMetric(pct(0.99), "p99-ms")
		b.ReportMetric(pct(0.999), "p99.9-ms")
	}

	b.Run("inflight=1", func(b *testing.B) { run(b, 1, 1) })
	b.Run("inflight=256", func(b *testing.B) { run(b, 8, 32) })
	b.Run("clients=64", func(b *testing.B) { run(b, 64, 1) })
}
