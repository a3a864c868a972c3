package bench

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tenurelog/tenure/internal/uring"
)

// TestProcessSyncs checks the syncs/record counter against calls this test
// makes itself: fdatasyncs and fsyncs from many goroutines, half of them
// locked to threads of their own, so that threads created after the
// counters were opened (which only inheritance covers) make some of them.
// Each must be counted once, none twice.
func TestProcessSyncs(t *testing.T) {
	skipWithoutSyncCounters(t)
	dir := t.TempDir()
	before, err := processSyncs()
	if err != nil {
		t.Fatal(err)
	}
	if err := makeSyncs(dir); err != nil {
		t.Fatal(err)
	}
	after, err := processSyncs()
	if err != nil {
		t.Fatal(err)
	}
	// Nothing else in this test binary syncs while tests run one at a time.
	if got := after - before; got != syncsMade {
		t.Fatalf("counted %d syncs, made %d", got, syncsMade)
	}
}

// skipWithoutSyncCounters skips t where sync counters cannot be opened.
// It opens one on this thread and closes it, leaving the process's
// counters to whatever the test does first.
func skipWithoutSyncCounters(t *testing.T) {
	t.Helper()
	if err := probeSyncCounter(); err != nil {
		// Counting needs tracefs and the right to open tracepoint
		// counters (root or CAP_PERFMON); the benchmarks then report
		// syncs as unavailable. Nothing here to check without them.
		t.Skipf("sync counters unavailable here: %v", err)
	}
}

func probeSyncCounter() error {
	if !*countSyncs {
		return errors.New("not counted: -bench.syncs=false")
	}
	id, err := tracepointID(syncTracepoints[0])
	if err != nil {
		return err
	}
	fd, err := openTracepoint(id, 0, 0)
	if err != nil {
		return fmt.Errorf("perf_event_open tracepoint %d: %w", id, err)
	}
	return unix.Close(fd)
}

// syncsMade is how many syncs makeSyncs makes.
const syncsMade = 16 * 5

// makeSyncs makes syncsMade fdatasyncs and fsyncs of a file in dir from
// many goroutines, half of them locked to threads of their own, so that
// threads created after the counters were opened (which only inheritance
// covers) make some of them.
func makeSyncs(dir string) error {
	f, err := os.Create(filepath.Join(dir, "f"))
	if err != nil {
		return err
	}
	defer f.Close()
	const goroutines, each = 16, 5
	// A third of the syncs go through an io_uring, as tenure's WAL sends
	// them when the process is busy, where the kernel allows one.
	ring, err := uring.New()
	if err == nil {
		defer ring.Close()
	}
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
				switch {
				case i%3 == 2 && ring != nil:
					err = ring.Fdatasync(int(f.Fd()))
				case i%3 == 1:
					err = syscall.Fsync(int(f.Fd()))
				default:
					err = syscall.Fdatasync(int(f.Fd()))
				}
				if err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs // nil once closed and empty
}

// syncHelperEnv makes this test binary a server stand-in for
// TestServerProcessSyncs (see init): it waits for the file "go" in the
// directory the variable names, makes syncsMade syncs there, writes the
// file "done", and exits 0 at SIGTERM, as a server stops.
const syncHelperEnv = "TENURE_BENCH_SYNC_HELPER_DIR"

func init() {
	dir := os.Getenv(syncHelperEnv)
	if dir == "" {
		return
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	if err := waitForFile(filepath.Join(dir, "go")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := makeSyncs(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := os.WriteFile(filepath.Join(dir, "done"), nil, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	<-term
	os.Exit(0)
}

// waitForFile waits, bounded, until path exists.
func waitForFile(path string) error {
	for range 3000 { // 30 s
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("%s did not appear within 30s", path)
}

// serverSyncsAloneEnv marks the process TestServerProcessSyncs runs itself
// in.
const serverSyncsAloneEnv = "TENURE_BENCH_SERVER_SYNCS_ALONE"

// TestServerProcessSyncs checks that syncs/record counts the syncs of a
// server process started by startServer (the ...Procs benchmarks) exactly
// once: a stand-in server makes a known number of syncs, from threads
// created both before and after it started. It runs in a process of its
// own, where no counter is open yet (TestProcessSyncs opens this one's),
// so it also checks that startServer opens the counters before it starts
// the server: opened after, they would miss it.
func TestServerProcessSyncs(t *testing.T) {
	skipWithoutSyncCounters(t)
	if os.Getenv(serverSyncsAloneEnv) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestServerProcessSyncs$", "-test.v")
		cmd.Env = append(os.Environ(), serverSyncsAloneEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("--- PASS: TestServerProcessSyncs")) {
			t.Fatalf("TestServerProcessSyncs in a process of its own: %v\n%s", err, out)
		}
		return
	}
	if procSyncs.fds != nil || procSyncs.err != nil {
		t.Fatal("this process's sync counters are open already: the test would not see whether startServer opens them")
	}
	dir := t.TempDir()
	t.Setenv(syncHelperEnv, dir) // for the child only: this process's init has run
	startServer(t, dir, os.Args[0], "-test.run=^$")

	before, err := syncsCounter.read()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := waitForFile(filepath.Join(dir, "done")); err != nil {
		t.Fatalf("the stand-in server: %v; its log:\n%s", err, readLog(dir))
	}
	after, err := syncsCounter.read()
	if err != nil {
		t.Fatal(err)
	}
	// Read while the server still runs, as a benchmark reads its counters.
	if got := after - before; got != syncsMade {
		t.Fatalf("counted %d syncs, the server made %d", got, syncsMade)
	}
}

func readLog(dir string) []byte {
	b, _ := os.ReadFile(filepath.Join(dir, "server.log"))
	return b
}
