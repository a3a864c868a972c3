package promoter_test

import (
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/services/promoter"
)

// halted is a fenced answer from a copy that stopped serving (a safety
// violation or a store failure): its log as it stands, and the reason.
func halted(id string, logEnd, hwm uint64, h []journal.EpochStart) promoter.Answer {
	a := fenced(id, logEnd, hwm, h)
	a.Halted = "safety violation: test"
	return a
}

// A halted copy refuses Truncate and Adopt until its replica restarts, so a
// plan never makes it the candidate, never counts it toward the quorum and
// never truncates or adopts it; it lists it in Excluded, says why, and
// still takes its HWM into the committed bound.
func TestDecideHaltedCopy(t *testing.T) {
	tests := []struct {
		name     string
		in       promoter.Input
		want     want
		excluded []string
	}{
		{
			// Before, r3 led as the preferred replica and its Adopt was
			// refused at every epoch.
			name: "preferred on a tie",
			in: promoter.Input{Replicas: ids(3), Epoch: 3, Preferred: "r3", Answers: []promoter.Answer{
				fenced("r1", 9, 9, hist(1, 0)), fenced("r2", 9, 9, hist(1, 0)), halted("r3", 9, 9, hist(1, 0)),
			}},
			want:     want{candidate: "r1", bound: 9, followers: []string{"r2"}},
			excluded: []string{"r3"},
		},
		{
			name: "most complete log",
			in: promoter.Input{Replicas: ids(5), Epoch: 3, Answers: []promoter.Answer{
				refused("r1"), fenced("r2", 9, 9, hist(1, 0)), halted("r3", 12, 9, hist(1, 0, 2, 10)),
				fenced("r4", 9, 9, hist(1, 0)), fenced("r5", 9, 9, hist(1, 0)),
			}},
			want:     want{candidate: "r2", bound: 9, followers: []string{"r4", "r5"}},
			excluded: []string{"r3"},
		},
		{
			// Before, the plan cut r3's tail and its refused Truncate
			// failed every promotion after the fence.
			name: "a tail above its HWM is not cut",
			in: promoter.Input{Replicas: ids(5), Epoch: 4, Answers: []promoter.Answer{
				fenced("r1", 10, 10, hist(1, 0, 3, 6)), refused("r2"), halted("r3", 7, 6, hist(1, 0)),
				fenced("r4", 10, 10, hist(1, 0, 3, 6)), fenced("r5", 10, 10, hist(1, 0, 3, 6)),
			}},
			want:     want{candidate: "r1", bound: 10, followers: []string{"r4", "r5"}},
			excluded: []string{"r3"},
		},
		{
			name: "unknown history",
			in: promoter.Input{Replicas: ids(3), Epoch: 3, Answers: []promoter.Answer{
				fenced("r1", 9, 9, hist(1, 0)), fenced("r2", 9, 9, hist(1, 0)), halted("r3", 9, 9, nil),
			}},
			want:     want{candidate: "r1", bound: 9, followers: []string{"r2"}},
			excluded: []string{"r3"},
		},
		{
			// A planned handover to a halted copy is refused like one to a
			// replica that does not count; the most complete log leads.
			name: "handover target",
			in: promoter.Input{Replicas: ids(3), Epoch: 3, HandoverTo: "r3", Answers: []promoter.Answer{
				fenced("r1", 9, 9, hist(1, 0)), fenced("r2", 9, 9, hist(1, 0)), halted("r3", 9, 9, hist(1, 0)),
			}},
			want:     want{candidate: "r1", bound: 9, followers: []string{"r2"}},
			excluded: []string{"r3"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plan, err := promoter.Decide(tt.in)
			if err != nil {
				t.Fatalf("Decide() error = %v, want a plan", err)
			}
			if plan.Candidate != tt.want.candidate || plan.CommittedBound != tt.want.bound {
				t.Errorf("Decide() = candidate %q bound %d, want %q, %d", plan.Candidate, plan.CommittedBound, tt.want.candidate, tt.want.bound)
			}
			if !slices.Equal(plan.Truncations, tt.want.truncations) {
				t.Errorf("Decide().Truncations = %v, want %v", plan.Truncations, tt.want.truncations)
			}
			if !slices.Equal(plan.Followers, tt.want.followers) || len(plan.Unreconciled) != 0 || len(plan.Learners) != 0 {
				t.Errorf("Decide() adopts %v, %v, %v; want followers %v only", plan.Followers, plan.Unreconciled, plan.Learners, tt.want.followers)
			}
			if !slices.Equal(plan.Excluded, tt.excluded) {
				t.Errorf("Decide().Excluded = %v, want %v", plan.Excluded, tt.excluded)
			}
			for _, f := range plan.Fenced {
				if f.GetReplicaId() != "r3" {
					continue
				}
				if !f.GetFenced() || f.GetCounted() || f.GetHalted() == "" || !strings.Contains(f.GetError(), "not truncated, not adopted: stopped serving (safety violation: test)") {
					t.Errorf("Decide().Fenced[r3] = %v; want fenced, not counted, halted, and why", f)
				}
			}
			if tt.in.HandoverTo != "" && !strings.Contains(plan.HandoverRefused, "stopped serving") {
				t.Errorf("Decide().HandoverRefused = %q, want the halt named", plan.HandoverRefused)
			}
		})
	}
}

// What a halted copy says is still heard: a quorum that needs it is no
// quorum, its HWM bounds what was committed, and a candidate that disagrees
// with it below its HWM is a committed-record conflict.
func TestDecideHaltedCopyRefuses(t *testing.T) {
	tests := []struct {
		name     string
		in       promoter.Input
		code     connect.Code
		contains []string
	}{
		{
			// Before, r2 led with r3 as a follower that never fetched: a
			// leader that could commit nothing, reported healthy.
			name: "no quorum without it",
			in: promoter.Input{Replicas: ids(3), Epoch: 3, Answers: []promoter.Answer{
				refused("r1"), fenced("r2", 9, 9, hist(1, 0)), halted("r3", 9, 9, hist(1, 0)),
			}},
			code: connect.CodeUnavailable,
			contains: []string{"no quorum: 1 of 3 fenced with known history, need 2",
				"r3 fenced, stopped serving (safety violation: test): it refuses Truncate and Adopt until its replica restarts; not counted"},
		},
		{
			name: "no candidate even for an unsafe promotion",
			in: promoter.Input{Replicas: ids(3), Epoch: 3, Unsafe: true, Answers: []promoter.Answer{
				refused("r1"), refused("r2"), halted("r3", 9, 9, hist(1, 0)),
			}},
			code:     connect.CodeUnavailable,
			contains: []string{"no fenced voter with a known history, even for an unsafe promotion", "r3 fenced, stopped serving"},
		},
		{
			// r3 halted holding records up to 12 committed by its HWM; the
			// others end at 9. Leading from them would lose 9..12 for good.
			name: "its HWM bounds the committed records",
			in: promoter.Input{Replicas: ids(5), Epoch: 3, Answers: []promoter.Answer{
				fenced("r1", 9, 9, hist(1, 0)), fenced("r2", 9, 9, hist(1, 0)), halted("r3", 12, 12, hist(1, 0)),
				fenced("r4", 9, 9, hist(1, 0)), refused("r5"),
			}},
			code:     connect.CodeDataLoss,
			contains: []string{"candidate r1 (last epoch 1) ends at 9, below the committed bound 12 (HWM of r3)"},
		},
		{
			// r3 halted because its leader disagreed with its committed
			// records (follower.go's "below our HWM"): the candidate holds
			// epoch 2's records from 5 where r3 committed epoch 1's. Not
			// the promoter's to settle.
			name: "a conflict below its HWM",
			in: promoter.Input{Replicas: ids(3), Epoch: 3, Answers: []promoter.Answer{
				fenced("r1", 9, 7, hist(1, 0, 2, 5)), fenced("r2", 9, 7, hist(1, 0, 2, 5)), halted("r3", 8, 7, hist(1, 0)),
			}},
			code:     connect.CodeDataLoss,
			contains: []string{"r3 (stopped serving; last epoch 1, log end 8, HWM 7) diverges from candidate r1 (last epoch 2, log end 9) at 5, below its HWM"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkRefused(t, tt.in, tt.code, tt.contains) })
	}
}
