package uring

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// opRead is IORING_OP_READ.
const opRead = 22

// read is read(2) of up to len(b) bytes of fd at its current position, on
// the ring: an operation that waits as long as the test likes. b must stay
// reachable until it returns.
func (r *Ring) read(fd int, b []byte) (int, error) {
	return r.submit(func(sqe []byte) {
		sqe[0] = opRead
		putU32(sqe, 4, uint32(int32(fd)))
		putU64(sqe, 8, ^uint64(0)) // offset -1: the file's position
		putU64(sqe, 16, uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))))
		putU32(sqe, 24, uint32(len(b)))
	})
}

// newRing returns a ring, or skips where the kernel refuses io_uring (the
// callers fall back to fdatasync there; nothing of the ring to test).
func newRing(t *testing.T) *Ring {
	t.Helper()
	r, err := New()
	if err != nil {
		t.Skipf("io_uring unavailable here: %v", err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func TestFdatasyncOnTheRing(t *testing.T) {
	r := newRing(t)
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Many goroutines at once: the ring takes one operation at a time, and
	// each caller gets its own completion.
	var wg sync.WaitGroup
	errs := make(chan error, 8*20)
	for g := range 8 {
		wg.Go(func() {
			for i := range 20 {
				if _, err := f.WriteAt([]byte("record"), int64(g*1000+i*10)); err != nil {
					errs <- err
					return
				}
				errs <- r.Fdatasync(int(f.Fd()))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestFdatasyncFailureIsTheErrno(t *testing.T) {
	r := newRing(t)
	// A descriptor that is not open: the kernel's answer, as fdatasync(2)
	// gives it.
	if err := r.Fdatasync(1 << 20); !errors.Is(err, unix.EBADF) || errors.Is(err, ErrRing) {
		t.Fatalf("Fdatasync(bad fd) = %v, want EBADF", err)
	}
	// A pipe cannot be synced: EINVAL, as from fdatasync(2).
	p := make([]int, 2)
	if err := unix.Pipe(p); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	want := unix.Fdatasync(p[1])
	if err := r.Fdatasync(p[1]); !errors.Is(err, want) || want == nil {
		t.Fatalf("Fdatasync(pipe) = %v, want %v as fdatasync(2) answers", err, want)
	}
	// The ring is still usable after failures.
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := r.Fdatasync(int(f.Fd())); err != nil {
		t.Fatal(err)
	}
}

func TestClosedRingRefuses(t *testing.T) {
	r := newRing(t)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := r.Fdatasync(0); !errors.Is(err, ErrRing) {
		t.Fatalf("Fdatasync after Close = %v, want %v", err, ErrRing)
	}
}

// TestWaiterParksInThePoller is why the ring exists: while an operation
// runs, the goroutine waiting for it is parked in the network poller ("IO
// wait"), its P free for other goroutines, not blocked in a system call
// ("syscall"), which would hold its P until sysmon takes it back. An
// fdatasync is too quick to look at, so the operation here is a read of
// an empty pipe, which waits until the test writes to it.
func TestWaiterParksInThePoller(t *testing.T) {
	r := newRing(t)
	p := make([]int, 2)
	if err := unix.Pipe(p); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	type result struct {
		n   int
		err error
	}
	buf := make([]byte, 16)
	done := make(chan result, 1)
	go func() {
		n, err := r.read(p[0], buf)
		runtime.KeepAlive(buf)
		done <- result{n, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	var state string
	for {
		state = waiterState()
		if state == "IO wait" || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if state != "IO wait" {
		t.Fatalf("the goroutine waiting on the ring is in state %q, want \"IO wait\" (parked in the poller)", state)
	}
	select {
	case r := <-done:
		t.Fatalf("the read returned before anything was written: %+v", r)
	default:
	}
	if _, err := unix.Write(p[1], []byte("hello")); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-done:
		if res.err != nil || string(buf[:res.n]) != "hello" {
			t.Fatalf("read on the ring = %q, %v; want \"hello\"", buf[:res.n], res.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the read on the ring did not complete within 10s of the write")
	}
}

// waiterState returns the state of the goroutine inside Ring.submit, as
// the runtime's goroutine dump shows it ("" when there is none).
func waiterState() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if !strings.Contains(g, "uring.(*Ring).submit") {
			continue
		}
		// "goroutine 7 [IO wait]:" or "goroutine 7 [IO wait, 2 minutes]:"
		head := g[:strings.IndexByte(g, '\n')]
		state := head[strings.IndexByte(head, '[')+1 : strings.LastIndexByte(head, ']')]
		state, _, _ = strings.Cut(state, ",")
		return state
	}
	return ""
}
