package check

import (
	"strings"
	"sync"
	"testing"
	"time"
)

func TestScoreboardRender(t *testing.T) {
	var sb Scoreboard
	add := func(kind string, run Run) {
		sb.Add(kind, run, Check(run))
	}
	// Two clean kill runs, one clean partition run, one partition run that
	// lost c, and a void run (no traffic during faults) that also lost c:
	// it must show as void and stay out of the safety columns.
	add("kill", cleanRun())
	second := cleanRun()
	second.Seed = 8
	add("kill", second)
	part := cleanRun()
	part.Seed = 9
	part.Faults = map[string]int{"partition": 2, "kill": 1}
	add("partition", part)
	lossy := cleanRun()
	lossy.Seed = 10
	lossy.Faults = map[string]int{"partition": 3}
	lossy.Final[1] = replica("B", theLog()[:3], 3)
	lossy.Final[2] = replica("C", theLog()[:3], 3)
	add("partition", lossy)
	void := cleanRun()
	void.Seed = 11
	void.TrafficDuring = 0
	void.Final = lossy.Final
	add("partition", void)

	if sb.Safe() {
		t.Errorf("Safe() = true with seed 10 losing a record")
	}
	if got := sb.Failed(); len(got) != 1 || got[0] != 10 {
		t.Errorf("Failed() = %v, want [10]", got)
	}

	var b strings.Builder
	if err := sb.Render(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	t.Logf("\n%s", out)
	lines := strings.Split(out, "\n")
	// cells splits a table line on its column gaps (two or more blanks).
	cells := func(prefix string) []string {
		for _, l := range lines {
			if strings.HasPrefix(l, prefix+" ") {
				var c []string
				for _, f := range strings.Split(l, "  ") {
					if f = strings.TrimSpace(f); f != "" {
						c = append(c, f)
					}
				}
				return c
			}
		}
		t.Fatalf("no row %q in\n%s", prefix, out)
		return nil
	}
	header := cells("kind")
	col := func(name string) int {
		for i, h := range header {
			if h == name {
				return i
			}
		}
		t.Fatalf("no column %q in header %q", name, header)
		return -1
	}
	for _, tc := range []struct{ row, col, want string }{
		{"kill", "runs", "2"},
		{"kill", "void", "0"},
		{"kill", "faults", "2"},
		{"kill", "appends ok/failed/unknown", "6/0/0"},
		{"kill", "reads ok/failed/unknown", "2/0/0"},
		{"kill", "lost", "0"},
		{"kill", "linearizable ok/illegal/unknown", "2/0/0"},
		{"partition", "runs", "2"},
		{"partition", "void", "1"},
		{"partition", "faults", "6"},
		{"partition", "lost", "1"},
		{"total", "runs", "4"},
		{"total", "void", "1"},
		{"total", "faults", "8"},
		{"total", "appends ok/failed/unknown", "12/0/0"},
		{"total", "lost", "1"},
		{"total", "dup", "0"},
		{"total", "stale-epoch", "0"},
		{"total", "linearizable ok/illegal/unknown", "4/0/0"},
		{"total", "stuck", "0"},
	} {
		row := cells(tc.row)
		if len(row) != len(header) {
			t.Fatalf("row %q has %d cells, header %d: %q", tc.row, len(row), len(header), row)
		}
		if got := row[col(tc.col)]; got != tc.want {
			t.Errorf("%s/%s = %q, want %q", tc.row, tc.col, got, tc.want)
		}
	}
	for _, want := range []string{
		"faults injected: kill=3 partition=5\n",
		"failed seeds: 10 (partition: lost 1)\n",
		`  lost: range r1 offset 3 value "c"`,
		"void runs (not counted): 11 (no traffic during faults)\n",
		"void runs with findings (not counted, worth a look): 11 (partition: lost 1)\n",
		"verdict: UNSAFE (1 of 4 counted runs failed; 0 runs stuck)\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	// The total row comes last in the table.
	if !strings.HasPrefix(lines[3], "total ") {
		t.Errorf("line 4 = %q, want the total row", lines[3])
	}
}

func TestScoreboardConcurrentAdd(t *testing.T) {
	var sb Scoreboard
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			run := cleanRun()
			run.Seed = int64(i)
			sb.Add("kill", run, Check(run))
		}()
	}
	wg.Wait()
	var b strings.Builder
	if err := sb.Render(&b); err != nil {
		t.Fatal(err)
	}
	if !sb.Safe() || sb.Counted() != 8 || !strings.Contains(b.String(), "failed seeds: none") ||
		!strings.Contains(b.String(), "verdict: safe (8 counted runs, every safety column 0, none stuck)") {
		t.Errorf("8 clean runs: Safe() = %v, Counted() = %d\n%s", sb.Safe(), sb.Counted(), b.String())
	}
}

func TestScoreboardNothingCounted(t *testing.T) {
	var sb Scoreboard
	run := cleanRun()
	run.FinalAppendOK = false
	sb.Add("kill", run, Check(run))
	var b strings.Builder
	if err := sb.Render(&b); err != nil {
		t.Fatal(err)
	}
	if sb.Counted() != 0 || !strings.Contains(b.String(), "verdict: NOTHING TESTED (no run counted)") {
		t.Errorf("Counted() = %d\n%s", sb.Counted(), b.String())
	}
}

// TestScoreboardStuck: a run whose range never came back fails the suite
// and shows in the stuck column even though it is void (its final append
// failed) and every safety column is zero.
func TestScoreboardStuck(t *testing.T) {
	var sb Scoreboard
	live := cleanRun()
	live.Liveness = []Liveness{{Range: "r1", Bound: time.Second, Appended: true, Read: true, Agreed: true, Took: 100 * time.Millisecond}}
	sb.Add("lease-pause", live, Check(live))
	wedged := cleanRun()
	wedged.Seed = 12
	wedged.FinalAppendOK = false
	wedged.Liveness = []Liveness{{Range: "r1", Bound: time.Second, Agreed: false,
		Detail: "promoter: healthy at epoch 2 led by A; A: leader at epoch 2, lease_valid=false"}}
	rep := Check(wedged)
	if rep.Stuck != 1 || !rep.Safe() || rep.Live() {
		t.Fatalf("wedged run: Stuck = %d, Safe() = %v, Live() = %v, want 1, true, false", rep.Stuck, rep.Safe(), rep.Live())
	}
	sb.Add("lease-pause", wedged, rep)
	if got := sb.Failed(); len(got) != 1 || got[0] != 12 {
		t.Errorf("Failed() = %v, want [12]", got)
	}
	if sb.Safe() {
		t.Errorf("Safe() = true with a stuck run")
	}
	var b strings.Builder
	if err := sb.Render(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	t.Logf("\n%s", out)
	for _, want := range []string{
		"failed seeds: 12 (lease-pause: stuck 1)\n",
		"  stuck: range r1: no append acknowledged within 1s of healing: promoter: healthy at epoch 2 led by A; A: leader at epoch 2, lease_valid=false\n",
		"void runs (not counted): 12 (final append failed)\n",
		"verdict: STUCK (1 runs left a range unavailable after healing)\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	var row []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "lease-pause ") {
			row = strings.Fields(l)
		}
	}
	// kind runs void faults appends reads trimmed lost dup inconsistent
	// divergent stale acked-truncated failed-applied hwm-back stuck ...
	if len(row) < 16 || row[15] != "1" {
		t.Errorf("lease-pause row %q: stuck column is not 1", row)
	}
}
