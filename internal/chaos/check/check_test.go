package check

import (
	"strings"
	"testing"
	"time"
)

// t0 is the fixtures' clock origin; at(n) is n milliseconds after it.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func rec(o, e uint64, v string) Record { return Record{Offset: o, Epoch: e, Value: []byte(v)} }

func start(o, e uint64) Record { return Record{Offset: o, Epoch: e, EpochStart: true} }

func appendOp(client int, v string, o, e uint64, out Outcome, call, ret int) Op {
	return Op{Client: client, Range: "r1", Kind: Append, Value: []byte(v), Offset: o, Epoch: e,
		Outcome: out, Call: at(call), Return: at(ret)}
}

func readOp(client int, from, hwm uint64, recs []Record, call, ret int) Op {
	return Op{Client: client, Range: "r1", Kind: Read, Offset: from, HWM: hwm, Records: recs,
		Outcome: OK, Call: at(call), Return: at(ret)}
}

// theLog is the committed log of the clean run: epoch 1 starts at 0,
// client records a, b, c at 1, 2, 3.
func theLog() []Record {
	return []Record{start(0, 1), rec(1, 1, "a"), rec(2, 1, "b"), rec(3, 1, "c")}
}

func replica(name string, recs []Record, hwm uint64) ReplicaLog {
	end := uint64(0)
	if n := len(recs); n > 0 {
		end = recs[n-1].Offset + 1
	}
	return ReplicaLog{Replica: name, Range: "r1", LogEnd: end, HWM: hwm, FencedEpoch: 1,
		History: []EpochStart{{Epoch: 1, Start: 0}}, Records: recs}
}

// cleanRun is a small run that breaks nothing: three sequential appends,
// a full read, three identical replicas, rising HWMs, one promotion.
func cleanRun() Run {
	return Run{
		Seed:          7,
		Faults:        map[string]int{"kill": 1},
		TrafficBefore: 2, TrafficDuring: 2, FinalAppendOK: true,
		History: []Op{
			appendOp(0, "a", 1, 1, OK, 10, 20),
			appendOp(1, "b", 2, 1, OK, 30, 40),
			appendOp(0, "c", 3, 1, OK, 50, 60),
			readOp(2, 0, 4, theLog(), 70, 80),
		},
		Final: []ReplicaLog{replica("A", theLog(), 4), replica("B", theLog(), 4), replica("C", theLog(), 4)},
		HWMs: []HWMSample{
			{Replica: "A", Range: "r1", HWM: 1, At: at(5)},
			{Replica: "A", Range: "r1", HWM: 2, At: at(25)},
			{Replica: "A", Range: "r1", HWM: 4, At: at(65)},
		},
		Epochs: []EpochEvent{
			{Replica: "A", Range: "r1", Kind: Fenced, Epoch: 1, Call: at(0), Return: at(1)},
			{Replica: "A", Range: "r1", Kind: Adopted, Epoch: 1, Call: at(2), Return: at(3)},
			{Replica: "A", Range: "r1", Kind: Acked, Epoch: 1, Call: at(10), Return: at(20)},
		},
	}
}

func mustBeClean(t *testing.T, rep Report) {
	t.Helper()
	if !rep.Safe() || rep.Linearizable != VerdictOK || len(rep.Problems) > 0 {
		t.Fatalf("clean run judged unsafe: %+v\nproblems:\n%s", rep, strings.Join(rep.Problems, "\n"))
	}
}

func TestCleanRunIsSafe(t *testing.T) {
	rep := Check(cleanRun())
	mustBeClean(t, rep)
	if rep.Void != "" {
		t.Errorf("Void = %q, want counted", rep.Void)
	}
	if got := rep.OpsByOutcome[Append][OK]; got != 3 {
		t.Errorf("append ok = %d, want 3", got)
	}
	if got := rep.OpsByOutcome[Read][OK]; got != 1 {
		t.Errorf("read ok = %d, want 1", got)
	}
}
