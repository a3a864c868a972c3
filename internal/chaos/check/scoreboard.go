package check

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/tenurelog/tenure/internal/table"
)

// Scoreboard adds up the Reports of many runs, grouped by a fault-kind
// label (the scenario a run exercised), and renders the table `make chaos`
// ends with. Safe for concurrent use.
type Scoreboard struct {
	mu   sync.Mutex
	runs []scored
}

// scored keeps what the table needs of a run: not its history and final
// logs, so a scoreboard of thousands of runs stays small.
type scored struct {
	kind   string
	seed   int64
	faults map[string]int
	void   string
	rep    Report
}

func (x scored) counts() bool { return x.void == "" }

// Add records one run, its report and the fault kind it exercised.
func (s *Scoreboard) Add(kind string, run Run, rep Report) {
	faults := make(map[string]int, len(run.Faults))
	for k, n := range run.Faults {
		faults[k] = n
	}
	if rep.Safe() && rep.Live() {
		// Kept only where Render prints them: under a failed seed.
		rep.Problems = nil
	}
	s.mu.Lock()
	s.runs = append(s.runs, scored{kind: kind, seed: run.Seed, faults: faults, void: run.Void(), rep: rep})
	s.mu.Unlock()
}

// failed says whether a run fails the suite: a counted run that is not
// Safe, or any run, void or not, with a stuck range.
func (x scored) failed() bool { return (x.counts() && !x.rep.Safe()) || !x.rep.Live() }

// Failed returns the seeds of runs that fail the suite (counted runs whose
// report is not Safe, and runs with a stuck range), in the order they were
// added.
func (s *Scoreboard) Failed() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var seeds []int64
	for _, r := range s.runs {
		if r.failed() {
			seeds = append(seeds, r.seed)
		}
	}
	return seeds
}

// Safe says whether every counted run was safe and no run was stuck. Void
// runs neither pass nor fail the safety columns; Render lists any that had
// findings. With no counted run it is vacuously true: check Counted too.
func (s *Scoreboard) Safe() bool { return len(s.Failed()) == 0 }

// Counted is how many runs counted (were not void).
func (s *Scoreboard) Counted() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.runs {
		if r.counts() {
			n++
		}
	}
	return n
}

// row is one line of the table: the sums over a set of counted runs.
type row struct {
	runs, void, faults int
	ops                OpCounts
	trimmed            int
	lost, dups, incons int
	divergent, stale   int
	truncated, failed  int
	hwm                int
	stuck              int
	verdicts           map[Verdict]int
	times              []time.Duration
}

func (r *row) add(x scored) {
	// Stuck counts every run: a void run (its final append failed) is
	// the likeliest to be stuck.
	r.stuck += x.rep.Stuck
	if !x.counts() {
		// A void run says nothing about safety or availability: it is
		// counted here and in stuck, and excluded from every other column.
		r.void++
		return
	}
	rep := x.rep
	r.runs++
	for _, n := range x.faults {
		r.faults += n
	}
	for k := range rep.OpsByOutcome {
		for o := range rep.OpsByOutcome[k] {
			r.ops[k][o] += rep.OpsByOutcome[k][o]
		}
	}
	r.trimmed += rep.Trimmed
	r.lost += rep.Lost
	r.dups += rep.Duplicates
	r.incons += rep.InconsistentOffsets
	r.divergent += rep.DivergentPrefixes
	r.stale += rep.StaleEpochAcceptances
	r.truncated += rep.AckedTruncated
	r.failed += rep.FailedButApplied
	r.hwm += rep.HWMRegressions
	if r.verdicts == nil {
		r.verdicts = map[Verdict]int{}
	}
	r.verdicts[rep.Linearizable]++
	r.times = append(r.times, rep.CheckTime)
}

func (r *row) cells(kind string) string {
	outcomes := func(k Kind) string {
		return fmt.Sprintf("%d/%d/%d", r.ops[k][OK], r.ops[k][Failed], r.ops[k][Unknown])
	}
	check := "-"
	if len(r.times) > 0 {
		ts := append([]time.Duration(nil), r.times...)
		sort.Slice(ts, func(i, j int) bool { return ts[i] < ts[j] })
		check = fmt.Sprintf("%s/%s", roundDuration(ts[len(ts)/2]), roundDuration(ts[len(ts)-1]))
	}
	lin := fmt.Sprintf("%d/%d/%d", r.verdicts[VerdictOK], r.verdicts[VerdictIllegal], r.verdicts[VerdictUnknown])
	return strings.Join([]string{kind,
		fmt.Sprint(r.runs), fmt.Sprint(r.void), fmt.Sprint(r.faults),
		outcomes(Append), outcomes(Read), fmt.Sprint(r.trimmed),
		fmt.Sprint(r.lost), fmt.Sprint(r.dups), fmt.Sprint(r.incons), fmt.Sprint(r.divergent),
		fmt.Sprint(r.stale), fmt.Sprint(r.truncated), fmt.Sprint(r.failed), fmt.Sprint(r.hwm),
		fmt.Sprint(r.stuck), lin, check}, "\t")
}

// scoreboardHeader names the columns; the safety columns are lost through
// hwm-back, each of which must read 0, and so must stuck (liveness).
// trimmed (Report.Trimmed) is no safety column: the committed records
// retention deleted on purpose, which lost therefore did not require.
var scoreboardHeader = strings.Join([]string{"kind", "runs", "void", "faults",
	"appends ok/failed/unknown", "reads ok/failed/unknown", "trimmed",
	"lost", "dup", "inconsistent", "divergent", "stale-epoch", "acked-truncated", "failed-applied", "hwm-back",
	"stuck", "linearizable ok/illegal/unknown", "check p50/max"}, "\t")

func roundDuration(d time.Duration) time.Duration {
	if d < time.Millisecond {
		return d.Round(time.Microsecond)
	}
	return d.Round(time.Millisecond)
}

// Render writes the table, one row per fault kind and a total row, then
// the faults injected by kind, the failed seeds with what failed, and the
// void runs.
func (s *Scoreboard) Render(w io.Writer) error {
	s.mu.Lock()
	runs := append([]scored(nil), s.runs...)
	s.mu.Unlock()

	rows := map[string]*row{}
	var total row
	faults := map[string]int{}
	for _, x := range runs {
		r := rows[x.kind]
		if r == nil {
			r = &row{}
			rows[x.kind] = r
		}
		r.add(x)
		total.add(x)
		if x.counts() {
			for k, n := range x.faults {
				faults[k] += n
			}
		}
	}

	tw := table.New(w, 2)
	fmt.Fprintln(tw, scoreboardHeader)
	for _, kind := range sortedKeys(rows) {
		fmt.Fprintln(tw, rows[kind].cells(kind))
	}
	fmt.Fprintln(tw, total.cells("total"))
	if err := tw.Flush(); err != nil {
		return err
	}

	var b strings.Builder
	var fs []string
	for _, k := range sortedKeys(faults) {
		fs = append(fs, fmt.Sprintf("%s=%d", k, faults[k]))
	}
	if len(fs) == 0 {
		fs = []string{"none"}
	}
	fmt.Fprintf(&b, "faults injected: %s\n", strings.Join(fs, " "))

	var failed, voidUnsafe, void []string
	unsafe, stuck := 0, 0
	for _, x := range runs {
		if x.counts() && !x.rep.Safe() {
			unsafe++
		}
		if !x.rep.Live() {
			stuck++
		}
		switch {
		case x.failed():
			failed = append(failed, fmt.Sprintf("%d (%s: %s)", x.seed, x.kind, findings(x.rep)))
			if !x.counts() {
				void = append(void, fmt.Sprintf("%d (%s)", x.seed, x.void))
			}
		case !x.counts():
			void = append(void, fmt.Sprintf("%d (%s)", x.seed, x.void))
			if !x.rep.Safe() {
				voidUnsafe = append(voidUnsafe, fmt.Sprintf("%d (%s: %s)", x.seed, x.kind, findings(x.rep)))
			}
		}
	}
	if len(failed) == 0 {
		fmt.Fprintf(&b, "failed seeds: none\n")
	} else {
		fmt.Fprintf(&b, "failed seeds: %s\n", strings.Join(failed, ", "))
	}
	for _, x := range runs {
		if x.failed() {
			fmt.Fprintf(&b, "seed %d (%s):\n", x.seed, x.kind)
			for _, pr := range x.rep.Problems {
				fmt.Fprintf(&b, "  %s\n", pr)
			}
		}
	}
	if len(void) > 0 {
		fmt.Fprintf(&b, "void runs (not counted): %s\n", strings.Join(void, ", "))
	}
	if len(voidUnsafe) > 0 {
		fmt.Fprintf(&b, "void runs with findings (not counted, worth a look): %s\n", strings.Join(voidUnsafe, ", "))
	}
	switch {
	case unsafe > 0:
		fmt.Fprintf(&b, "verdict: UNSAFE (%d of %d counted runs failed; %d runs stuck)\n", unsafe, total.runs, stuck)
	case stuck > 0:
		fmt.Fprintf(&b, "verdict: STUCK (%d runs left a range unavailable after healing)\n", stuck)
	case total.runs == 0:
		fmt.Fprintf(&b, "verdict: NOTHING TESTED (no run counted)\n")
	default:
		fmt.Fprintf(&b, "verdict: safe (%d counted runs, every safety column 0, none stuck)\n", total.runs)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// findings names the nonzero safety columns of a report.
func findings(r Report) string {
	var f []string
	for _, c := range []struct {
		name string
		n    int
	}{
		{"lost", r.Lost}, {"dup", r.Duplicates}, {"inconsistent", r.InconsistentOffsets},
		{"divergent", r.DivergentPrefixes}, {"stale-epoch", r.StaleEpochAcceptances},
		{"acked-truncated", r.AckedTruncated}, {"failed-applied", r.FailedButApplied},
		{"hwm-back", r.HWMRegressions}, {"stuck", r.Stuck},
	} {
		if c.n > 0 {
			f = append(f, fmt.Sprintf("%s %d", c.name, c.n))
		}
	}
	if r.Linearizable == VerdictIllegal {
		f = append(f, "not linearizable "+strings.Join(r.IllegalRanges, ","))
	}
	return strings.Join(f, ", ")
}
