package check

import (
	"fmt"
	"math/rand"
	"testing"
	"time"
)

// genRun builds a run of a correct system: ops overlapping in real time,
// each taking effect at a point inside its interval; epoch changes write
// epoch-start records; some appends time out (half of them took effect),
// some fail; reads see the log as of their point, some limited.
func genRun(seed int64, ranges []string, opsPerRange int) Run {
	rng := rand.New(rand.NewSource(seed))
	run := Run{Seed: seed, TrafficBefore: 1, TrafficDuring: 1, FinalAppendOK: true}
	for _, name := range ranges {
		var log []Record
		epoch := uint64(1)
		log = append(log, Record{Offset: 0, Epoch: epoch, EpochStart: true})
		for i := range opsPerRange {
			// The linearization point of op i is 10*i ms; its interval
			// reaches up to 25 ms either side, so neighbours overlap.
			point := 10 * i
			call, ret := point-rng.Intn(25), point+rng.Intn(25)
			client := rng.Intn(8)
			if rng.Intn(40) == 0 {
				epoch++
				log = append(log, Record{Offset: uint64(len(log)), Epoch: epoch, EpochStart: true})
			}
			switch r := rng.Intn(10); {
			case r < 6:
				v := fmt.Sprintf("%s-%d", name, i)
				op := Op{Client: client, Range: name, Kind: Append, Value: []byte(v), Call: at(call), Return: at(ret)}
				switch rng.Intn(20) {
				case 0: // failed: nothing written
					op.Outcome = Failed
					run.History = append(run.History, op)
					continue
				case 1: // timed out without effect
					op.Outcome = Unknown
					run.History = append(run.History, op)
					continue
				case 2: // timed out, took effect
					op.Outcome = Unknown
				default:
					op.Outcome = OK
					op.Offset, op.Epoch = uint64(len(log)), epoch
				}
				log = append(log, Record{Offset: uint64(len(log)), Epoch: epoch, Value: []byte(v)})
				run.History = append(run.History, op)
			default:
				// Mostly tail reads, as a consumer would do, some from
				// anywhere.
				from := uint64(max(0, len(log)-rng.Intn(20)))
				if rng.Intn(10) == 0 {
					from = uint64(rng.Intn(len(log) + 1))
				}
				h := uint64(len(log))
				recs := append([]Record(nil), log[from:]...)
				op := Op{Client: client, Range: name, Kind: Read, Offset: from, HWM: h, Outcome: OK, Call: at(call), Return: at(ret)}
				if len(recs) > 5 && rng.Intn(3) == 0 {
					recs, op.Limited = recs[:5], true
				}
				op.Records = recs
				run.History = append(run.History, op)
			}
		}
		for _, r := range []string{"A", "B", "C"} {
			run.Final = append(run.Final, ReplicaLog{Replica: r, Range: name, LogEnd: uint64(len(log)),
				HWM: uint64(len(log)), FencedEpoch: epoch, Records: log})
		}
	}
	// Shuffle: the history is in completion order in real runs, not
	// sorted by anything the checker may rely on.
	rng.Shuffle(len(run.History), func(i, j int) { run.History[i], run.History[j] = run.History[j], run.History[i] })
	return run
}

func TestGeneratedCorrectRunsAreSafe(t *testing.T) {
	for seed := range int64(20) {
		run := genRun(seed, []string{"r1", "r2", "r3"}, 300)
		rep := Check(run)
		if !rep.Safe() || rep.Linearizable != VerdictOK {
			t.Fatalf("seed %d: correct run judged %+v", seed, counts(rep))
		}
	}
}

func TestGeneratedLargeRunChecksQuickly(t *testing.T) {
	run := genRun(1, []string{"r1", "r2"}, 4000)
	rep := Check(run)
	if !rep.Safe() || rep.Linearizable != VerdictOK {
		t.Fatalf("correct run judged unsafe: %v, verdict %s", counts(rep), rep.Linearizable)
	}
	t.Logf("%d ops checked in %s", len(run.History), rep.CheckTime)
	if rep.CheckTime > 20*time.Second {
		t.Errorf("check took %s for %d ops", rep.CheckTime, len(run.History))
	}
}

func TestGeneratedRunWithSwappedAcksIsIllegal(t *testing.T) {
	// Two acknowledged appends of one range that did not overlap in time
	// trade offsets (and the log agrees with the lie): only real time can
	// tell, and it must.
	for seed := range int64(10) {
		run := genRun(seed, []string{"r1"}, 300)
		var a, b = -1, -1
		for i, op := range run.History {
			if op.Kind != Append || op.Outcome != OK {
				continue
			}
			for j, op2 := range run.History {
				if op2.Kind == Append && op2.Outcome == OK && op.Return.Before(op2.Call) && op.Offset < op2.Offset {
					a, b = i, j
					break
				}
			}
			if a >= 0 {
				break
			}
		}
		if a < 0 {
			t.Fatalf("seed %d: no two sequential acks", seed)
		}
		oa, ob := run.History[a].Offset, run.History[b].Offset
		va, vb := run.History[a].Value, run.History[b].Value
		run.History[a].Offset, run.History[b].Offset = ob, oa
		run.History[a].Epoch, run.History[b].Epoch = run.History[b].Epoch, run.History[a].Epoch
		swap := func(recs []Record) {
			for i := range recs {
				// Values trade places; each offset keeps its epoch.
				switch recs[i].Offset {
				case oa:
					recs[i].Value = vb
				case ob:
					recs[i].Value = va
				}
			}
		}
		// Rewrite every copy of the log the run holds, so only the order
		// of operations in real time is wrong.
		log := append([]Record(nil), run.Final[0].Records...)
		swap(log)
		for i := range run.Final {
			run.Final[i].Records = log
		}
		for i := range run.History {
			if run.History[i].Kind == Read {
				recs := append([]Record(nil), run.History[i].Records...)
				swap(recs)
				run.History[i].Records = recs
			}
		}
		rep := Check(run)
		if rep.Linearizable != VerdictIllegal {
			t.Errorf("seed %d: swapped %d and %d: verdict %s", seed, oa, ob, rep.Linearizable)
		}
		if c := counts(rep); c["lost"]+c["duplicates"]+c["inconsistent"]+c["divergent"] != 0 {
			t.Errorf("seed %d: record checkers fired on a consistent log: %v", seed, c)
		}
	}
}
