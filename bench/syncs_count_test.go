package bench

import (
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
)

// TestProcessSyncs checks the syncs/record counter against calls this test
// makes itself: fdatasyncs and fsyncs from many goroutines, half of them
// locked to threads of their own, so that threads created after the
// counters were opened (which only inheritance covers) make some of them.
// Each must be counted once, none twice.
func TestProcessSyncs(t *testing.T) {
	if _, err := processSyncs(); err != nil {
		// Counting needs tracefs and the right to open tracepoint
		// counters (root or CAP_PERFMON); the benchmarks then report
		// syncs as unavailable. Nothing here to check without them.
		t.Skipf("sync counters unavailable here: %v", err)
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	before, err := processSyncs()
	if err != nil {
		t.Fatal(err)
	}
	const goroutines, each = 16, 5
	var wg sync.WaitGroup
	errs := make(chan error, goroutines*each)
	for g := range goroutines {
		wg.Go(func() {
			if g%2 == 0 {
				// Exiting while locked ends the thread: the runtime
				// makes new ones for the goroutines that follow, whose
				// calls only an inherited counter sees; the ended
				// thread's count must stay counted.
				runtime.LockOSThread()
			}
			for i := range each {
				var err error
				if i%2 == 0 {
					err = syscall.Fdatasync(int(f.Fd()))
				} else {
					err = syscall.Fsync(int(f.Fd()))
				}
				if err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	after, err := processSyncs()
	if err != nil {
		t.Fatal(err)
	}
	// Nothing else in this test binary syncs while tests run one at a time.
	if got := after - before; got != goroutines*each {
		t.Fatalf("counted %d syncs, made %d", got, goroutines*each)
	}
}
