package bench

import (
	"fmt"
	"os"
	"runtime/pprof"
	"runtime/trace"
)

// WindowCPUProfile, when set (-bench.cpuprofile), names a file that
// receives a CPU profile of each run's measured window only: a
// benchmark's setup (1,000 ranges adopted, streams created) is left out,
// unlike -test.cpuprofile's. Each run overwrites the file, so profile one
// sub-benchmark at a time.
var WindowCPUProfile string

// WindowTrace, when set (-bench.trace), names a file that receives an
// execution trace of each run's measured window only, as WindowCPUProfile
// does a CPU profile. Where the CPU profile shows little, the trace shows
// waiting: `go tool trace -pprof=sched FILE` is the time goroutines spent
// runnable, by what woke them (bench/results/2026-12-07.md, "One in
// flight on a fast disk"). Not with -test.trace: one trace at a time.
var WindowTrace string

// startWindowProfile starts the window's CPU profile and trace, if asked
// for, and returns what stops them.
func startWindowProfile() (stop func(), err error) {
	var stops []func()
	stopAll := func() {
		for _, s := range stops {
			s()
		}
	}
	if WindowCPUProfile != "" {
		f, err := os.Create(WindowCPUProfile)
		if err != nil {
			return nil, fmt.Errorf("bench: cpu profile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("bench: cpu profile: %w", err)
		}
		stops = append(stops, func() { pprof.StopCPUProfile(); _ = f.Close() })
	}
	if WindowTrace != "" {
		f, err := os.Create(WindowTrace)
		if err == nil {
			if err = trace.Start(f); err != nil {
				_ = f.Close()
			}
		}
		if err != nil {
			stopAll()
			return nil, fmt.Errorf("bench: trace: %w", err)
		}
		stops = append(stops, func() { trace.Stop(); _ = f.Close() })
	}
	return stopAll, nil
}
