package promoter_test

import (
	"errors"
	"slices"
	"testing"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/services/promoter"
)

// trimmed is a fenced replica's answer whose log starts at start (retention
// deleted the committed records below it) and whose history h was trimmed
// to keep the entry in force at start.
func trimmed(id string, start, logEnd, hwm uint64, h []journal.EpochStart) promoter.Answer {
	a := fenced(id, logEnd, hwm, h)
	a.LogStart = start
	return a
}

// Replicas whose logs start at different offsets, with histories trimmed
// differently, are compared only where both hold records: the most complete
// log still leads, a replica agreeing from the larger start is not cut, a
// divergence above both starts is cut exactly as before, no truncation
// target is below the replica's log start, and a replica whose log ends at
// or below the new leader's log start is adopted uncut (its fetch resets it).
func TestDecideLogStarts(t *testing.T) {
	tests := []struct {
		name string
		in   promoter.Input
		want want
	}{
		{
			// r1 trimmed to 500 (history from epoch 2's entry), r2 to 100
			// (from epoch 1's), r3 never: identical records from 500 on.
			name: "identical logs trimmed to different starts: nothing is cut",
			in: promoter.Input{Replicas: ids(3), Epoch: 4, Answers: []promoter.Answer{
				trimmed("r1", 500, 900, 900, hist(2, 300, 3, 700)),
				trimmed("r2", 100, 900, 880, hist(1, 0, 2, 300, 3, 700)),
				fenced("r3", 850, 850, hist(1, 0, 2, 300, 3, 700)),
			}},
			want: want{candidate: "r1", bound: 900, followers: []string{"r2", "r3"}},
		},
		{
			// r2's e3 tail 880..900 was never committed; e4 (r1) wrote from
			// 880. The divergence is at 880, above both starts.
			name: "a divergence above both starts is cut to the divergence point",
			in: promoter.Input{Replicas: ids(3), Epoch: 5, Answers: []promoter.Answer{
				trimmed("r1", 500, 950, 940, hist(3, 400, 4, 880)),
				trimmed("r2", 200, 900, 870, hist(2, 100, 3, 400)),
				refused("r3"),
			}},
			want: want{candidate: "r1", bound: 940,
				truncations: []promoter.Truncation{{ReplicaID: "r2", From: 900, To: 880}},
				followers:   []string{"r2"}},
		},
		{
			// r3 was down while r1 and r2 trimmed to 600: its log ends at
			// 400, below the candidate's start. Nothing of it is compared
			// or cut; it counts as fenced and is reset when it fetches.
			name: "a replica ending below the candidate's log start is adopted uncut",
			in: promoter.Input{Replicas: ids(3), Epoch: 4, Answers: []promoter.Answer{
				trimmed("r1", 600, 900, 900, hist(3, 550)),
				refused("r2"),
				trimmed("r3", 100, 400, 380, hist(1, 0, 2, 300)),
			}},
			want: want{candidate: "r1", bound: 900, followers: []string{"r3"}},
		},
		{
			// r3 was reset to 600 (an empty log, empty journal) and has
			// not fetched yet: a known, empty log, adopted uncut.
			name: "a replica reset to a log start is known and adopted uncut",
			in: promoter.Input{Replicas: ids(3), Epoch: 4, Answers: []promoter.Answer{
				trimmed("r1", 500, 900, 900, hist(3, 450)),
				refused("r2"),
				trimmed("r3", 600, 600, 600, nil),
			}},
			want: want{candidate: "r1", bound: 900, followers: []string{"r3"}},
		},
		{
			// r2's uncommitted e2 tail from 650 is above its HWM 640 and
			// its start 600; the candidate's e3 begins at 650.
			name: "the cut stays at or above the replica's own log start",
			in: promoter.Input{Replicas: ids(3), Epoch: 4, Answers: []promoter.Answer{
				trimmed("r1", 300, 900, 900, hist(2, 200, 3, 650)),
				trimmed("r2", 600, 700, 640, hist(2, 200)),
				refused("r3"),
			}},
			want: want{candidate: "r1", bound: 900,
				truncations: []promoter.Truncation{{ReplicaID: "r2", From: 700, To: 650}},
				followers:   []string{"r2"}},
		},
		{
			// The entry in force at the larger start differs: r2's records
			// at 600 are e2's, r1's are e3's (which began at 550 on r1).
			// The logs disagree at 600 already; r2's HWM 620 is above it.
			name: "entries in force at the larger start differ: cut there, refused below the HWM",
			in: promoter.Input{Replicas: ids(3), Epoch: 4, Answers: []promoter.Answer{
				trimmed("r1", 300, 900, 900, hist(2, 200, 3, 550)),
				trimmed("r2", 600, 700, 620, hist(2, 200)),
				refused("r3"),
			}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plan, err := promoter.Decide(tc.in)
			if tc.want.candidate == "" {
				if pe := (*promoter.PlanError)(nil); !errors.As(err, &pe) || pe.Code != connect.CodeDataLoss {
					t.Fatalf("Decide = %+v, %v; want DataLoss", plan, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Decide: %v", err)
			}
			if plan.Candidate != tc.want.candidate || plan.CommittedBound != tc.want.bound {
				t.Errorf("candidate, bound = %s, %d; want %s, %d", plan.Candidate, plan.CommittedBound, tc.want.candidate, tc.want.bound)
			}
			if !slices.Equal(plan.Truncations, tc.want.truncations) {
				t.Errorf("truncations = %v, want %v", plan.Truncations, tc.want.truncations)
			}
			if !slices.Equal(plan.Followers, tc.want.followers) {
				t.Errorf("followers = %v, want %v", plan.Followers, tc.want.followers)
			}
			starts := map[string]uint64{}
			for _, a := range tc.in.Answers {
				starts[a.ReplicaID] = a.LogStart
			}
			for _, tr := range plan.Truncations {
				if tr.To < starts[tr.ReplicaID] {
					t.Errorf("truncation %+v is below %s's log start %d", tr, tr.ReplicaID, starts[tr.ReplicaID])
				}
			}
		})
	}
}

// An answer whose log start is above its HWM breaks retention's rule (only
// committed records are deleted) and is refused.
func TestDecideLogStartAboveHWM(t *testing.T) {
	_, err := promoter.Decide(promoter.Input{Replicas: ids(1), Epoch: 2, Answers: []promoter.Answer{
		trimmed("r1", 50, 60, 40, hist(1, 0)),
	}})
	if pe := (*promoter.PlanError)(nil); !errors.As(err, &pe) || pe.Code != connect.CodeInvalidArgument {
		t.Fatalf("Decide = %v, want InvalidArgument", err)
	}
}
