// Package fanout runs a bounded number of calls at once: the batched
// lease and replica handlers, and tenurectl's status of many ranges.
package fanout

import "sync"

// Run runs f(0..n-1), at most limit at a time (limit < 1 means 1), and
// returns once every call has returned.
func Run(n, limit int, f func(i int)) {
	sem := make(chan struct{}, max(limit, 1))
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			f(i)
		})
	}
	wg.Wait()
}
