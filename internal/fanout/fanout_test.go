package fanout

import (
	"sync"
	"testing"
	"time"
)

// Every index runs exactly once, and never more than limit at a time.
func TestRunBoundsConcurrencyAndRunsEachOnce(t *testing.T) {
	for _, limit := range []int{0, 1, 3, 100} {
		const n = 50
		var mu sync.Mutex
		running, peak := 0, 0
		seen := make([]int, n)
		Run(n, limit, func(i int) {
			mu.Lock()
			running++
			peak = max(peak, running)
			seen[i]++
			mu.Unlock()
			time.Sleep(time.Millisecond) // let others overlap if they may
			mu.Lock()
			running--
			mu.Unlock()
		})
		if want := min(max(limit, 1), n); peak > want {
			t.Errorf("limit %d: %d calls ran at once, want at most %d", limit, peak, want)
		}
		for i, c := range seen {
			if c != 1 {
				t.Fatalf("limit %d: index %d ran %d times, want 1", limit, i, c)
			}
		}
	}
}
