package promoter_test

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/services/promoter"
)

// hist builds an epoch history from (epoch, start) pairs.
func hist(pairs ...uint64) []journal.EpochStart {
	if len(pairs)%2 != 0 {
		panic("hist: odd number of values")
	}
	var h []journal.EpochStart
	for i := 0; i < len(pairs); i += 2 {
		h = append(h, journal.EpochStart{Epoch: pairs[i], Start: pairs[i+1]})
	}
	return h
}

// fenced is a fenced replica's answer with history h.
func fenced(id string, logEnd, hwm uint64, h []journal.EpochStart) promoter.Answer {
	return promoter.Answer{ReplicaID: id, LogEnd: logEnd, HWM: hwm, History: h}
}

// refused is a replica that was not fenced.
func refused(id string) promoter.Answer {
	return promoter.Answer{ReplicaID: id, Err: errors.New("connection refused")}
}

// older is an older-version replica that was fenced but does not report its
// history.
func older(id string, logEnd, hwm uint64) promoter.Answer {
	return promoter.Answer{ReplicaID: id, Unimplemented: true, LogEnd: logEnd, HWM: hwm}
}

func ids(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "r" + string(rune('1'+i))
	}
	return out
}

// want is the part of a Plan a case states.
type want struct {
	candidate    string
	bound        uint64
	truncations  []promoter.Truncation
	followers    []string
	unreconciled []string
}

func TestDecide(t *testing.T) {
	tests := []struct {
		name string
		in   promoter.Input
		want want
	}{
		{
			name: "fresh range, all empty: lowest id leads",
			in: promoter.Input{Replicas: ids(3), Epoch: 1, Answers: []promoter.Answer{
				fenced("r1", 0, 0, nil), fenced("r2", 0, 0, nil), fenced("r3", 0, 0, nil),
			}},
			want: want{candidate: "r1", followers: []string{"r2", "r3"}},
		},
		{
			name: "fresh range, all empty: preferred leads",
			in: promoter.Input{Replicas: ids(3), Epoch: 1, Preferred: "r2", Answers: []promoter.Answer{
				fenced("r1", 0, 0, nil), fenced("r2", 0, 0, nil), fenced("r3", 0, 0, nil),
			}},
			want: want{candidate: "r2", followers: []string{"r1", "r3"}},
		},
		{
			// r3 journaled e24 at 871 as leader and lost power before its
			// epoch-start record (Open keeps an entry starting at the log
			// end), then led e25 from 871; r2 followed e25 only. Both hold
			// e25's records from 871 and committed up to 875: the same log,
			// not a divergence at 871 below their HWMs (the range stayed
			// unpromotable for good in CI's internal/chaos wipe, seed 1).
			name: "an epoch that wrote nothing is no divergence",
			in: promoter.Input{Replicas: ids(3), Epoch: 26, Answers: []promoter.Answer{
				fenced("r2", 876, 875, hist(23, 860, 25, 871)),
				fenced("r3", 876, 875, hist(23, 860, 24, 871, 25, 871)),
			}},
			want: want{candidate: "r2", bound: 875, followers: []string{"r3"}},
		},
		{
			// e1: r1 leads, 0..5 committed everywhere; r1 writes 5..8 and r2
			// fetches it; neither reaches a quorum. e2 (r1, r2 cut off): r3
			// leads, its epoch-start record lands at 5 and 5..9 commits on
			// r3, r4. e3 fences everyone: r1 and r2 are cut exactly to 5,
			// where their e1 tail and the e2 records part ways, though 5 is
			// below the committed bound 9: it is above their own HWM.
			name: "divergence: an e1 tail overwritten by e2 is cut to the divergence point",
			in: promoter.Input{Replicas: ids(5), Epoch: 3, Answers: []promoter.Answer{
				fenced("r1", 8, 5, hist(1, 0)),
				fenced("r2", 8, 5, hist(1, 0)),
				fenced("r3", 9, 9, hist(1, 0, 2, 5)),
				fenced("r4", 9, 9, hist(1, 0, 2, 5)),
				fenced("r5", 7, 5, hist(1, 0, 2, 5)),
			}},
			want: want{
				candidate: "r3", bound: 9,
				truncations: []promoter.Truncation{{ReplicaID: "r1", From: 8, To: 5}, {ReplicaID: "r2", From: 8, To: 5}},
				followers:   []string{"r1", "r2", "r4", "r5"},
			},
		},
		{
			// The deposed leader r1 holds an e1 tail 8..12 beyond the
			// committed bound 8 it last saw; r2 led e2 from 10 after taking
			// 8..10 of that tail, and committed up to 15. 12 > 10 but the
			// divergence point is 10: a bare-offset comparison would keep
			// r1's 10..12, which sit where e2 wrote different records.
			name: "deposed leader's tail below the committed bound but above its HWM",
			in: promoter.Input{Replicas: ids(3), Epoch: 3, Answers: []promoter.Answer{
				fenced("r1", 12, 8, hist(1, 0)),
				fenced("r2", 15, 15, hist(1, 0, 2, 10)),
				fenced("r3", 15, 13, hist(1, 0, 2, 10)),
			}},
			want: want{
				candidate: "r2", bound: 15,
				truncations: []promoter.Truncation{{ReplicaID: "r1", From: 12, To: 10}},
				followers:   []string{"r1", "r3"},
			},
		},
		{
			name: "a longer log with an older last epoch loses and is cut",
			in: promoter.Input{Replicas: ids(3), Epoch: 4, Answers: []promoter.Answer{
				fenced("r1", 20, 6, hist(1, 0, 2, 4)),
				fenced("r2", 9, 9, hist(1, 0, 2, 4, 3, 7)),
				refused("r3"),
			}},
			want: want{
				candidate: "r2", bound: 9,
				truncations: []promoter.Truncation{{ReplicaID: "r1", From: 20, To: 7}},
				followers:   []string{"r1"},
			},
		},
		{
			// r1 adopted e3 (journaled (3, 5)) and stopped before writing;
			// it is still the later leadership, and r2's e2 records at 5..8
			// were never on r1.
			name: "a journaled epoch with no records yet is the later leadership",
			in: promoter.Input{Replicas: ids(3), Epoch: 4, Answers: []promoter.Answer{
				fenced("r1", 5, 5, hist(1, 0, 3, 5)),
				fenced("r2", 8, 5, hist(1, 0, 2, 5)),
				refused("r3"),
			}},
			want: want{
				candidate: "r1", bound: 5,
				truncations: []promoter.Truncation{{ReplicaID: "r2", From: 8, To: 5}},
				followers:   []string{"r2"},
			},
		},
		{
			name: "lagging replica is a follower, not an error",
			in: promoter.Input{Replicas: ids(3), Epoch: 3, Answers: []promoter.Answer{
				fenced("r1", 10, 8, hist(1, 0, 2, 4)),
				fenced("r2", 10, 10, hist(1, 0, 2, 4)),
				fenced("r3", 3, 3, hist(1, 0)),
			}},
			want: want{candidate: "r1", bound: 10, followers: []string{"r2", "r3"}},
		},
		{
			name: "an empty replica among written ones is a follower",
			in: promoter.Input{Replicas: ids(3), Epoch: 2, Answers: []promoter.Answer{
				fenced("r1", 0, 0, nil),
				fenced("r2", 4, 2, hist(1, 0)),
				refused("r3"),
			}},
			want: want{candidate: "r2", bound: 2, followers: []string{"r1"}},
		},
		{
			name: "tie on (last epoch, log end) goes to the preferred replica",
			in: promoter.Input{Replicas: ids(3), Epoch: 3, Preferred: "r3", Answers: []promoter.Answer{
				fenced("r1", 10, 10, hist(1, 0, 2, 4)),
				fenced("r2", 10, 10, hist(1, 0, 2, 4)),
				fenced("r3", 10, 10, hist(1, 0, 2, 4)),
			}},
			want: want{candidate: "r3", bound: 10, followers: []string{"r1", "r2"}},
		},
		{
			name: "tie without a preference goes to the lowest id",
			in: promoter.Input{Replicas: []string{"c", "a", "b"}, Epoch: 3, Answers: []promoter.Answer{
				fenced("c", 10, 10, hist(1, 0, 2, 4)),
				fenced("a", 10, 10, hist(1, 0, 2, 4)),
				fenced("b", 10, 10, hist(1, 0, 2, 4)),
			}},
			want: want{candidate: "a", bound: 10, followers: []string{"c", "b"}},
		},
		{
			name: "the preference never outranks a more complete log",
			in: promoter.Input{Replicas: ids(3), Epoch: 3, Preferred: "r1", Answers: []promoter.Answer{
				fenced("r1", 9, 9, hist(1, 0, 2, 4)),
				fenced("r2", 10, 9, hist(1, 0, 2, 4)),
				fenced("r3", 10, 10, hist(1, 0, 2, 4)),
			}},
			want: want{candidate: "r2", bound: 10, followers: []string{"r1", "r3"}},
		},
		{
			name: "unknown histories adopt unreconciled; the known ones make the quorum",
			in: promoter.Input{Replicas: ids(5), Epoch: 3, Answers: []promoter.Answer{
				fenced("r1", 10, 10, hist(1, 0, 2, 4)),
				fenced("r2", 10, 10, hist(1, 0, 2, 4)),
				fenced("r3", 6, 6, hist(1, 0, 2, 4)),
				older("r4", 10, 10),
				fenced("r5", 7, 4, nil), // broken journal: unknown
			}},
			want: want{candidate: "r1", bound: 10, followers: []string{"r2", "r3"}, unreconciled: []string{"r4", "r5"}},
		},
		{
			// r3 is older and reports a log end beyond the candidate's: a
			// known history would be cut to 10, but an unknown one never
			// authorises a truncation. The fetch check cuts it.
			name: "unimplemented replica is never truncated",
			in: promoter.Input{Replicas: ids(3), Epoch: 3, Answers: []promoter.Answer{
				fenced("r1", 10, 8, hist(1, 0, 2, 4)),
				fenced("r2", 10, 8, hist(1, 0, 2, 4)),
				older("r3", 14, 8),
			}},
			want: want{candidate: "r1", bound: 8, followers: []string{"r2"}, unreconciled: []string{"r3"}},
		},
		{
			name: "unimplemented wins over a history it sent anyway",
			in: promoter.Input{Replicas: ids(3), Epoch: 3, Answers: []promoter.Answer{
				fenced("r1", 10, 8, hist(1, 0, 2, 4)),
				fenced("r2", 10, 8, hist(1, 0, 2, 4)),
				{ReplicaID: "r3", Unimplemented: true, LogEnd: 14, HWM: 8, History: hist(1, 0, 5, 9)},
			}},
			want: want{candidate: "r1", bound: 8, followers: []string{"r2"}, unreconciled: []string{"r3"}},
		},
		{
			name: "committed bound includes the HWM of an unknown history",
			in: promoter.Input{Replicas: ids(3), Epoch: 3, Answers: []promoter.Answer{
				fenced("r1", 10, 7, hist(1, 0, 2, 4)),
				fenced("r2", 9, 7, hist(1, 0, 2, 4)),
				older("r3", 10, 10),
			}},
			want: want{candidate: "r1", bound: 10, followers: []string{"r2"}, unreconciled: []string{"r3"}},
		},
		{
			name: "a replica without an answer is not fenced",
			in: promoter.Input{Replicas: ids(3), Epoch: 2, Answers: []promoter.Answer{
				fenced("r3", 4, 4, hist(1, 0)),
				fenced("r2", 4, 4, hist(1, 0)),
			}},
			want: want{candidate: "r2", bound: 4, followers: []string{"r3"}},
		},
		{
			// r2 took e3's records only up to 20 and then led e5 from there;
			// r3 led e4 from 22 without reaching a quorum. Same epoch 3 in
			// both, ending at different offsets: they agree only below 20.
			name: "five replicas, a bare quorum of three",
			in: promoter.Input{Replicas: ids(5), Epoch: 6, Answers: []promoter.Answer{
				refused("r1"),
				fenced("r2", 30, 21, hist(1, 0, 3, 10, 5, 20)),
				fenced("r3", 25, 20, hist(1, 0, 3, 10, 4, 22)),
				refused("r4"),
				fenced("r5", 28, 20, hist(1, 0, 3, 10)),
			}},
			want: want{
				candidate: "r2", bound: 21,
				truncations: []promoter.Truncation{{ReplicaID: "r3", From: 25, To: 20}, {ReplicaID: "r5", From: 28, To: 20}},
				followers:   []string{"r3", "r5"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plan, err := promoter.Decide(tt.in)
			if err != nil {
				t.Fatalf("Decide() error = %v, want a plan", err)
			}
			got := want{plan.Candidate, plan.CommittedBound, plan.Truncations, plan.Followers, plan.Unreconciled}
			if got.candidate != tt.want.candidate {
				t.Errorf("Decide().Candidate = %q, want %q", got.candidate, tt.want.candidate)
			}
			if got.bound != tt.want.bound {
				t.Errorf("Decide().CommittedBound = %d, want %d", got.bound, tt.want.bound)
			}
			if !slices.Equal(got.truncations, tt.want.truncations) {
				t.Errorf("Decide().Truncations = %v, want %v", got.truncations, tt.want.truncations)
			}
			if !slices.Equal(got.followers, tt.want.followers) {
				t.Errorf("Decide().Followers = %v, want %v", got.followers, tt.want.followers)
			}
			if !slices.Equal(got.unreconciled, tt.want.unreconciled) {
				t.Errorf("Decide().Unreconciled = %v, want %v", got.unreconciled, tt.want.unreconciled)
			}
			if len(plan.Fenced) != len(tt.in.Replicas) {
				t.Errorf("Decide().Fenced has %d entries, want one per replica (%d)", len(plan.Fenced), len(tt.in.Replicas))
			}
		})
	}
}

func TestDecideRefuses(t *testing.T) {
	tests := []struct {
		name     string
		in       promoter.Input
		code     connect.Code
		contains []string
	}{
		{
			name: "no quorum: two of three not fenced",
			in: promoter.Input{Replicas: ids(3), Epoch: 2, Answers: []promoter.Answer{
				fenced("r1", 4, 4, hist(1, 0)), refused("r2"), refused("r3"),
			}},
			code: connect.CodeUnavailable,
			contains: []string{"no quorum: 1 of 3 fenced with known history, need 2",
				"r1 fenced, history known", "r2 not fenced: connection refused", "r3 not fenced: connection refused"},
		},
		{
			name: "no quorum: fenced but unknown histories do not count",
			in: promoter.Input{Replicas: ids(3), Epoch: 2, Answers: []promoter.Answer{
				fenced("r1", 4, 4, hist(1, 0)), older("r2", 4, 4), fenced("r3", 4, 4, nil),
			}},
			code: connect.CodeUnavailable,
			contains: []string{"no quorum: 1 of 3 fenced with known history, need 2",
				"r2 fenced, history unknown: the replica does not report it (older version)",
				"r3 fenced, history unknown: empty history with log end 4"},
		},
		{
			name: "no quorum: no answers at all",
			in:   promoter.Input{Replicas: ids(5), Epoch: 2},
			code: connect.CodeUnavailable,
			contains: []string{"no quorum: 0 of 5 fenced with known history, need 3",
				"r1 no answer", "r5 no answer"},
		},
		{
			// Only a bug or a corrupted disk gets here: r2's HWM says 0..12
			// is committed but the candidate with the later epoch ends at 9.
			name: "candidate below the committed bound",
			in: promoter.Input{Replicas: ids(3), Epoch: 4, Answers: []promoter.Answer{
				fenced("r1", 9, 9, hist(1, 0, 3, 6)),
				fenced("r2", 12, 12, hist(1, 0, 2, 6)),
				refused("r3"),
			}},
			code:     connect.CodeDataLoss,
			contains: []string{"candidate r1 (last epoch 3) ends at 9, below the committed bound 12 (HWM of r2)"},
		},
		{
			name: "candidate below the committed bound an unknown history vouches for",
			in: promoter.Input{Replicas: ids(3), Epoch: 4, Answers: []promoter.Answer{
				fenced("r1", 9, 9, hist(1, 0, 3, 6)),
				fenced("r2", 9, 9, hist(1, 0, 3, 6)),
				older("r3", 12, 11),
			}},
			code:     connect.CodeDataLoss,
			contains: []string{"candidate r1 (last epoch 3) ends at 9, below the committed bound 11 (HWM of r3)"},
		},
		{
			// r2 says 0..7 is committed, but from 5 it holds e1 records
			// where the candidate holds e2 records: they disagree about
			// committed offsets 5 and 6.
			name: "target below the replica's own HWM",
			in: promoter.Input{Replicas: ids(3), Epoch: 3, Answers: []promoter.Answer{
				fenced("r1", 9, 7, hist(1, 0, 2, 5)),
				fenced("r2", 8, 7, hist(1, 0)),
				refused("r3"),
			}},
			code:     connect.CodeDataLoss,
			contains: []string{"r2 (last epoch 1, log end 8, HWM 7) diverges from candidate r1 (last epoch 2, log end 9) at 5, below its HWM"},
		},
		{
			name: "answer from a non-member",
			in: promoter.Input{Replicas: ids(3), Epoch: 2, Answers: []promoter.Answer{
				fenced("r1", 0, 0, nil), fenced("r9", 0, 0, nil),
			}},
			code:     connect.CodeInvalidArgument,
			contains: []string{`answer from "r9", which is not in the replica set`},
		},
		{
			name: "two answers from one replica",
			in: promoter.Input{Replicas: ids(3), Epoch: 2, Answers: []promoter.Answer{
				fenced("r1", 0, 0, nil), fenced("r2", 0, 0, nil), fenced("r1", 0, 0, nil),
			}},
			code:     connect.CodeInvalidArgument,
			contains: []string{"two answers from replica r1"},
		},
		{
			name:     "replica listed twice",
			in:       promoter.Input{Replicas: []string{"r1", "r2", "r1"}, Epoch: 2},
			code:     connect.CodeInvalidArgument,
			contains: []string{"replica r1 is listed twice"},
		},
		{
			name:     "empty replica set",
			in:       promoter.Input{Epoch: 2},
			code:     connect.CodeInvalidArgument,
			contains: []string{"replica set has 0 members"},
		},
		{
			name:     "epoch 0",
			in:       promoter.Input{Replicas: ids(3), Epoch: 0},
			code:     connect.CodeInvalidArgument,
			contains: []string{"epoch 0"},
		},
		{
			name:     "preferred replica is not a member",
			in:       promoter.Input{Replicas: ids(3), Epoch: 2, Preferred: "r7"},
			code:     connect.CodeInvalidArgument,
			contains: []string{`preferred replica "r7" is not in the replica set`},
		},
		{
			name: "HWM above log end",
			in: promoter.Input{Replicas: ids(3), Epoch: 2, Answers: []promoter.Answer{
				fenced("r1", 4, 5, hist(1, 0)),
			}},
			code:     connect.CodeInvalidArgument,
			contains: []string{"replica r1 reports HWM 5 above its log end 4"},
		},
		{
			name: "history starting beyond the log end",
			in: promoter.Input{Replicas: ids(3), Epoch: 3, Answers: []promoter.Answer{
				fenced("r1", 4, 2, hist(1, 0, 2, 6)),
			}},
			code:     connect.CodeInvalidArgument,
			contains: []string{"replica r1:", "beyond the log end 4"},
		},
		{
			name: "history that does not advance",
			in: promoter.Input{Replicas: ids(3), Epoch: 3, Answers: []promoter.Answer{
				fenced("r1", 4, 2, hist(2, 0, 1, 3)),
			}},
			code:     connect.CodeInvalidArgument,
			contains: []string{"replica r1:", "does not follow epoch 2"},
		},
		{
			name: "history naming an epoch above the fence",
			in: promoter.Input{Replicas: ids(3), Epoch: 3, Answers: []promoter.Answer{
				fenced("r1", 9, 2, hist(1, 0, 7, 6)),
			}},
			code:     connect.CodeInvalidArgument,
			contains: []string{"replica r1 fenced at epoch 3 reports a history up to epoch 7"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkRefused(t, tt.in, tt.code, tt.contains) })
	}
}

// checkRefused checks that Decide refuses in with a *PlanError of code
// whose message holds every string of contains, and returns no plan to act
// on: a refusal that still named a candidate or truncations would be
// carried out by the promoter.
func checkRefused(t *testing.T, in promoter.Input, code connect.Code, contains []string) {
	t.Helper()
	plan, err := promoter.Decide(in)
	var pe *promoter.PlanError
	if !errors.As(err, &pe) {
		t.Fatalf("Decide() = %+v, %v; want a *PlanError with code %v", plan, err, code)
	}
	if pe.Code != code {
		t.Errorf("Decide() code = %v, want %v (%v)", pe.Code, code, err)
	}
	for _, s := range contains {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("Decide() error = %q, want it to contain %q", err, s)
		}
	}
	if !strings.HasPrefix(err.Error(), "promoter: plan: ") {
		t.Errorf("Decide() error = %q, want the package prefix", err)
	}
	if plan.Candidate != "" || plan.Truncations != nil || plan.Followers != nil || plan.Unreconciled != nil {
		t.Errorf("Decide() with an error returned a plan to act on: %+v", plan)
	}
}

// The summary is what the transition record and the candidate-choice span
// show, also for a promotion that stopped.
func TestDecideSummary(t *testing.T) {
	in := promoter.Input{Replicas: ids(4), Epoch: 5, Answers: []promoter.Answer{
		fenced("r1", 10, 8, hist(1, 0, 4, 6)),
		refused("r2"),
		older("r3", 7, 7),
	}}
	plan, err := promoter.Decide(in)
	if err == nil {
		t.Fatalf("Decide() = %+v, want no quorum", plan)
	}
	type row struct {
		id                    string
		fenced, known         bool
		logEnd, hwm, lastEpoc uint64
		err                   string
	}
	want := []row{
		{"r1", true, true, 10, 8, 4, ""},
		{"r2", false, false, 0, 0, 0, "not fenced: connection refused"},
		{"r3", true, false, 7, 7, 0, "history unknown: the replica does not report it (older version)"},
		{"r4", false, false, 0, 0, 0, "no answer"},
	}
	if len(plan.Fenced) != len(want) {
		t.Fatalf("Decide().Fenced = %v, want %d entries", plan.Fenced, len(want))
	}
	for i, f := range plan.Fenced {
		got := row{f.GetReplicaId(), f.GetFenced(), f.GetHistoryKnown(), f.GetLogEnd(), f.GetHighWaterMark(), f.GetLastEpoch(), f.GetError()}
		if got != want[i] {
			t.Errorf("Decide().Fenced[%d] = %+v, want %+v", i, got, want[i])
		}
	}
}

// TestDecideSpreadsTiesOverRanges: when a failed replica's ranges move to
// survivors with identical logs, each range picks one survivor the same
// way every time, and the ranges spread over the survivors rather than all
// landing on the lowest id. A preference and a more complete log still win.
func TestDecideSpreadsTiesOverRanges(t *testing.T) {
	const ranges = 1000
	answers := []promoter.Answer{
		fenced("r2", 10, 10, hist(1, 0, 2, 4)),
		fenced("r3", 10, 10, hist(1, 0, 2, 4)),
	}
	led := map[string]int{}
	for i := range ranges {
		in := promoter.Input{Replicas: ids(3), Epoch: 3, RangeID: "range-" + strconv.Itoa(i), Answers: answers}
		first, err := promoter.Decide(in)
		if err != nil {
			t.Fatal(err)
		}
		again, err := promoter.Decide(in)
		if err != nil {
			t.Fatal(err)
		}
		if first.Candidate != again.Candidate {
			t.Fatalf("%s: candidate %s then %s from the same answers", in.RangeID, first.Candidate, again.Candidate)
		}
		led[first.Candidate]++

		in.Preferred = "r2"
		if p, err := promoter.Decide(in); err != nil || p.Candidate != "r2" {
			t.Fatalf("%s: preferred r2, got %+v, %v", in.RangeID, p, err)
		}
		in.Preferred = ""
		in.Answers = []promoter.Answer{fenced("r2", 10, 10, hist(1, 0, 2, 4)), fenced("r3", 11, 10, hist(1, 0, 2, 4))}
		if p, err := promoter.Decide(in); err != nil || p.Candidate != "r3" {
			t.Fatalf("%s: r3 is more complete, got %+v, %v", in.RangeID, p, err)
		}
	}
	// Each survivor's share is binomial(1000, 1/2): 400..600 is over six
	// standard deviations wide, and the hash is fixed, so this never flakes.
	for _, id := range []string{"r2", "r3"} {
		if n := led[id]; n < 400 || n > 600 {
			t.Fatalf("leaderships over %d tied ranges: %v, want both survivors near half", ranges, led)
		}
	}
}
