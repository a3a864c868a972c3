// Package uring runs fdatasync(2) through an io_uring, so that the goroutine
// waiting for it is parked in the network poller rather than blocked in a
// system call.
//
// Why: a goroutine in a blocking system call keeps its P (one of GOMAXPROCS
// slots to run Go code) until the runtime's sysmon notices and hands the P
// to another thread, which takes from 20 us to 10 ms. A replica's group
// commit spends 0.3 to several ms in each WAL fdatasync; on a 2-core box,
// with three replicas in one process (the benchmarks, make demo), their
// syncs held one of the two Ps often enough that runnable goroutines waited
// behind them: measured at 100 ranges, GOMAXPROCS=3 (an extra P to cover
// the held one) gave 13% more records/s than 2. Submitted to an io_uring,
// the fdatasync runs on a kernel worker thread, and the caller waits on an
// eventfd the ring signals, through the poller, with its P free. Measured
// with the bench module, five interleaved rounds against plain fdatasync:
// 1.19x the records/s at 100 ranges, at 256 in flight and with 64 clients
// (medians of per-round ratios); one append in flight within its noise.
// With the three replicas in processes of their own (two Ps each on the
// same two cores: Ps to spare) it changed nothing. Only busy processes
// sync on the ring (sched.Contended).
//
// The price is the wake-up. The eventfd read parks in the network poller,
// and when every P is busy the poller is polled only by sysmon, every 10
// ms at most: measured on 2026-12-07 (bench module, 2 saturated cores),
// the WAL sync a group commit waited for took 3-5 ms at 100 ranges and
// 30-40 ms at 1,000, where plain fdatasyncs took 0.6-0.9 ms. Yet the ring
// still won where it counts: plain fdatasync did 0.77x the records/s at
// 100 ranges and 0.8x with 64 clients over 1,000 ranges (1.11x at 1,000
// ranges, one producer each), three rounds alternating. Two ways to wake
// sooner were tried and dropped: the append path waking the waiter once
// the completion ring held its result (a channel send; 0.71-0.95x on every
// shape, and 14-27% more CPU per record), and the waiter yielding and
// looking again up to 2,000 times before it parks (0.90-1.09x, five rounds:
// within the noise).
//
// New fails where io_uring is unavailable (kernels before 5.6,
// io_uring_disabled, or a seccomp profile that refuses it, as Docker's
// default does from Docker 25 on; 20.10, on the CI machine, allows it);
// callers then call unix.Fdatasync themselves.
package uring

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The kernel ABI (include/uapi/linux/io_uring.h).
const (
	opFsync         = 3 // IORING_OP_FSYNC
	fsyncDatasync   = 1 // IORING_FSYNC_DATASYNC
	offSQRing       = 0
	offCQRing       = 0x8000000
	offSQEs         = 0x10000000
	registerEventfd = 4 // IORING_REGISTER_EVENTFD
	sqeSize         = 64
	cqeSize         = 16
	ringEntries     = 2 // one operation in flight at a time (mu)
	maxEnterRetries = 100
)

// sqringOffsets and cqringOffsets are struct io_sqring_offsets and
// io_cqring_offsets; params is struct io_uring_params.
type sqringOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type cqringOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

type params struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFD uint32
	resv                                                                   [3]uint32
	sqOff                                                                  sqringOffsets
	cqOff                                                                  cqringOffsets
}

// Ring is one io_uring with an eventfd the kernel signals on every
// completion. Its methods may be called from any goroutine; operations run
// one at a time.
type Ring struct {
	mu sync.Mutex
	fd int
	// broken is why the ring takes no more operations (it was closed, or
	// failed), wrapping ErrRing; nil while it works.
	broken   error
	released bool
	ev       *os.File // the eventfd, non-blocking: reads park in the poller
	seq      uint64   // user_data of the last submission

	sqRing, cqRing, sqes []byte
	p                    params
}

// New sets up a ring, or says why io_uring cannot be used here.
func New() (*Ring, error) {
	var p params
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, ringEntries, uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	r := &Ring{fd: int(fd), p: p}
	ok := false
	defer func() {
		if !ok {
			r.release()
		}
	}()
	var err error
	prot, flags := unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE
	if r.sqRing, err = unix.Mmap(r.fd, offSQRing, int(p.sqOff.array+p.sqEntries*4), prot, flags); err != nil {
		return nil, fmt.Errorf("mmap io_uring submission ring: %w", err)
	}
	if r.cqRing, err = unix.Mmap(r.fd, offCQRing, int(p.cqOff.cqes+p.cqEntries*cqeSize), prot, flags); err != nil {
		return nil, fmt.Errorf("mmap io_uring completion ring: %w", err)
	}
	if r.sqes, err = unix.Mmap(r.fd, offSQEs, int(p.sqEntries*sqeSize), prot, flags); err != nil {
		return nil, fmt.Errorf("mmap io_uring submission entries: %w", err)
	}
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	// os.NewFile registers a non-blocking descriptor with the poller.
	r.ev = os.NewFile(uintptr(efd), "io_uring-eventfd")
	efd32 := int32(efd)
	if _, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), registerEventfd, uintptr(unsafe.Pointer(&efd32)), 1, 0, 0); errno != 0 {
		return nil, fmt.Errorf("io_uring_register eventfd: %w", errno)
	}
	ok = true
	return r, nil
}

// Fdatasync is fdatasync(2) of fd, run by the kernel on the ring: the same
// call (vfs_fsync_range, data only), the same errors.
func (r *Ring) Fdatasync(fd int) error {
	_, err := r.submit(func(sqe []byte) {
		sqe[0] = opFsync
		putU32(sqe, 4, uint32(int32(fd)))
		putU32(sqe, 28, fsyncDatasync)
	})
	return err
}

// ErrRing wraps every failure of the ring itself, as opposed to the errno
// an operation completed with: the ring was closed, or could not submit
// or wait (the ring is then unusable, and every later call fails with it
// too). The operation may not have run; the caller makes the system call
// itself instead.
var ErrRing = errors.New("uring: ring unusable")

// submit runs one operation, filled in by fill, and returns its result
// once it completed, or the errno it failed with.
func (r *Ring) submit(fill func(sqe []byte)) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.broken != nil {
		return 0, r.broken
	}
	r.seq++
	tail := r.u32(r.sqRing, r.p.sqOff.tail)
	idx := atomic.LoadUint32(tail) & atomic.LoadUint32(r.u32(r.sqRing, r.p.sqOff.ringMask))
	sqe := r.sqes[idx*sqeSize : (idx+1)*sqeSize]
	clear(sqe)
	fill(sqe)
	putU64(sqe, 32, r.seq) // user_data
	*r.u32(r.sqRing, r.p.sqOff.array+4*idx) = idx
	// The kernel reads the entry after it sees the new tail.
	atomic.StoreUint32(tail, atomic.LoadUint32(tail)+1)
	for tries := 0; ; tries++ {
		n, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), 1, 0, 0, 0, 0)
		if errno == 0 && n == 1 {
			break
		}
		if (errno == unix.EINTR || errno == unix.EAGAIN || errno == unix.EBUSY) && tries < maxEnterRetries {
			continue
		}
		if errno == 0 {
			errno = unix.EIO
		}
		// Whether the kernel took the entry is unknown: nothing more
		// goes through this ring.
		r.broken = fmt.Errorf("%w: io_uring_enter: %w", ErrRing, errno)
		return 0, r.broken
	}
	head, ctail := r.u32(r.cqRing, r.p.cqOff.head), r.u32(r.cqRing, r.p.cqOff.tail)
	mask := atomic.LoadUint32(r.u32(r.cqRing, r.p.cqOff.ringMask))
	var buf [8]byte
	for {
		h := atomic.LoadUint32(head)
		if h != atomic.LoadUint32(ctail) {
			cqe := r.cqRing[r.p.cqOff.cqes+(h&mask)*cqeSize:]
			userData := *(*uint64)(unsafe.Pointer(&cqe[0]))
			result := *(*int32)(unsafe.Pointer(&cqe[8]))
			atomic.StoreUint32(head, h+1)
			if userData != r.seq {
				continue // an earlier operation's (cannot happen: one at a time)
			}
			if result < 0 {
				return 0, unix.Errno(-result)
			}
			return int(result), nil
		}
		// Parks in the poller until the kernel posts a completion. A
		// completion posted since the check above has already raised
		// the counter, so this read returns at once.
		if _, err := r.ev.Read(buf[:]); err != nil {
			r.broken = fmt.Errorf("%w: io_uring eventfd: %w", ErrRing, err)
			return 0, r.broken
		}
	}
}

// u32 points at the 32-bit word at off in ring.
func (r *Ring) u32(ring []byte, off uint32) *uint32 {
	return (*uint32)(unsafe.Pointer(&ring[off]))
}

func putU32(b []byte, off int, v uint32) { *(*uint32)(unsafe.Pointer(&b[off])) = v }
func putU64(b []byte, off int, v uint64) { *(*uint64)(unsafe.Pointer(&b[off])) = v }

// Close releases the ring. Calls after it fail with ErrRing; a call in
// progress ends first.
func (r *Ring) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.released {
		return nil
	}
	r.released = true
	r.broken = fmt.Errorf("%w: closed", ErrRing)
	return r.release()
}

func (r *Ring) release() error {
	var errs []error
	for _, m := range [][]byte{r.sqes, r.cqRing, r.sqRing} {
		if m != nil {
			errs = append(errs, unix.Munmap(m))
		}
	}
	if r.ev != nil {
		errs = append(errs, r.ev.Close())
	}
	errs = append(errs, unix.Close(r.fd))
	return errors.Join(errs...)
}
