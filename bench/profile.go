package bench

import (
	"fmt"
	"os"
	"runtime/pprof"
)

// WindowCPUProfile, when set (-bench.cpuprofile), names a file that
// receives a CPU profile of each run's measured window only: a
// benchmark's setup (1,000 ranges adopted, streams created) is left out,
// unlike -test.cpuprofile's. Each run overwrites the file, so profile one
// sub-benchmark at a time.
var WindowCPUProfile string

// startWindowProfile starts the window's CPU profile, if one is asked for,
// and returns what stops it.
func startWindowProfile() (stop func(), err error) {
	if WindowCPUProfile == "" {
		return func() {}, nil
	}
	f, err := os.Create(WindowCPUProfile)
	if err != nil {
		return nil, fmt.Errorf("bench: cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("bench: cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}
