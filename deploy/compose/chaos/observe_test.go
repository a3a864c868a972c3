package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tenurelog/tenure/internal/chaos/check"
)

// dumpRecords are the records of the fixture's range as `tenurectl log
// dump --json` prints them (cmd/tenurectl/logdump.go: logRecordJSON): an
// epoch-start record at 0, client records a..d at 1..4 and, at 5, a value
// that is not UTF-8, printed in value_base64 ("/w==" is 0xff).
var dumpRecords = []string{
	`{"offset": 0, "epoch": 1, "epoch_start": true, "committed": true, "value": ""}`,
	`{"offset": 1, "epoch": 1, "epoch_start": false, "committed": true, "value": "a"}`,
	`{"offset": 2, "epoch": 1, "epoch_start": false, "committed": true, "value": "b"}`,
	`{"offset": 3, "epoch": 1, "epoch_start": false, "committed": true, "value": "c"}`,
	`{"offset": 4, "epoch": 1, "epoch_start": false, "committed": true, "value": "d"}`,
	`{"offset": 5, "epoch": 1, "epoch_start": false, "committed": true, "value": "", "value_base64": "/w=="}`,
}

// dump is tenurectl's JSON dump (logDumpJSON) of a replica whose log holds
// [start, end) with HWM hwm: retention deleted everything below start.
func dump(start, end, hwm uint64) string {
	return fmt.Sprintf(`{
  "data_dir": "/tmp/chaos/kill-leader/replica-1/data",
  "range_id": "chaos-1",
  "log_start": %d,
  "log_end": %d,
  "high_water_mark": %d,
  "fenced_epoch": 1,
  "epoch": 1,
  "role": "follower",
  "leader_id": "replica-2",
  "history": [{"epoch": 1, "start": 0}],
  "records": [%s],
  "replicas": [{"id": "replica-1", "address": "http://replica-1:7100"}],
  "ranges_in_store": ["chaos-1"]
}`, start, end, hwm, strings.Join(dumpRecords[start:end], ",\n    "))
}

func TestParseTrimmedLogDump(t *testing.T) {
	l, err := parseLogDump("replica-1", []byte(dump(3, 6, 6)))
	if err != nil {
		t.Fatal(err)
	}
	if l.Replica != "replica-1" || l.Range != "chaos-1" || l.LogStart != 3 || l.LogEnd != 6 || l.HWM != 6 || l.FencedEpoch != 1 {
		t.Errorf("parseLogDump = %+v, want replica-1 of chaos-1, log [3, 6), HWM 6, fenced at 1", l)
	}
	if len(l.History) != 1 || l.History[0] != (check.EpochStart{Epoch: 1, Start: 0}) {
		t.Errorf("history = %v, want [{1 0}]", l.History)
	}
	want := []check.Record{{Offset: 3, Epoch: 1, Value: []byte("c")}, {Offset: 4, Epoch: 1, Value: []byte("d")}, {Offset: 5, Epoch: 1, Value: []byte{0xff}}}
	if fmt.Sprint(l.Records) != fmt.Sprint(want) {
		t.Errorf("records = %v, want %v", l.Records, want)
	}
	if _, err := parseLogDump("replica-1", []byte(`{"log_start": "three"}`)); err == nil {
		t.Errorf("parseLogDump accepted a log_start that is not a number")
	}
}

// The container chaos's final logs, read through tenurectl, are judged by
// the shared checker like the in-process ones: what retention deleted
// below a replica's log start is not lost, and a record above it that a
// quorum lacks is.
func TestTrimmedLogDumpsJudgedByTheSharedChecker(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	run := check.Run{Seed: 1, TrafficBefore: 1, TrafficDuring: 1, FinalAppendOK: true}
	for i, v := range [][]byte{[]byte("a"), []byte("b"), []byte("c"), []byte("d"), {0xff}} {
		call := t0.Add(time.Duration(10*i) * time.Millisecond)
		run.History = append(run.History, check.Op{Client: 0, Range: "chaos-1", Kind: check.Append, Value: v,
			Offset: uint64(i + 1), Epoch: 1, Outcome: check.OK, Call: call, Return: call.Add(5 * time.Millisecond)})
	}
	final := func(dumps map[string]string) []check.ReplicaLog {
		var out []check.ReplicaLog
		for _, id := range replicaIDs {
			l, err := parseLogDump(id, []byte(dumps[id]))
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, l)
		}
		return out
	}

	// replica-1 and replica-3 were trimmed to 3, replica-2 to 1: a and b
	// are below the reported log start 3, and only replica-2 holds b.
	run.Final = final(map[string]string{"replica-1": dump(3, 6, 6), "replica-2": dump(1, 6, 6), "replica-3": dump(3, 6, 6)})
	rep := check.Check(run)
	if !rep.Safe() || rep.Trimmed != 2 {
		t.Errorf("trimmed dumps: Safe() = %v, Trimmed = %d, want true, 2; problems:\n%s", rep.Safe(), rep.Trimmed, strings.Join(rep.Problems, "\n"))
	}

	// The 0xff record at 5, above the log start, reached only replica-1.
	run.Final = final(map[string]string{"replica-1": dump(3, 6, 6), "replica-2": dump(3, 5, 5), "replica-3": dump(3, 5, 5)})
	rep = check.Check(run)
	if rep.Lost != 1 {
		t.Errorf("a record above the log start on one replica of three: Lost = %d, want 1; problems:\n%s", rep.Lost, strings.Join(rep.Problems, "\n"))
	}
}
