package replica_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// Many clients with one append each in flight: the followers receive their
// appends in fetch answers of whatever size the bursts make, and write them
// with commits that run on their own goroutines or on the writer's
// (logstore's writeInline). Every append is acknowledged at its own offset,
// once, and all three logs end up the same, byte for byte. A lone producer
// afterwards is acknowledged as before.
func TestBurstsOfAppendsFromManyClients(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	const clients, each = 32, 15
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var (
		mu    sync.Mutex
		bases []uint64
		wg    sync.WaitGroup
	)
	for i := range clients {
		wg.Go(func() {
			for k := range each {
				a, err := c.append(ctx, r1, fmt.Appendf(nil, "c%d-%d", i, k))
				if err != nil {
					t.Errorf("client %d append %d: %v", i, k, err)
					return
				}
				if a.GetHighWaterMark() <= a.GetBaseOffset() {
					t.Errorf("append at %d acknowledged with HWM %d", a.GetBaseOffset(), a.GetHighWaterMark())
				}
				mu.Lock()
				bases = append(bases, a.GetBaseOffset())
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	slices.Sort(bases)
	for i, b := range bases {
		// Offset 0 is the epoch-start record.
		if want := uint64(i + 1); b != want {
			t.Fatalf("acknowledged offsets: position %d is %d, want %d (each append once, no gaps)", i, b, want)
		}
	}
	for k := range 5 {
		c.mustAppend(r1, fmt.Appendf(nil, "alone-%d", k))
	}
	c.waitCaughtUp(r1, r2, r3)
	c.sameLogs(c.storeLog(r1), r2, r3)
}
