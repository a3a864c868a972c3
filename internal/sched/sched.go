// Package sched tells whether the Go scheduler has more work than Ps, for
// code that chooses between waiting and working differently when it has.
//
// A replica process on a loaded box is often in that state: at 100 ranges
// on two cores, at least GOMAXPROCS goroutines were waiting for a P at the
// start of 97% of WAL syncs. Two choices follow from it: the WAL syncs
// through an io_uring, so that no P is held in fdatasync (package uring,
// services/replica/logstore/wal.go), and a fetch session's sender yields
// once before it builds a message, so that the answers about to be ready
// share it (services/replica/session.go). On an idle process both choices
// would only add latency, so both depend on Contended.
package sched

import (
	"runtime"
	"runtime/metrics"
	"sync"
)

// runnable is the runtime's count of goroutines ready to run and waiting
// for a P. Reading it costs about 100 ns (per-P counters, not a walk of
// every goroutine); runnableMu guards the sample buffer.
var (
	runnableMu sync.Mutex
	runnable   = []metrics.Sample{{Name: "/sched/goroutines/runnable:goroutines"}}
)

// Contended reports whether at least as many goroutines wait for a P as
// there are Ps: then a goroutine that blocks a P, or runs ahead of the
// others, keeps work waiting.
func Contended() bool {
	runnableMu.Lock()
	defer runnableMu.Unlock()
	metrics.Read(runnable)
	v := runnable[0].Value
	return v.Kind() == metrics.KindUint64 && v.Uint64() >= uint64(runtime.GOMAXPROCS(0))
}

// LetOthersRun yields the P once if Contended: every goroutine that was
// waiting for one runs before the caller goes on. A caller about to
// collect work that those goroutines are producing (answers to send in
// one message) then finds theirs too. Unloaded, it returns at once.
func LetOthersRun() {
	if Contended() {
		runtime.Gosched()
	}
}
