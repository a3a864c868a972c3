// Command benchratio summarizes interleaved runs of the bench module: for
// each file of `go test -bench` output (one file per benchmark binary, each
// holding several whole runs), the records/s of every system and shape per
// run, their median, the median p50 and p99, the median CPU time and
// scheduler samples per record (when the lines carry them), the median
// syncs per record (likewise), and each system's ratio to JetStream
// (JetStreamProcs for a ...Procs system, JetStreamManyRanges for a
// ...ManyRanges one) within the same run, with the median of those ratios,
// and likewise to the floors (Floor, FloorManyRanges, FloorKept) when the run has them. Issue #3's
// targets are stated as such medians. See bench/README.md, "Run", and
// bench/interleave.sh, which writes the files.
//
//	go run ./cmd/benchratio /tmp/bench-head.txt /tmp/bench-final.txt
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

// baseline is the system every other one is compared with: JetStream, or
// for a system of a family (a name ending in a family's suffix) the
// baseline of that family: JetStreamProcs for a system whose servers run
// as processes of their own (bench/procs_test.go), JetStreamManyRanges for
// the many-range shapes (bench/many_test.go).
const baseline = "JetStream"

// floors are the machine's limits (bench/floor_test.go) every system is
// also compared with when its family has them in the run: Floor,
// FloorManyRanges, and FloorKept (the floor of a log that keeps its
// records, for reading whether Floor's circle flatters it).
var floors = []string{"Floor", "FloorKept"}

// families are the suffixes of the benchmark families.
var families = []string{"Procs", "ManyRanges"}

// family is system's family suffix ("" for the in-process single-range one).
func family(system string) string {
	for _, f := range families {
		if strings.HasSuffix(system, f) {
			return f
		}
	}
	return ""
}

// baselineFor names the system that system is compared with.
func baselineFor(system string) string { return baseline + family(system) }

// floorsFor names the floors system is compared with.
func floorsFor(system string) []string {
	var names []string
	for _, f := range floors {
		if name := f + family(system); name != system {
			names = append(names, name)
		}
	}
	return names
}

// result is one benchmark line: one system, one shape, one run.
type result struct {
	system, shape      string
	recordsPerSec, p50 float64
	p99                float64
	// cpuUs and sched are per record; 0 when the line lacks them (output
	// of an older harness).
	cpuUs, sched float64
	// syncs are fsync and fdatasync calls per record, -1 when the line
	// lacks them (not counted, or unavailable).
	syncs float64
}

// run is one whole run of a benchmark binary: each system and shape once.
type run map[[2]string]result

func main() {
	if len(os.Args) < 2 || slices.Contains(os.Args[1:], "-h") || slices.Contains(os.Args[1:], "--help") {
		fmt.Fprintln(os.Stderr, "usage: benchratio FILE...\n\nEach FILE holds whole runs of one bench binary (go test -bench output,\nruns back to back); see bench/interleave.sh.")
		os.Exit(2)
	}
	for _, name := range os.Args[1:] {
		f, err := os.Open(name)
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchratio:", err)
			os.Exit(1)
		}
		runs, err := parse(f)
		_ = f.Close()
		if err != nil {
			fmt.Fprintf(os.Stderr, "benchratio: %s: %v\n", name, err)
			os.Exit(1)
		}
		fmt.Printf("== %s (%d runs)\n", name, len(runs))
		summarize(os.Stdout, runs)
	}
}

// parse reads benchmark lines into runs.
func parse(r io.Reader) ([]run, error) {
	var runs []run
	cur := run{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		// Each run of a test binary starts with its "goos:" header; a
		// system and shape seen again also starts a run (output pasted
		// without headers).
		if strings.HasPrefix(sc.Text(), "goos:") && len(cur) > 0 {
			runs, cur = append(runs, cur), run{}
			continue
		}
		res, ok, err := parseLine(sc.Text())
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		key := [2]string{res.system, res.shape}
		if _, seen := cur[key]; seen {
			runs, cur = append(runs, cur), run{}
		}
		cur[key] = res
	}
	if len(cur) > 0 {
		runs = append(runs, cur)
	}
	if len(runs) == 0 {
		return nil, errors.New("no benchmark results")
	}
	return runs, sc.Err()
}

// parseLine reads "BenchmarkSystem/shape-N  1  v unit  v unit ...".
func parseLine(line string) (result, bool, error) {
	f := strings.Fields(line)
	if len(f) < 2 || !strings.HasPrefix(f[0], "Benchmark") || !strings.Contains(f[0], "/") {
		return result{}, false, nil
	}
	name := strings.TrimPrefix(f[0], "Benchmark")
	if i := strings.LastIndexByte(name, '-'); i > 0 {
		if _, err := strconv.Atoi(name[i+1:]); err == nil {
			name = name[:i] // the GOMAXPROCS suffix
		}
	}
	system, shape, _ := strings.Cut(name, "/")
	res := result{system: system, shape: shape, syncs: -1}
	for i := 2; i+1 < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return result{}, false, fmt.Errorf("%q: value %q: %v", line, f[i], err)
		}
		switch f[i+1] {
		case "records/s":
			res.recordsPerSec = v
		case "p50-ms":
			res.p50 = v
		case "p99-ms":
			res.p99 = v
		case "cpu-us/record":
			res.cpuUs = v
		case "sched-samples/record":
			res.sched = v
		case "syncs/record":
			res.syncs = v
		}
	}
	if res.recordsPerSec == 0 {
		return result{}, false, nil // not a bench-module result
	}
	return res, true, nil
}

func summarize(w io.Writer, runs []run) {
	var shapes, systems []string
	for _, r := range runs {
		for k := range r {
			if !slices.Contains(systems, k[0]) {
				systems = append(systems, k[0])
			}
			if !slices.Contains(shapes, k[1]) {
				shapes = append(shapes, k[1])
			}
		}
	}
	slices.Sort(systems)
	slices.Sort(shapes)
	for _, shape := range shapes {
		for _, system := range systems {
			var rps, p50, p99, cpu, sched, syncs, ratios []float64
			toFloors := map[string][]float64{}
			for _, r := range runs {
				res, ok := r[[2]string{system, shape}]
				if !ok {
					continue
				}
				rps, p50, p99 = append(rps, res.recordsPerSec), append(p50, res.p50), append(p99, res.p99)
				if res.cpuUs > 0 {
					cpu, sched = append(cpu, res.cpuUs), append(sched, res.sched)
				}
				if res.syncs >= 0 {
					syncs = append(syncs, res.syncs)
				}
				if base, ok := r[[2]string{baselineFor(system), shape}]; ok && system != baselineFor(system) && base.recordsPerSec > 0 {
					ratios = append(ratios, res.recordsPerSec/base.recordsPerSec)
				}
				for _, name := range floorsFor(system) {
					if fl, ok := r[[2]string{name, shape}]; ok && system != baselineFor(system) && fl.recordsPerSec > 0 {
						toFloors[name] = append(toFloors[name], res.recordsPerSec/fl.recordsPerSec)
					}
				}
			}
			if len(rps) == 0 {
				continue
			}
			fmt.Fprintf(w, "%-14s %-12s records/s %s median %.0f  p50 %.3f ms  p99 %.2f ms", shape, system, join(rps, "%.0f"), median(rps), median(p50), median(p99))
			if len(cpu) > 0 {
				fmt.Fprintf(w, "  per record %.0f us CPU, %.2f sched samples", median(cpu), median(sched))
			}
			if len(syncs) > 0 {
				fmt.Fprintf(w, ", %.3f syncs", median(syncs))
			}
			if len(ratios) > 0 {
				fmt.Fprintf(w, "  vs %s %s median %.2fx", baselineFor(system), join(ratios, "%.2f"), median(ratios))
			}
			for _, name := range floorsFor(system) {
				if q := toFloors[name]; len(q) > 0 {
					fmt.Fprintf(w, "  vs %s %s median %.2fx", name, join(q, "%.2f"), median(q))
				}
			}
			fmt.Fprintln(w)
		}
	}
}

func join(vs []float64, format string) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = fmt.Sprintf(format, v)
	}
	return strings.Join(s, "/")
}

// median of vs (the mean of the middle two for an even count).
func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
