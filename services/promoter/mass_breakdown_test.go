package promoter

import (
	"context"
	"os"
	"runtime/pprof"
	"slices"
	"syscall"
	"testing"
	"time"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// massBreakdown logs where a mass failover's time went, from the victims'
// transition records: when promotions started after the kill (detection
// plus waiting for a fan-out slot), when their leaders were adopted, and
// each step's median and maximum. It returns when the last victim's
// adoption ended, after the kill: the failover's length, read from the
// promoter's own record of each promotion (the same clock as the kill's)
// rather than from when a poll noticed.
// breakdownRecords is how many of a victim's newest records massBreakdown
// reads to find the first after the kill: under load a victim is rarely
// promoted again, never this often in a run.
const breakdownRecords = 20

func massBreakdown(b testing.TB, p *Promoter, victims ledAt, killed time.Time) time.Duration {
	ctx := context.Background()
	var starts, adopted []time.Duration
	steps := map[string][]time.Duration{}
	var order []string
	waitFor(b, "the victims' transition records", 60*time.Second, func() bool {
		starts, adopted, steps, order = starts[:0], adopted[:0], map[string][]time.Duration{}, order[:0]
		for id := range victims {
			// The first promotion after the kill is the failover's: a
			// later one (the new leader's lease lapsed under load) is
			// another fault's and would stretch the failover's length.
			// Records come newest first; the epoch comparison keeps
			// those above the epoch at the kill.
			trs, err := p.transitions(ctx, id, breakdownRecords)
			if err != nil || len(trs) == 0 || trs[0].GetEpoch() <= victims[id] {
				return false
			}
			var tr *tenurev1.Transition
			for _, t := range trs {
				if t.GetEpoch() > victims[id] {
					tr = t
				}
			}
			start := time.UnixMilli(tr.GetStartedUnixMs()).Sub(killed)
			starts = append(starts, start)
			at := start
			for _, st := range tr.GetTimings() {
				d := time.Duration(st.GetDurationUs()) * time.Microsecond
				if _, ok := steps[st.GetStep()]; !ok {
					order = append(order, st.GetStep())
				}
				steps[st.GetStep()] = append(steps[st.GetStep()], d)
				if st.GetStep() != "bind" && st.GetStep() != "record" {
					at += d
				}
			}
			adopted = append(adopted, at)
		}
		return true
	})
	q := func(ds []time.Duration, f float64) time.Duration {
		slices.Sort(ds)
		return ds[int(f*float64(len(ds)-1))].Round(time.Millisecond)
	}
	b.Logf("started after kill: first %v, p50 %v, last %v; adopted: p50 %v, last %v",
		q(starts, 0), q(starts, 0.5), q(starts, 1), q(adopted, 0.5), q(adopted, 1))
	for _, s := range order {
		b.Logf("  step %-9s p50 %v p90 %v max %v", s, q(steps[s], 0.5), q(steps[s], 0.9), q(steps[s], 1))
	}
	return slices.Max(adopted)
}

// massProfile measures the failover phase alone: the CPU time the whole
// in-process cluster spent in it (a measure of its work that a loaded
// machine distorts less than the wall time), which the returned function
// answers (the benchmarks report it as cpu-ms), and a CPU profile when
// TENURE_MASS_CPUPROFILE names a file. The returned function stops both.
func massProfile(b testing.TB) func() time.Duration {
	cpu0 := cpuTime()
	path := os.Getenv("TENURE_MASS_CPUPROFILE")
	if path == "" {
		return func() time.Duration { return cpuTime() - cpu0 }
	}
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() time.Duration {
		cpu := cpuTime() - cpu0
		pprof.StopCPUProfile()
		_ = f.Close()
		return cpu
	}
}

// cpuTime is the process's user plus system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
