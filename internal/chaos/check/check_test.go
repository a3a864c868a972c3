package check

import (
	"strings"
	"testing"
	"time"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
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

// counts names every safety column of a report.
func counts(r Report) map[string]int {
	return map[string]int{
		"lost": r.Lost, "duplicates": r.Duplicates, "inconsistent": r.InconsistentOffsets,
		"divergent": r.DivergentPrefixes, "hwm": r.HWMRegressions, "stale": r.StaleEpochAcceptances,
		"truncated": r.AckedTruncated, "failed-applied": r.FailedButApplied,
	}
}

// expect asserts that the safety columns are exactly want (absent: zero)
// and the verdict is verdict.
func expect(t *testing.T, rep Report, verdict Verdict, want map[string]int) {
	t.Helper()
	bad := false
	for name, got := range counts(rep) {
		if got != want[name] {
			t.Errorf("%s = %d, want %d", name, got, want[name])
			bad = true
		}
	}
	if rep.Linearizable != verdict {
		t.Errorf("linearizable = %s, want %s", rep.Linearizable, verdict)
		bad = true
	}
	wantSafe := verdict != VerdictIllegal
	for _, n := range want {
		if n > 0 {
			wantSafe = false
		}
	}
	if rep.Safe() != wantSafe {
		t.Errorf("Safe() = %v, want %v", rep.Safe(), wantSafe)
		bad = true
	}
	if !wantSafe && len(rep.Problems) == 0 {
		t.Errorf("unsafe report explains nothing")
		bad = true
	}
	if (bad || testing.Verbose()) && len(rep.Problems) > 0 {
		t.Logf("problems:\n%s", strings.Join(rep.Problems, "\n"))
	}
}

func TestLostBelowQuorum(t *testing.T) {
	run := cleanRun()
	// B and C never got c (offset 3): only A holds the acknowledged record.
	run.Final[1] = replica("B", theLog()[:3], 3)
	run.Final[2] = replica("C", theLog()[:3], 3)
	expect(t, Check(run), VerdictOK, map[string]int{"lost": 1})

	// Clean variant: B got c but has not learned it is committed yet; A
	// and B are a majority of three.
	run.Final[1] = replica("B", theLog(), 3)
	expect(t, Check(run), VerdictOK, nil)
}

// After a membership change the majority is of the voters: a removed
// replica (NotVoter) that lags makes up no majority, and is not needed for
// one; its committed prefix is still judged.
func TestLostCountsVotersOnly(t *testing.T) {
	run := cleanRun()
	// D was removed before c: it lags, and B, C and A (the voters) hold
	// everything. Four replicas, but the majority is two of three voters.
	run.Final = append(run.Final, replica("D", theLog()[:3], 3))
	run.Final[1] = replica("B", theLog()[:3], 3)
	run.Final[3].NotVoter = true
	expect(t, Check(run), VerdictOK, nil)

	// Only A and the removed D hold c: two of four, but one of three voters.
	run.Final[2] = replica("C", theLog()[:3], 3)
	run.Final[3] = replica("D", theLog(), 3)
	run.Final[3].NotVoter = true
	expect(t, Check(run), VerdictOK, map[string]int{"lost": 1})

	// A removed replica's committed prefix must not differ from the others'.
	run = cleanRun()
	run.Final = append(run.Final, replica("D", []Record{start(0, 1), rec(1, 1, "x")}, 2))
	run.Final[3].NotVoter = true
	expect(t, Check(run), VerdictOK, map[string]int{"divergent": 3, "inconsistent": 1, "lost": 1})
}

func TestLostOnReplicaPastItsOffset(t *testing.T) {
	run := cleanRun()
	// C's HWM says offset 2 is committed, but C holds nothing there. A and
	// B still form a quorum: the loss is C's committed prefix alone. The
	// hole is also a divergence from A and from B.
	log := theLog()
	run.Final[2] = replica("C", []Record{log[0], log[1], log[3]}, 4)
	expect(t, Check(run), VerdictOK, map[string]int{"lost": 1, "divergent": 2})
}

func TestLostReadRecord(t *testing.T) {
	run := cleanRun()
	// d's append timed out, then a read saw it committed at 4; no replica
	// has it. The read makes it a committed record, so it is lost.
	run.History = append(run.History,
		appendOp(1, "d", 0, 0, Unknown, 62, 64),
		readOp(2, 4, 5, []Record{rec(4, 1, "d")}, 90, 95))
	expect(t, Check(run), VerdictOK, map[string]int{"lost": 1})

	// Clean variant: the replicas have it.
	withD := append(theLog(), rec(4, 1, "d"))
	for i, name := range []string{"A", "B", "C"} {
		run.Final[i] = replica(name, withD, 5)
	}
	expect(t, Check(run), VerdictOK, nil)
}

func TestDuplicateInCommittedLog(t *testing.T) {
	run := cleanRun()
	// b, appended once, was written again at offset 4 on every replica.
	dup := append(theLog(), rec(4, 1, "b"))
	for i, name := range []string{"A", "B", "C"} {
		run.Final[i] = replica(name, dup, 5)
	}
	expect(t, Check(run), VerdictOK, map[string]int{"duplicates": 1})
}

func TestDuplicateInRead(t *testing.T) {
	run := cleanRun()
	// A read returns c at offset 4 as well; the final log has it only at 3.
	run.History = append(run.History, readOp(2, 3, 5, []Record{rec(3, 1, "c"), rec(4, 1, "c")}, 90, 95))
	rep := Check(run)
	if rep.Duplicates != 1 {
		t.Errorf("duplicates = %d, want 1", rep.Duplicates)
	}
	if rep.Linearizable != VerdictIllegal {
		t.Errorf("linearizable = %s, want illegal: the read returned c where it was not appended", rep.Linearizable)
	}
}

func TestInconsistentOffsetAckEpoch(t *testing.T) {
	run := cleanRun()
	// The ack of c names epoch 2; every replica holds c at 3 under epoch 1.
	run.History[2].Epoch = 2
	expect(t, Check(run), VerdictOK, map[string]int{"inconsistent": 1})
}

func TestInconsistentOffsetAcrossReplicas(t *testing.T) {
	run := cleanRun()
	// C holds another record at committed offset 3: one offset, two values.
	// That is also C diverging from A and B, and c missing on C.
	log := theLog()
	log[3] = rec(3, 1, "z")
	run.Final[2] = replica("C", log, 4)
	expect(t, Check(run), VerdictOK, map[string]int{"inconsistent": 1, "divergent": 2, "lost": 1})
}

func TestDivergentPrefixes(t *testing.T) {
	run := cleanRun()
	// C lacks the epoch-start record at 0 inside its committed prefix.
	// No client record differs, so only the prefix comparison sees it:
	// pairs (A,C) and (B,C).
	run.Final[2] = replica("C", theLog()[1:], 4)
	expect(t, Check(run), VerdictOK, map[string]int{"divergent": 2})

	// Clean variant: C lags (HWM 2) and has an uncommitted tail that
	// differs from A's; only [0,2) is compared with it.
	log := theLog()
	log[3] = rec(3, 2, "zz")
	run.Final[2] = replica("C", log, 2)
	expect(t, Check(run), VerdictOK, nil)
}

func TestHWMRegression(t *testing.T) {
	run := cleanRun()
	run.HWMs = append(run.HWMs, HWMSample{Replica: "A", Range: "r1", HWM: 3, At: at(70)})
	expect(t, Check(run), VerdictOK, map[string]int{"hwm": 1})

	// Clean variant: the lower sample is of the next incarnation, and
	// samples recorded out of time order are judged in time order.
	run = cleanRun()
	run.HWMs = append(run.HWMs,
		HWMSample{Replica: "A", Incarnation: 1, Range: "r1", HWM: 3, At: at(70)},
		HWMSample{Replica: "A", Range: "r1", HWM: 0, At: at(1)})
	expect(t, Check(run), VerdictOK, nil)
}

func TestStaleEpochAcceptance(t *testing.T) {
	fence2 := EpochEvent{Replica: "A", Range: "r1", Kind: Fenced, Epoch: 2, Call: at(100), Return: at(101)}
	for _, tc := range []struct {
		name  string
		event EpochEvent
		want  int
	}{
		{"ack below fence after it", EpochEvent{Replica: "A", Range: "r1", Kind: Acked, Epoch: 1, Call: at(110), Return: at(111)}, 1},
		{"truncate below fence", EpochEvent{Replica: "A", Range: "r1", Kind: Truncated, Epoch: 1, Call: at(102), Return: at(103)}, 1},
		{"served fetch below fence", EpochEvent{Replica: "A", Range: "r1", Kind: ServedFetch, Epoch: 1, Call: at(200), Return: at(201)}, 1},
		{"fence below an earlier fence", EpochEvent{Replica: "A", Range: "r1", Kind: Fenced, Epoch: 1, Call: at(150), Return: at(151)}, 1},
		{"fence again at the fenced epoch", EpochEvent{Replica: "A", Range: "r1", Kind: Fenced, Epoch: 2, Call: at(150), Return: at(151)}, 0},
		{"adopt at the fenced epoch", EpochEvent{Replica: "A", Range: "r1", Kind: Adopted, Epoch: 2, Call: at(102), Return: at(103)}, 0},
		{"ack concurrent with the fence", EpochEvent{Replica: "A", Range: "r1", Kind: Acked, Epoch: 1, Call: at(100), Return: at(105)}, 0},
		{"ack below fence on another replica", EpochEvent{Replica: "B", Range: "r1", Kind: Acked, Epoch: 1, Call: at(110), Return: at(111)}, 0},
		{"ack below fence of another range", EpochEvent{Replica: "A", Range: "r2", Kind: Acked, Epoch: 1, Call: at(110), Return: at(111)}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := cleanRun()
			run.Epochs = append(run.Epochs, fence2, tc.event)
			expect(t, Check(run), VerdictOK, map[string]int{"stale": tc.want})
		})
	}
}

func TestAckedTruncated(t *testing.T) {
	run := cleanRun()
	// At epoch 2, A was cut to 2 though its history says offsets 2 and 3
	// (b and c, acknowledged under epoch 1) were written by epoch 1: one
	// truncation removing two acknowledged records.
	run.Truncations = []Truncation{{Replica: "A", Range: "r1", Epoch: 2, To: 2, LogEnd: 4,
		History: []EpochStart{{Epoch: 1, Start: 0}}}}
	expect(t, Check(run), VerdictOK, map[string]int{"truncated": 1})

	// Clean variants: A's records from 2 on were a deposed epoch 3's
	// tail (not the acknowledged ones); a truncation at the log end; an
	// unknown history.
	for _, tr := range []Truncation{
		{Replica: "A", Range: "r1", Epoch: 4, To: 2, LogEnd: 4, History: []EpochStart{{Epoch: 1, Start: 0}, {Epoch: 3, Start: 2}}},
		{Replica: "A", Range: "r1", Epoch: 2, To: 4, LogEnd: 6, History: []EpochStart{{Epoch: 1, Start: 0}}},
		{Replica: "A", Range: "r1", Epoch: 2, To: 2, LogEnd: 4},
	} {
		run.Truncations = []Truncation{tr}
		expect(t, Check(run), VerdictOK, nil)
	}
}

func TestFailedButApplied(t *testing.T) {
	run := cleanRun()
	// x was refused, yet A stores it in its uncommitted tail.
	run.History = append(run.History, appendOp(1, "x", 0, 0, Failed, 62, 63))
	run.Final[0] = replica("A", append(theLog(), rec(4, 1, "x")), 4)
	expect(t, Check(run), VerdictOK, map[string]int{"failed-applied": 1})

	// Clean variant: nobody stores it.
	run.Final[0] = replica("A", theLog(), 4)
	expect(t, Check(run), VerdictOK, nil)
}

func TestStaleReadIsIllegal(t *testing.T) {
	run := cleanRun()
	// After c was acknowledged at 3, a read answers HWM 3: c is not
	// committed as far as that read knows. Its records are consistent;
	// only its place in time is wrong.
	run.History = append(run.History, readOp(2, 0, 3, theLog()[:3], 90, 95))
	rep := Check(run)
	expect(t, rep, VerdictIllegal, nil)
	if len(rep.IllegalRanges) != 1 || rep.IllegalRanges[0] != "r1" {
		t.Errorf("IllegalRanges = %v, want [r1]", rep.IllegalRanges)
	}
}

func TestReadHWMSteppingBackIsIllegal(t *testing.T) {
	run := cleanRun()
	// c's append is still in flight (unknown) and committed; one read sees
	// it, a later one answers an HWM below it.
	run.History[2] = appendOp(0, "c", 0, 0, Unknown, 50, 200)
	run.History[3] = readOp(2, 3, 4, []Record{rec(3, 1, "c")}, 70, 80)
	run.History = append(run.History, readOp(2, 0, 3, theLog()[:3], 90, 95))
	expect(t, Check(run), VerdictIllegal, nil)
}

func TestUnknownAppendSeenByReadIsLegal(t *testing.T) {
	run := cleanRun()
	// d timed out; a later read returns it: it happened.
	run.History = append(run.History,
		appendOp(1, "d", 0, 0, Unknown, 62, 64),
		readOp(2, 0, 5, append(theLog(), rec(4, 1, "d")), 90, 95))
	withD := append(theLog(), rec(4, 1, "d"))
	for i, name := range []string{"A", "B", "C"} {
		run.Final[i] = replica(name, withD, 5)
	}
	expect(t, Check(run), VerdictOK, nil)

	// And one that appears nowhere did not happen: also legal.
	run = cleanRun()
	run.History = append(run.History, appendOp(1, "e", 0, 0, Unknown, 62, 64),
		appendOp(1, "f", 0, 0, Failed, 65, 66))
	expect(t, Check(run), VerdictOK, nil)
}

func TestRealTimeOrderViolationIsIllegal(t *testing.T) {
	run := cleanRun()
	// a was acknowledged (at 20) before b was called (at 30), yet a sits
	// after b. The log is consistent everywhere; only real time says no.
	log := []Record{start(0, 1), rec(1, 1, "b"), rec(2, 1, "a"), rec(3, 1, "c")}
	run.History = []Op{
		appendOp(0, "a", 2, 1, OK, 10, 20),
		appendOp(1, "b", 1, 1, OK, 30, 40),
		appendOp(0, "c", 3, 1, OK, 50, 60),
		readOp(2, 0, 4, log, 70, 80),
	}
	for i, name := range []string{"A", "B", "C"} {
		run.Final[i] = replica(name, log, 4)
	}
	rep := Check(run)
	expect(t, rep, VerdictIllegal, nil)

	// Clean variant: a and b concurrent, so b may go first.
	run.History[1].Call = at(15)
	expect(t, Check(run), VerdictOK, nil)
}

func TestReadOfUnwrittenValueIsIllegal(t *testing.T) {
	run := cleanRun()
	// A read returns a value that no append sent.
	run.History = append(run.History, readOp(2, 3, 4, []Record{rec(3, 1, "q")}, 90, 95))
	rep := Check(run)
	if rep.Linearizable != VerdictIllegal {
		t.Errorf("linearizable = %s, want illegal", rep.Linearizable)
	}
	if !strings.Contains(strings.Join(rep.Problems, "\n"), `"q" at offset 3, which no OK or resolved append wrote`) {
		t.Errorf("problems do not name the read value:\n%s", strings.Join(rep.Problems, "\n"))
	}
}

func TestLimitedReadVouchesOnlyForWhatItReturned(t *testing.T) {
	run := cleanRun()
	lim := readOp(2, 0, 4, theLog()[:2], 90, 95)
	lim.Limited = true
	run.History = append(run.History, lim)
	expect(t, Check(run), VerdictOK, nil)

	// Not limited, the same answer left out b and c.
	run.History[len(run.History)-1].Limited = false
	expect(t, Check(run), VerdictIllegal, nil)
}

func TestVoid(t *testing.T) {
	for _, tc := range []struct {
		mutate func(*Run)
		want   string
	}{
		{func(*Run) {}, ""},
		{func(r *Run) { r.TrafficBefore = 0 }, "no traffic before faults"},
		{func(r *Run) { r.TrafficDuring = 0 }, "no traffic during faults"},
		{func(r *Run) { r.FinalAppendOK = false }, "final append failed"},
	} {
		run := cleanRun()
		tc.mutate(&run)
		if got := run.Void(); got != tc.want {
			t.Errorf("Void() = %q, want %q", got, tc.want)
		}
		if run.Counts() != (tc.want == "") {
			t.Errorf("Counts() = %v with void %q", run.Counts(), tc.want)
		}
		if got := Check(run).Void; got != tc.want {
			t.Errorf("Report.Void = %q, want %q", got, tc.want)
		}
	}
}

func TestProblemsAreBounded(t *testing.T) {
	run := cleanRun()
	// Nobody but A has anything: a, b and c are all lost.
	run.Final[1] = replica("B", nil, 0)
	run.Final[2] = replica("C", nil, 0)
	rep := CheckWith(run, Options{MaxProblems: 1})
	if rep.Lost != 3 {
		t.Fatalf("lost = %d, want 3", rep.Lost)
	}
	want := []string{
		`lost: range r1 offset 1 value "a" (ack to client 0): held by 1 of 3 replicas, quorum 2`,
		"lost: ... and 2 more",
	}
	if strings.Join(rep.Problems, "\n") != strings.Join(want, "\n") {
		t.Errorf("problems =\n%s\nwant\n%s", strings.Join(rep.Problems, "\n"), strings.Join(want, "\n"))
	}
}

func TestReadPastItsHWMOrOutOfOrderIsIllegal(t *testing.T) {
	for _, tc := range []struct {
		name string
		recs []Record
		want string
	}{
		// An uncommitted epoch-start record served by a read: no client
		// record is involved, only the HWM bound.
		{"record at hwm", append(theLog(), start(4, 2)), "returned offset 4, at or past its own hwm 4"},
		{"out of order", []Record{start(0, 1), rec(2, 1, "b"), rec(1, 1, "a"), rec(3, 1, "c")}, "returned offset 1 after offset 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := cleanRun()
			run.History[3].Records = tc.recs
			rep := Check(run)
			if rep.Linearizable != VerdictIllegal {
				t.Errorf("linearizable = %s, want illegal", rep.Linearizable)
			}
			if !strings.Contains(strings.Join(rep.Problems, "\n"), tc.want) {
				t.Errorf("problems lack %q:\n%s", tc.want, strings.Join(rep.Problems, "\n"))
			}
		})
	}
}

func TestLinearizabilityTimeoutIsUnknown(t *testing.T) {
	// a was acknowledged before b was called but sits after it: illegal,
	// but only real time says so. Thirty reads of the still-empty log,
	// concurrent with a, commute; to prove no order works the search tries
	// every subset of them, far longer than the bound given.
	run := Run{Seed: 1}
	for i := range 30 {
		run.History = append(run.History, readOp(i, 0, 0, nil, 0, 1000))
	}
	run.History = append(run.History,
		appendOp(30, "a", 2, 1, OK, 0, 10),
		appendOp(31, "b", 1, 1, OK, 20, 1000))
	log := []Record{start(0, 1), rec(1, 1, "b"), rec(2, 1, "a")}
	run.Final = []ReplicaLog{replica("A", log, 3), replica("B", log, 3), replica("C", log, 3)}
	begin := time.Now()
	rep := CheckWith(run, Options{LinearizabilityTimeout: 100 * time.Millisecond})
	expect(t, rep, VerdictUnknown, nil)
	if took := time.Since(begin); took > 10*time.Second {
		t.Errorf("check took %s with a 100ms bound", took)
	}
	if !strings.Contains(strings.Join(rep.Problems, "\n"), "search timed out after 100ms") {
		t.Errorf("problems do not say the search timed out: %q", rep.Problems)
	}
}

func TestStaticallyIllegalReadIsIllegalEvenOnTimeout(t *testing.T) {
	// The same hard search, plus a read returning a value nobody
	// appended: that read can never linearize, so the verdict is illegal
	// whether or not the search finishes.
	run := Run{Seed: 1}
	for i := range 30 {
		run.History = append(run.History, readOp(i, 0, 0, nil, 0, 1000))
	}
	log := []Record{start(0, 1), rec(1, 1, "b"), rec(2, 1, "a")}
	run.History = append(run.History,
		appendOp(30, "a", 2, 1, OK, 0, 10),
		appendOp(31, "b", 1, 1, OK, 20, 1000),
		readOp(32, 0, 3, []Record{log[0], log[1], rec(2, 1, "q")}, 2000, 2001))
	run.Final = []ReplicaLog{replica("A", log, 3), replica("B", log, 3), replica("C", log, 3)}
	rep := CheckWith(run, Options{LinearizabilityTimeout: 100 * time.Millisecond})
	if rep.Linearizable != VerdictIllegal || len(rep.IllegalRanges) != 1 || rep.IllegalRanges[0] != "r1" {
		t.Errorf("linearizable = %s %v, want illegal [r1]\n%s", rep.Linearizable, rep.IllegalRanges, strings.Join(rep.Problems, "\n"))
	}
}

func TestTwoAcksAtOneOffsetAreIllegal(t *testing.T) {
	run := cleanRun()
	// b's ack names a's offset; the log has b at 2.
	run.History[1].Offset = 1
	rep := Check(run)
	if rep.Linearizable != VerdictIllegal || rep.InconsistentOffsets != 1 {
		t.Errorf("linearizable = %s, inconsistent = %d; want illegal, 1", rep.Linearizable, rep.InconsistentOffsets)
	}
	if !strings.Contains(strings.Join(rep.Problems, "\n"), `appends "a" and "b" both took effect at offset 1`) {
		t.Errorf("problems:\n%s", strings.Join(rep.Problems, "\n"))
	}
}

// TestLivenessBound pins the in-process harness's bound to its derivation
// (check.LivenessBound's comment): 2 x TTL, detection, three attempts.
func TestLivenessBound(t *testing.T) {
	got := LivenessBound(LivenessTimings{LeaseTTL: 2 * time.Second, StatusInterval: time.Second, ProbeInterval: 100 * time.Millisecond,
		ProbeTimeout: 300 * time.Millisecond, ProbeMisses: 3, FenceTimeout: time.Second, RPCTimeout: 2 * time.Second, RetryMax: 2 * time.Second})
	if want := 26600 * time.Millisecond; got != want {
		t.Errorf("LivenessBound = %v, want %v", got, want)
	}
}

// TestLivenessStuck: each way a range can fail to come back is one stuck
// range with its own description; a live range is none.
func TestLivenessStuck(t *testing.T) {
	run := cleanRun()
	run.Liveness = []Liveness{
		{Range: "live", Appended: true, Read: true, Agreed: true},
		{Range: "noappend", Read: true, Agreed: true, Detail: "x"},
		{Range: "noread", Appended: true, Agreed: true},
		{Range: "disagree", Appended: true, Read: true},
	}
	rep := Check(run)
	if rep.Stuck != 3 || !rep.Safe() {
		t.Fatalf("Stuck = %d, Safe() = %v, want 3, true", rep.Stuck, rep.Safe())
	}
	all := strings.Join(rep.Problems, "\n")
	for _, want := range []string{"range noappend: no append acknowledged", "range noread: appended, but no read answered",
		"range disagree: served, but the promoter's view never agreed"} {
		if !strings.Contains(all, want) {
			t.Errorf("problems lack %q:\n%s", want, all)
		}
	}
	if strings.Contains(all, "range live") {
		t.Errorf("a live range reported stuck:\n%s", all)
	}
}

// TestPromoterAgrees: the wedge (healthy, but the leader's lease is not
// valid) and a stale healthy view disagree; a promoter not claiming health
// claims nothing to disagree with.
func TestPromoterAgrees(t *testing.T) {
	leader := func(epoch uint64, valid bool) *tenurev1.RangeStatus {
		return &tenurev1.RangeStatus{Role: tenurev1.Role_ROLE_LEADER, Epoch: epoch, FencedEpoch: epoch, LeaseValid: valid}
	}
	follower := &tenurev1.RangeStatus{Role: tenurev1.Role_ROLE_FOLLOWER, Epoch: 3, FencedEpoch: 3}
	healthy := &tenurev1.RangePromotionState{State: "healthy", Epoch: 2, LeaderId: "A"}
	for _, tc := range []struct {
		name           string
		ps             *tenurev1.RangePromotionState
		sts            map[string]*tenurev1.RangeStatus
		agrees, health bool
	}{
		{"serving", healthy, map[string]*tenurev1.RangeStatus{"A": leader(2, true)}, true, true},
		{"wedge", healthy, map[string]*tenurev1.RangeStatus{"A": leader(2, false)}, false, true},
		{"stale epoch", healthy, map[string]*tenurev1.RangeStatus{"A": follower, "B": leader(3, true)}, false, true},
		{"leader silent", healthy, map[string]*tenurev1.RangeStatus{"B": leader(3, true)}, false, true},
		{"unavailable", &tenurev1.RangePromotionState{State: "unavailable", Epoch: 2, LeaderId: "A"}, map[string]*tenurev1.RangeStatus{"A": leader(2, false)}, true, false},
		{"unknown range", nil, nil, false, false},
	} {
		agrees, health, view := PromoterAgrees(tc.ps, tc.sts)
		if agrees != tc.agrees || health != tc.health {
			t.Errorf("%s: PromoterAgrees = %v, %v (%s), want %v, %v", tc.name, agrees, health, view, tc.agrees, tc.health)
		}
	}
}
