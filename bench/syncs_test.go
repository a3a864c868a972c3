package bench

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Counting this process's fsync(2) and fdatasync(2) calls, for the
// syncs/record metric (issue 29): what a system pays in flushes per
// acknowledged record, the same way for every system in the process,
// tenure, JetStream or the floor, without asking any of them. Go programs
// make system calls directly, so nothing can be interposed in the process;
// /proc counts no syncs. The kernel can: a perf counter on the
// syscalls:sys_enter_fsync and sys_enter_fdatasync tracepoints, one per
// thread of the process, each inherited by every thread that thread
// creates afterwards. A counting tracepoint costs an increment per call,
// nothing that moves the measurement. It needs tracefs and the right to
// open tracepoint counters (root or CAP_PERFMON); without them the metric
// is reported unavailable, never guessed.

// syncTracepoints are what is counted, as "subsystem/event": the two
// system calls that flush a file's data (fsync also its metadata), and the
// requests submitted to an io_uring, where tenure's WAL sends its
// fdatasyncs when the process is busy (package internal/uring): those run
// on a kernel worker, not through a system call. An fsync is the only
// request tenure submits, and no other system here uses io_uring. msync
// and sync_file_range are not counted: neither system here flushes a log
// with them on the append path (the logstore fsyncs Badger's files itself
// rather than msync them).
var syncTracepoints = []string{"syscalls/sys_enter_fdatasync", "syscalls/sys_enter_fsync", "io_uring/io_uring_submit_req"}

// countSyncs turns the counters off: each inherited counter is switched
// in and out with its thread on every context switch, which is not
// nothing next to a one-in-flight append (measured here: about 10% fewer
// records/s with them on). A run comparing only records/s may switch them
// off; syncs/record is then reported unavailable.
var countSyncs = flag.Bool("bench.syncs", true, "count fsync/fdatasync calls with perf tracepoint counters (syncs/record)")

var procSyncs struct {
	once sync.Once
	fds  []int
	err  error
}

// processSyncs is how many fsync and fdatasync calls this process made
// since the counters were opened (at the first call), or the reason they
// cannot be counted. It includes the calls of every process started after
// that, while it runs and once it has exited: a child task, thread or
// process, inherits its parent thread's counters, and a counter's value
// includes its inheritors' (a fork copies them, exec keeps them).
// startServer opens the counters before it starts a server.
func processSyncs() (uint64, error) {
	procSyncs.once.Do(func() {
		if !*countSyncs {
			procSyncs.err = errors.New("not counted: -bench.syncs=false")
			return
		}
		procSyncs.fds, procSyncs.err = openSyncCounters()
	})
	if procSyncs.err != nil {
		return 0, procSyncs.err
	}
	var total uint64
	var buf [8]byte
	for _, fd := range procSyncs.fds {
		// read_format 0: the value alone. An inherited counter's value
		// includes the threads that inherited it, live or exited.
		if n, err := unix.Read(fd, buf[:]); err != nil || n != len(buf) {
			return 0, fmt.Errorf("read perf counter: %d bytes, %v", n, err)
		}
		total += binary.NativeEndian.Uint64(buf[:])
	}
	return total, nil
}

// openSyncCounters opens a counter per counted tracepoint on every thread
// of the process, each inherited by the threads that thread creates later.
// Every thread is then counted exactly once if no thread was created while
// the counters were being opened: one created by a thread whose counter
// was not open yet inherits nothing, and one created by a thread whose
// counter was open would be counted twice if opened again. So the thread
// list is read before and after; if it changed, everything is closed and
// tried again (bounded).
func openSyncCounters() ([]int, error) {
	var ids []uint64
	for _, ev := range syncTracepoints {
		id, err := tracepointID(ev)
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	for range 20 {
		tids, err := threads()
		if err != nil {
			return nil, err
		}
		var fds []int
		for _, tid := range tids {
			for _, id := range ids {
				fd, err := openTracepoint(id, tid, unix.PerfBitInherit)
				if errors.Is(err, unix.ESRCH) {
					continue // the thread exited; so did its calls' chance to be missed
				}
				if err != nil {
					closeAll(fds)
					return nil, fmt.Errorf("perf_event_open tracepoint %d on thread %d: %w", id, tid, err)
				}
				fds = append(fds, fd)
			}
		}
		after, err := threads()
		if err != nil {
			closeAll(fds)
			return nil, err
		}
		if slices.Equal(tids, after) {
			return fds, nil
		}
		closeAll(fds)
	}
	return nil, errors.New("the process kept creating threads while its sync counters were opened")
}

// openTracepoint opens a counter of tracepoint id on thread tid (0: the
// calling thread) with the attribute bits given.
func openTracepoint(id uint64, tid int, bits uint64) (int, error) {
	attr := unix.PerfEventAttr{
		Type:   unix.PERF_TYPE_TRACEPOINT,
		Size:   uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
		Config: id,
		Bits:   bits,
	}
	return unix.PerfEventOpen(&attr, tid, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
}

func closeAll(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

// tracepointID reads the id of a tracepoint, "subsystem/event", from
// tracefs (mounted at /sys/kernel/tracing, or under debugfs on older
// systems).
func tracepointID(event string) (uint64, error) {
	var errs []error
	for _, root := range []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"} {
		b, err := os.ReadFile(filepath.Join(root, "events", event, "id"))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	}
	// tracefs is often not mounted until something asks for it (perf
	// mounts it on first use); mounting it is the operator's call.
	return 0, fmt.Errorf("tracepoint %s (is tracefs mounted? mount -t tracefs nodev /sys/kernel/tracing): %w", event, errors.Join(errs...))
}

// threads lists the process's thread ids, ascending.
func threads() ([]int, error) {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, err
	}
	tids := make([]int, 0, len(ents))
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	slices.Sort(tids)
	return tids, nil
}
