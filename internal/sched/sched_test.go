package sched

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestContendedSeesGoroutinesWaitingForAP: with one P and many goroutines
// ready to run, Contended says so; with none, it does not.
func TestContendedSeesGoroutinesWaitingForAP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					runtime.Gosched()
				}
			}
		})
	}
	seen := false
	for i := 0; i < 1000 && !seen; i++ {
		seen = Contended()
		runtime.Gosched()
	}
	close(stop)
	wg.Wait()
	if !seen {
		t.Fatal("Contended never reported contention with 16 goroutines yielding to each other on one P")
	}
	// Idle again: nothing waits for the P (bounded: the count is sampled).
	deadline := time.Now().Add(10 * time.Second)
	for Contended() {
		if time.Now().After(deadline) {
			t.Fatal("Contended still reports contention 10s after the goroutines ended")
		}
		time.Sleep(time.Millisecond)
	}
}
