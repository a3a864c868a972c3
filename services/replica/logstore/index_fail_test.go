package logstore_test

import (
	"errors"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tenurelog/tenure/services/replica/logstore"
)

// TestIndexFailureWithATakenBatchFailsItsAppends: when an index write fails
// the store (an EIO from a segment write) while the writer holds a batch,
// the batch's appends must fail and Close must return. When the writer also
// indexed, it once returned holding the writer role: those appends never
// returned and Close waited forever (seen as a hang of
// TestRandomizedPowerLossWithConcurrentClients). The indexer is a goroutine
// of its own now (indexLoop), and the same must hold of it.
func TestIndexFailureWithATakenBatchFailsItsAppends(t *testing.T) {
	o := newOpener(t)
	s := o.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	appendN(t, r, 1, 10)

	restore := logstore.SetSegmentWriteFault(func(uint32) error { return syscall.EIO })
	defer restore()
	// Appends from many goroutines until the store fails: the index comes
	// due every indexDelay (25 ms) while the queue is rarely empty, so the
	// writer holds a batch when the indexer's write fails, again and again.
	var wg sync.WaitGroup
	done := make(chan struct{})
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5000; i++ {
				if _, err := r.Append(1, false, [][]byte{value("g", uint64(g*10000+i))}); err != nil {
					if !errors.Is(err, logstore.ErrFailed) {
						t.Errorf("Append after the index failed = %v, want ErrFailed", err)
					}
					return
				}
			}
		}()
	}
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("appends did not all return within 30s after the index write failed the store")
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close() did not return within 30s after the index write failed the store")
	}
}
