package promoter_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/services/promoter"
)

// leading is the answer of the replica that was leading when fenced.
func leading(id string, logEnd, hwm uint64, h []journal.EpochStart) promoter.Answer {
	a := fenced(id, logEnd, hwm, h)
	a.ActingLeader = true
	return a
}

// A planned handover's target leads from a shorter log only when the fenced
// leader's answer shows it holds every record that may have been
// acknowledged; otherwise the most complete log leads and the plan says why.
func TestDecideHandover(t *testing.T) {
	tests := []struct {
		name    string
		in      promoter.Input
		want    string // candidate
		refused string // a fragment of HandoverRefused, "" for none
		cuts    []promoter.Truncation
	}{
		{
			name: "target holds the leader's HWM: it leads, the unacknowledged tail is cut",
			in: promoter.Input{Replicas: ids(3), Epoch: 3, HandoverTo: "r2", Answers: []promoter.Answer{
				leading("r1", 12, 9, hist(1, 0, 2, 5)), fenced("r2", 10, 8, hist(1, 0, 2, 5)), fenced("r3", 11, 9, hist(1, 0, 2, 5)),
			}},
			want: "r2",
			cuts: []promoter.Truncation{{ReplicaID: "r1", From: 12, To: 10}, {ReplicaID: "r3", From: 11, To: 10}},
		},
		{
			name: "target one record short of the leader's HWM: the leader stays",
			in: promoter.Input{Replicas: ids(3), Epoch: 3, HandoverTo: "r2", Answers: []promoter.Answer{
				leading("r1", 12, 9, hist(1, 0, 2, 5)), fenced("r2", 8, 8, hist(1, 0, 2, 5)), fenced("r3", 11, 9, hist(1, 0, 2, 5)),
			}},
			want: "r1", refused: "lacks 1 of them",
		},
		{
			name: "the leader did not answer: only the most complete log is safe",
			in: promoter.Input{Replicas: ids(3), Epoch: 3, HandoverTo: "r2", Answers: []promoter.Answer{
				refused("r1"), fenced("r2", 10, 8, hist(1, 0, 2, 5)), fenced("r3", 11, 8, hist(1, 0, 2, 5)),
			}},
			want: "r3", refused: "no replica answered the fence as the acting leader",
		},
		{
			// Its HWM is the one last persisted: it may have acknowledged
			// records 10 and 11 (which r3 holds) before it restarted.
			name: "a leader that restarted since its adoption does not vouch",
			in: promoter.Input{Replicas: ids(3), Epoch: 3, HandoverTo: "r2", Answers: []promoter.Answer{
				fenced("r1", 12, 8, hist(1, 0, 2, 5)), fenced("r2", 10, 8, hist(1, 0, 2, 5)), fenced("r3", 12, 8, hist(1, 0, 2, 5)),
			}},
			want: "r1", refused: "no replica answered the fence as the acting leader at epoch 2",
		},
		{
			name: "a leader of an older epoch than the most complete log does not vouch",
			in: promoter.Input{Replicas: ids(3), Epoch: 4, HandoverTo: "r2", Answers: []promoter.Answer{
				leading("r1", 20, 8, hist(1, 0)), fenced("r2", 10, 8, hist(1, 0, 3, 8)), fenced("r3", 11, 8, hist(1, 0, 3, 8)),
			}},
			want: "r3", refused: "no replica answered the fence as the acting leader at epoch 3",
		},
		{
			name: "epoch start not committed: the target needs every record before it",
			in: promoter.Input{Replicas: ids(3), Epoch: 3, HandoverTo: "r2", Answers: []promoter.Answer{
				leading("r1", 12, 6, hist(1, 0, 2, 9)), fenced("r2", 8, 6, hist(1, 0)), fenced("r3", 12, 6, hist(1, 0, 2, 9)),
			}},
			want: "r1", refused: "below 9",
		},
		{
			name: "epoch start not committed, target holds everything before it",
			in: promoter.Input{Replicas: ids(3), Epoch: 3, HandoverTo: "r2", Answers: []promoter.Answer{
				leading("r1", 12, 6, hist(1, 0, 2, 9)), fenced("r2", 9, 6, hist(1, 0)), fenced("r3", 12, 6, hist(1, 0, 2, 9)),
			}},
			want: "r2",
			cuts: []promoter.Truncation{{ReplicaID: "r1", From: 12, To: 9}, {ReplicaID: "r3", From: 12, To: 9}},
		},
		{
			name: "target diverged from the leader: refused",
			in: promoter.Input{Replicas: ids(3), Epoch: 4, HandoverTo: "r2", Answers: []promoter.Answer{
				leading("r1", 12, 9, hist(1, 0, 3, 6)), fenced("r2", 10, 5, hist(1, 0, 2, 5)), fenced("r3", 12, 9, hist(1, 0, 3, 6)),
			}},
			want: "r1", refused: "diverges from the leader r1",
		},
		{
			name: "target not fenced: refused",
			in: promoter.Input{Replicas: ids(3), Epoch: 3, HandoverTo: "r2", Answers: []promoter.Answer{
				leading("r1", 12, 9, hist(1, 0, 2, 5)), refused("r2"), fenced("r3", 11, 9, hist(1, 0, 2, 5)),
			}},
			want: "r1", refused: "r2 was not fenced",
		},
		{
			name: "target as complete as the leader: it leads, nothing is cut",
			in: promoter.Input{Replicas: ids(3), Epoch: 3, HandoverTo: "r2", Answers: []promoter.Answer{
				leading("r1", 12, 9, hist(1, 0, 2, 5)), fenced("r2", 12, 9, hist(1, 0, 2, 5)), fenced("r3", 11, 9, hist(1, 0, 2, 5)),
			}},
			want: "r2", cuts: []promoter.Truncation{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plan, err := promoter.Decide(tt.in)
			if err != nil {
				t.Fatalf("Decide: %v", err)
			}
			if plan.Candidate != tt.want {
				t.Fatalf("candidate = %s, want %s (refused: %q)", plan.Candidate, tt.want, plan.HandoverRefused)
			}
			if tt.refused == "" && plan.HandoverRefused != "" && plan.Candidate == tt.in.HandoverTo {
				t.Errorf("HandoverRefused = %q with the target leading", plan.HandoverRefused)
			}
			if tt.refused != "" && !strings.Contains(plan.HandoverRefused, tt.refused) {
				t.Errorf("HandoverRefused = %q, want it to say %q", plan.HandoverRefused, tt.refused)
			}
			if tt.cuts != nil && !slices.Equal(plan.Truncations, tt.cuts) && len(plan.Truncations)+len(tt.cuts) > 0 {
				t.Errorf("truncations = %v, want %v", plan.Truncations, tt.cuts)
			}
			// Invariant 3 whatever leads: no cut below a replica's HWM.
			for _, c := range plan.Truncations {
				for _, a := range tt.in.Answers {
					if a.ReplicaID == c.ReplicaID && a.Err == nil && c.To < a.HWM {
						t.Errorf("truncation %v below %s's HWM %d", c, a.ReplicaID, a.HWM)
					}
				}
			}
		})
	}
}
