package check

import "testing"

// The retention fixtures: epoch 1 starts at 0, client records a..e at
// 1..5, all committed (HWM 6), acknowledged one after the other. Retention
// moved the log start to 3 on some replicas: a and b were deleted there on
// purpose.

// fullLog is a new copy of the whole log each time: fixtures change theirs.
func fullLog() []Record {
	return []Record{start(0, 1), rec(1, 1, "a"), rec(2, 1, "b"), rec(3, 1, "c"), rec(4, 1, "d"), rec(5, 1, "e")}
}

// trimmed is a replica whose log starts at from (every record below it
// deleted by retention) and ends at end, with HWM hwm.
func trimmed(name string, from, end, hwm uint64) ReplicaLog {
	l := replica(name, fullLog()[from:end], hwm)
	l.LogStart, l.LogEnd = from, end
	return l
}

// belowReadOp is a read from from that the replica answered OutOfRange
// below its log start logStart.
func belowReadOp(client int, from, logStart uint64, call, ret int) Op {
	return Op{Client: client, Range: "r1", Kind: Read, Offset: from, BelowLogStart: true, LogStart: logStart,
		Outcome: OK, Call: at(call), Return: at(ret)}
}

// retentionRun is a clean run with retention: every replica's log starts
// at 3; a reader got OutOfRange from 0 (log start 3), then read from 3.
func retentionRun() Run {
	run := cleanRun()
	run.History = nil
	for i, v := range []string{"a", "b", "c", "d", "e"} {
		run.History = append(run.History, appendOp(i%2, v, uint64(i+1), 1, OK, 10+20*i, 20+20*i))
	}
	read := readOp(2, 3, 6, fullLog()[3:], 130, 140)
	read.LogStart = 3
	run.History = append(run.History, belowReadOp(2, 0, 3, 110, 120), read)
	run.Final = []ReplicaLog{trimmed("A", 3, 6, 6), trimmed("B", 3, 6, 6), trimmed("C", 3, 6, 6)}
	return run
}

func TestRetentionRunIsSafe(t *testing.T) {
	rep := Check(retentionRun())
	mustBeClean(t, rep)
	// a and b are below the reported log start 3: excused as deleted.
	if rep.Trimmed != 2 {
		t.Errorf("Trimmed = %d, want 2 (a and b, below the log start 3)", rep.Trimmed)
	}
	if got := rep.OpsByOutcome[Read][OK]; got != 2 {
		t.Errorf("read ok = %d, want 2 (the answer below the log start is a normal answer)", got)
	}
}

// (a) An acknowledged record below the reported log start, absent from
// every replica, was deleted on purpose. The log start must be one a
// replica reported: the same logs reporting log start 0 lose a and b.
func TestAckedBelowLogStartIsNotLost(t *testing.T) {
	run := retentionRun()
	expect(t, Check(run), VerdictOK, nil)

	// The same records missing, but no replica says it deleted them: the
	// log start is never inferred from a missing record. Each committed
	// prefix [0, 6) lacks a and b, and has holes at 0..2, which the
	// prefix comparison counts for every pair.
	for i := range run.Final {
		run.Final[i].LogStart = 0
	}
	run.History = run.History[:5] // no read reported a log start either
	expect(t, Check(run), VerdictOK, map[string]int{"lost": 2, "divergent": 3})
}

// (b) An acknowledged record at or above the reported log start that is
// missing, or has other bytes, is still lost.
func TestAckedAboveLogStartMissingIsLost(t *testing.T) {
	// d and e (4, 5) never reached B and C: only A holds them. The log
	// start 3 excuses a and b only.
	run := retentionRun()
	run.Final[1] = trimmed("B", 3, 4, 4)
	run.Final[2] = trimmed("C", 3, 4, 4)
	rep := Check(run)
	expect(t, rep, VerdictOK, map[string]int{"lost": 2})
	if rep.Trimmed != 2 {
		t.Errorf("Trimmed = %d, want 2", rep.Trimmed)
	}

	// c sits exactly at the log start: the first offset kept, not a
	// deleted one. Every replica holding another record there loses it.
	run = retentionRun()
	for i, name := range []string{"A", "B", "C"} {
		l := trimmed(name, 3, 6, 6)
		l.Records[0] = rec(3, 1, "z")
		run.Final[i] = l
	}
	run.History = run.History[:5]
	expect(t, Check(run), VerdictOK, map[string]int{"lost": 1, "inconsistent": 1})
}

// A read's reported log start excuses what is below it and nothing above:
// here only the read says the log starts at 3 (A's log was not read; B and
// C restarted empty and lag), so a and b are deleted on purpose, and c, d
// and e, which no quorum holds, are lost.
func TestReadLogStartExcusesOnlyBelowIt(t *testing.T) {
	run := retentionRun()
	run.History = run.History[:6] // the acks and the read below the log start
	run.Final = []ReplicaLog{trimmed("B", 0, 0, 0), trimmed("C", 0, 0, 0)}
	rep := Check(run)
	expect(t, rep, VerdictOK, map[string]int{"lost": 3})
	if rep.Trimmed != 2 {
		t.Errorf("Trimmed = %d, want 2 (a and b, below the read's log start 3)", rep.Trimmed)
	}

	// Without the read, nothing says a and b were deleted: all five lost.
	run.History = run.History[:5]
	rep = Check(run)
	expect(t, rep, VerdictOK, map[string]int{"lost": 5})
	if rep.Trimmed != 0 {
		t.Errorf("Trimmed = %d, want 0", rep.Trimmed)
	}
}

// (c) A record below one replica's log start, present on another, is no
// divergence: committed prefixes are compared over [max(LogStart),
// min(HWM)). The replica that still holds it is held to its bytes.
func TestTrimmedOnOneReplicaIsNoDivergence(t *testing.T) {
	run := retentionRun()
	run.Final = []ReplicaLog{trimmed("A", 3, 6, 6), trimmed("B", 0, 6, 6), trimmed("C", 1, 6, 6)}
	rep := Check(run)
	expect(t, rep, VerdictOK, nil)
	// Trimmed follows the highest reported log start (A's and the read's, 3).
	if rep.Trimmed != 2 {
		t.Errorf("Trimmed = %d, want 2", rep.Trimmed)
	}

	// B still holds offset 2, committed, but with other bytes than the
	// acknowledged b: lost there, and two records at one offset. C, whose
	// log starts at 1, holds b: B and C diverge; A (from 3) diverges from
	// neither.
	run.Final[1].Records[2] = rec(2, 1, "x")
	expect(t, Check(run), VerdictOK, map[string]int{"lost": 1, "inconsistent": 1, "divergent": 1})
}

// A read answered below the log start L says every record below L was
// committed when it was answered: answered before an append below L was
// even called, it cannot linearize.
func TestBelowLogStartAheadOfTheLogIsIllegal(t *testing.T) {
	run := retentionRun()
	// The answer below log start 6 came at 5 ms: e (at 5) was called at 90.
	run.History = append(run.History, belowReadOp(3, 0, 6, 1, 5))
	expect(t, Check(run), VerdictIllegal, nil)

	// Answered after e returned (at 100): legal.
	run.History[len(run.History)-1] = belowReadOp(3, 0, 6, 101, 105)
	expect(t, Check(run), VerdictOK, nil)
}

func TestReadsContradictingTheirLogStartAreIllegal(t *testing.T) {
	// Refused as below the log start 3, though it read from 3.
	run := retentionRun()
	run.History = append(run.History, belowReadOp(3, 3, 3, 150, 160))
	expect(t, Check(run), VerdictIllegal, nil)

	// Served records from 2 while answering that the log starts at 3.
	run = retentionRun()
	read := readOp(3, 2, 6, fullLog()[2:], 150, 160)
	read.LogStart = 3
	run.History = append(run.History, read)
	expect(t, Check(run), VerdictIllegal, nil)

	// Answered a log start above its own HWM: retention removes only
	// committed records.
	run = retentionRun()
	read = readOp(3, 6, 6, nil, 150, 160)
	read.LogStart = 7
	run.History = append(run.History, read)
	expect(t, Check(run), VerdictIllegal, nil)
}
