package chaos

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/tenurelog/tenure/internal/chaos/check"
)

// The short budget (make test) runs chaosSeeds seeds of every fault kind;
// `make chaos SEEDS=N` runs N. -chaos.seed reproduces one run.
var (
	chaosSeeds    = flag.Int("chaos.seeds", 2, "seeds per fault kind (seeds 1..N)")
	chaosSeed     = flag.Int64("chaos.seed", 0, "run only this seed (reproduces a failing run)")
	chaosKinds    = flag.String("chaos.kinds", "", "comma-separated fault kinds (default all: "+kindList()+")")
	chaosReplicas = flag.Int("chaos.replicas", 3, "replicas per run (3 or 5)")
	chaosBoard    = flag.String("chaos.scoreboard", "", "also write the scoreboard to this file")
	chaosDump     = flag.String("chaos.dump", "", "write each failing run's observations as JSON into this directory")
)

func kindList() string {
	var s []string
	for _, k := range Kinds {
		s = append(s, string(k))
	}
	return strings.Join(s, ",")
}

var (
	boardMu sync.Mutex
	board   check.Scoreboard
)

// TestChaos runs the seeded chaos runs and judges each: every safety
// column must be zero, no run may leave its range stuck after healing, and
// every fault kind must have at least one run that counts (traffic before
// and during its faults, a successful final append).
func TestChaos(t *testing.T) {
	kinds := Kinds
	if *chaosKinds != "" {
		kinds = nil
		for _, k := range strings.Split(*chaosKinds, ",") {
			kinds = append(kinds, Kind(strings.TrimSpace(k)))
		}
	}
	seeds := []int64{}
	if *chaosSeed != 0 {
		seeds = append(seeds, *chaosSeed)
	} else {
		for s := 1; s <= *chaosSeeds; s++ {
			seeds = append(seeds, int64(s))
		}
	}
	counted := map[Kind]int{}
	for _, kind := range kinds {
		for _, seed := range seeds {
			t.Run(fmt.Sprintf("%s/seed=%d", kind, seed), func(t *testing.T) {
				run := RunOne(t, RunConfig{Seed: seed, Kind: kind, Replicas: *chaosReplicas})
				rep := check.Check(run)
				boardMu.Lock()
				board.Add(string(kind), run, rep)
				boardMu.Unlock()
				t.Logf("seed %d kind %s: ops %d, traffic before %d during %d, final epoch %d, truncations %d (%d at fetch), linearizable %s in %v",
					seed, kind, len(run.History), run.TrafficBefore, run.TrafficDuring, finalEpoch(run), len(run.Truncations), fetchCuts(run), rep.Linearizable, rep.CheckTime)
				if kind == "retention" {
					proof := retentionProof(run, rep)
					t.Logf("seed %d kind retention: %s", seed, proof)
					// A counted run whose log start never moved, or whose
					// checkers never met a deleted record or a read below
					// the log start, proved nothing about retention.
					if run.Void() == "" && !proof.ok() {
						t.Errorf("seed %d kind retention: retention did not really run: %s (reproduce: go test ./internal/chaos -run TestChaos -chaos.kinds=retention -chaos.seed=%d)", seed, proof, seed)
					}
				}
				if v := run.Void(); v != "" {
					// A void run proved nothing, but is no safety finding:
					// on a starved box, 2 s lease sessions can lapse
					// faster than the cluster heals. It shows in the
					// scoreboard; a kind with no counted run fails below.
					t.Logf("seed %d kind %s: VOID, not counted: %s (reproduce: go test ./internal/chaos -run TestChaos -chaos.kinds=%s -chaos.seed=%d)", seed, kind, v, kind, seed)
				} else {
					counted[kind]++
				}
				if !rep.Safe() || !rep.Live() || run.Void() != "" {
					dumpRun(t, run)
				}
				if !rep.Live() {
					// Not a safety finding, and not a void run to shrug
					// off: the range did not come back (check.Liveness).
					t.Errorf("seed %d kind %s: STUCK (reproduce: go test ./internal/chaos -run TestChaos -chaos.kinds=%s -chaos.seed=%d):\n  %s",
						seed, kind, kind, seed, strings.Join(rep.Problems, "\n  "))
				}
				if !rep.Safe() {
					t.Errorf("seed %d kind %s: UNSAFE (reproduce: go test ./internal/chaos -run TestChaos -chaos.kinds=%s -chaos.seed=%d):\n  %s",
						seed, kind, kind, seed, strings.Join(rep.Problems, "\n  "))
				}
			})
		}
	}
	for _, kind := range kinds {
		if counted[kind] == 0 {
			t.Errorf("fault kind %s: none of its %d runs counted (traffic before and during the fault, and a final append, are required)", kind, len(seeds))
		}
	}
	var sb strings.Builder
	if err := board.Render(&sb); err != nil {
		t.Fatal(err)
	}
	fmt.Print("\n" + sb.String())
	if *chaosBoard != "" {
		if err := os.WriteFile(*chaosBoard, []byte(sb.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// retentionEvidence is what a retention run showed of retention at work.
type retentionEvidence struct {
	finalStarts []string // every final log's replica and log start
	zeroFinal   int      // final logs that start at 0
	starts      int      // distinct log starts above 0 the status samples saw
	trimmed     int      // committed client records below the reported log start
	belowReads  int      // reads answered below the log start
}

// ok says the run is evidence: every replica ends with a log start above
// 0, the log start moved more than once while sampled, some committed
// record was deleted (and so judged as deleted by the checkers), and some
// read was answered below the log start (and started again at it).
func (e retentionEvidence) ok() bool {
	return e.zeroFinal == 0 && e.starts >= 2 && e.trimmed > 0 && e.belowReads > 0
}

func (e retentionEvidence) String() string {
	return fmt.Sprintf("final log starts %s, %d distinct log starts sampled, %d committed records trimmed, %d reads below the log start",
		strings.Join(e.finalStarts, " "), e.starts, e.trimmed, e.belowReads)
}

func retentionProof(run check.Run, rep check.Report) retentionEvidence {
	var e retentionEvidence
	for _, l := range run.Final {
		e.finalStarts = append(e.finalStarts, fmt.Sprintf("%s=%d", l.Replica, l.LogStart))
		if l.LogStart == 0 {
			e.zeroFinal++
		}
	}
	if len(run.Final) == 0 {
		e.zeroFinal++ // no final log at all shows nothing
	}
	seen := map[uint64]bool{}
	for _, s := range run.HWMs {
		if s.LogStart > 0 && !seen[s.LogStart] {
			seen[s.LogStart] = true
			e.starts++
		}
	}
	for _, op := range run.History {
		if op.Kind == check.Read && op.BelowLogStart {
			e.belowReads++
		}
	}
	e.trimmed = rep.Trimmed
	return e
}

// finalEpoch is the highest epoch any replica was fenced at: how many
// promotions the run's faults caused (the first leader is epoch 1).
func finalEpoch(run check.Run) uint64 {
	var e uint64
	for _, l := range run.Final {
		e = max(e, l.FencedEpoch)
	}
	return e
}

// fetchCuts counts the run's fetch-time truncations (a follower's own, on a
// leader's divergence answer).
func fetchCuts(run check.Run) int {
	n := 0
	for _, tr := range run.Truncations {
		if tr.FetchLeader != "" {
			n++
		}
	}
	return n
}

// dumpRun writes a failing run's observations (history, final logs, events)
// as JSON, for reading a violation offset by offset.
func dumpRun(t *testing.T, run check.Run) {
	if *chaosDump == "" {
		return
	}
	b, err := json.MarshalIndent(run, "", " ")
	if err != nil {
		t.Errorf("dump: %v", err)
		return
	}
	name := filepath.Join(*chaosDump, fmt.Sprintf("run-%s.json", strings.ReplaceAll(t.Name(), "/", "_")))
	if err := os.WriteFile(name, b, 0o644); err != nil {
		t.Errorf("dump: %v", err)
		return
	}
	t.Logf("observations written to %s", name)
}
