package logstore_test

import (
	"context"
	"runtime"
	"testing"

	"github.com/tenurelog/tenure/services/replica/logstore"
)

// BenchmarkAppendParallel measures the leader's append path under ~64
// concurrent appenders, each appending one 1 KiB record and waiting for it
// to be durable: the group commit's throughput. Run with
//
//	go test -run XXX -bench AppendParallel -benchtime 20000x ./services/replica/logstore/
func BenchmarkAppendParallel(b *testing.B) {
	s, err := logstore.Open(b.TempDir(), logstore.Options{Logger: testLogger(b)})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	r, err := s.CreateRange("bench")
	if err != nil {
		b.Fatal(err)
	}
	lead(b, r, 1)
	value := make([]byte, 1024)
	// RunParallel starts parallelism*GOMAXPROCS goroutines.
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
	before := s.Stats()
	b.SetBytes(int64(len(value)))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			base, err := r.Append(1, false, [][]byte{value})
			if err != nil {
				b.Error(err)
				return
			}
			if err := r.WaitDurable(ctx, base+1); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	after := s.Stats()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(after.Syncs-before.Syncs)/float64(b.N), "syncs/op")
	b.ReportMetric(float64(after.Commits-before.Commits)/float64(b.N), "commits/op")
}

// BenchmarkDurableAppendThreeStores is the storage half of one append in
// flight on a 3-replica range whose replicas share a disk (as the bench
// module's do): three stores, one appender each, every op appending one
// 1 KiB record to each store at once and waiting until all three are
// durable. ns/op is the round; CPU per round comes from -cpuprofile or
// time(1). Run with
//
//	go test -run XXX -bench DurableAppendThreeStores -benchtime 2000x ./services/replica/logstore/
func BenchmarkDurableAppendThreeStores(b *testing.B) {
	ranges := make([]*logstore.Range, 3)
	for i := range ranges {
		s, err := logstore.Open(b.TempDir(), logstore.Options{Logger: testLogger(b)})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		if ranges[i], err = s.CreateRange("bench"); err != nil {
			b.Fatal(err)
		}
		lead(b, ranges[i], 1)
	}
	value := make([]byte, 1024)
	ctx := context.Background()
	errs := make(chan error, len(ranges))
	b.SetBytes(int64(len(value)))
	for b.Loop() {
		for _, r := range ranges {
			go func() {
				base, err := r.Append(1, false, [][]byte{value})
				if err == nil {
					err = r.WaitDurable(ctx, base+1)
				}
				errs <- err
			}()
		}
		for range ranges {
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		}
	}
}
