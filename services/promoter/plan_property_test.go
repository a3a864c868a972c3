package promoter_test

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"pgregory.net/rapid"

	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/pkg/wire"
	"github.com/tenurelog/tenure/services/promoter"
)

// maxSteps bounds one protocol run. With rapid's default 100 checks per
// replica-set size this is 20,000 steps and a few thousand promotions per
// size, in a few seconds under -race.
const maxSteps = 200

// TestDecideProtocolRuns drives Decide through simulated protocol runs
// (plan_world_test.go) and checks after every step that every acknowledged
// record sits in every replica's committed prefix and in the newest leader's
// log, that no plan removes an acknowledged record or cuts below a replica's
// HWM, that every follower agrees with the candidate before it follows it,
// and that Decide never answers DataLoss (or anything but a plan or
// "no quorum") in a correct run.
func TestDecideProtocolRuns(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprintf("replicas=%d", n), func(t *testing.T) {
			var stats worldStats
			rapid.Check(t, func(rt *rapid.T) {
				if err := runWorld(rt, n, maxSteps, promoter.Decide, &stats); err != nil {
					rt.Fatal(err)
				}
			})
			t.Logf("%d runs, %d steps, %d promotions: %d plans, %d without quorum; %d truncations planned, %d unreconciled adoptions, %d fetch-time cuts; %d records acknowledged; up to epoch %d; %d membership steps, %d wiped disks, %d answers excluded; %d handovers led from a shorter log",
				stats.runs, stats.steps, stats.promotions, stats.plans, stats.unavailable,
				stats.truncations, stats.unreconciled, stats.fetchCuts, stats.committed, stats.maxEpoch,
				stats.memberSteps, stats.wipes, stats.excluded, stats.handovers)
			// A checker that never exercised the interesting paths proves
			// little: the runs must reach truncations, commits, membership
			// steps and wiped disks whose answers were excluded.
			if stats.truncations == 0 || stats.committed == 0 || stats.unreconciled == 0 || stats.fetchCuts == 0 ||
				stats.memberSteps == 0 || stats.wipes == 0 || stats.excluded == 0 || stats.handovers == 0 {
				t.Errorf("runs never exercised a path: %+v", stats)
			}
		})
	}
}

// wrongPlannerWorlds is how many runs each rapid check of a wrong planner
// makes (stopping at the first violation). The subtlest one, longestLogWins,
// is caught in roughly one run in ten: it needs a zombie's longer log and a
// later epoch's commits at the same offsets. Five runs per check make a miss
// over 100 checks a 1e-20 event instead of a 1e-5 one.
const wrongPlannerWorlds = 5

// TestProtocolRunsCatchWrongPlanners plugs deliberately wrong planners into
// the same world and requires the checks to catch each. The property never
// fails here: it records the violations it sees, and the test fails if
// rapid's runs found none. (Shrinking a failure would take rapid's whole
// shrink budget and write fail files; counting is what this test needs.)
func TestProtocolRunsCatchWrongPlanners(t *testing.T) {
	wrong := []struct {
		name string
		plan planner
	}{
		{"truncate to the committed bound minus one", truncateBelowBound},
		{"candidate by log end only, never below an HWM", longestLogWins},
		{"truncate by bare offsets, ignoring epochs", bareOffsets},
		{"count members by id, ignoring incarnations", ignoreIncarnations},
	}
	for _, wp := range wrong {
		t.Run(wp.name, func(t *testing.T) {
			var stats worldStats
			caught := map[string]int{}
			var first error
			checks := 0
			rapid.Check(t, func(rt *rapid.T) {
				checks++
				n := rapid.SampledFrom([]int{3, 5}).Draw(rt, "replicas")
				var err error
				for i := 0; i < wrongPlannerWorlds && err == nil; i++ {
					err = runWorld(rt, n, maxSteps, wp.plan, &stats)
				}
				var v *violation
				if errors.As(err, &v) {
					caught[v.kind]++
					if first == nil {
						first = err
					}
				} else if err != nil {
					rt.Fatalf("not a violation: %v", err)
				}
			})
			total := 0
			var kinds []string
			for _, k := range slices.Sorted(maps.Keys(caught)) {
				total += caught[k]
				kinds = append(kinds, fmt.Sprintf("%s x%d", k, caught[k]))
			}
			if total == 0 {
				t.Fatalf("no violation in %d checks (%d runs, %d steps): the checks cannot tell this planner from Decide", checks, stats.runs, stats.steps)
			}
			t.Logf("caught in %d of %d checks (%d runs, %d steps; %s); first: %v", total, checks, stats.runs, stats.steps, strings.Join(kinds, ", "), first)
		})
	}
}

// ignoreIncarnations is issue 24's first hole: a replica whose disk was
// wiped answers under its old id with an empty log, and counts as a member.
func ignoreIncarnations(in promoter.Input) (promoter.Plan, error) {
	in.Incarnations = nil
	return promoter.Decide(in)
}

// truncateBelowBound plans like Decide but cuts every follower that reaches
// the committed bound to one below it: it removes a committed record.
func truncateBelowBound(in promoter.Input) (promoter.Plan, error) {
	plan, err := promoter.Decide(in)
	if err != nil || plan.CommittedBound == 0 {
		return plan, err
	}
	to := plan.CommittedBound - 1
	plan.Truncations = nil
	for _, id := range plan.Followers {
		end, target := logEndOf(plan, id), to
		for _, tr := range plan.Truncations {
			if tr.ReplicaID == id {
				target = min(target, tr.To)
			}
		}
		if target < end {
			plan.Truncations = append(plan.Truncations, promoter.Truncation{ReplicaID: id, From: end, To: target})
		}
	}
	return plan, nil
}

// longestLogWins is the failure KIP-101 and Raft's election restriction
// exist to prevent: the candidate is the longest log, ignoring epochs. It is
// careful otherwise (divergence points, never below a replica's HWM, never
// DataLoss), so only the data-level checks can catch it.
func longestLogWins(in promoter.Input) (promoter.Plan, error) {
	type st struct {
		id          string
		end, hwm    uint64
		history     []journal.EpochStart
		known, kept bool
	}
	var fenced []st
	for _, a := range in.Answers {
		if a.Err != nil {
			continue
		}
		known := !a.Unimplemented && (len(a.History) > 0 || a.LogEnd == 0)
		fenced = append(fenced, st{id: a.ReplicaID, end: a.LogEnd, hwm: a.HWM, history: a.History, known: known})
	}
	var plan promoter.Plan
	known := 0
	var cand *st
	for i := range fenced {
		s := &fenced[i]
		plan.CommittedBound = max(plan.CommittedBound, s.hwm)
		if !s.known {
			continue
		}
		known++
		if cand == nil || s.end > cand.end || s.end == cand.end && s.id < cand.id {
			cand = s
		}
	}
	if known < wire.Quorum(len(in.Replicas)) {
		return promoter.Plan{}, &promoter.PlanError{Code: connect.CodeUnavailable, Message: "no quorum"}
	}
	plan.Candidate = cand.id
	for _, s := range fenced {
		switch {
		case s.id == cand.id:
		case !s.known:
			plan.Unreconciled = append(plan.Unreconciled, s.id)
		default:
			d, ok := journal.DivergencePoint(cand.history, s.history)
			if !ok {
				d = 0
			}
			target := max(min(s.end, cand.end, d), s.hwm)
			if target < s.end {
				plan.Truncations = append(plan.Truncations, promoter.Truncation{ReplicaID: s.id, From: s.end, To: target})
			}
			plan.Followers = append(plan.Followers, s.id)
		}
	}
	return plan, nil
}

// bareOffsets picks Decide's candidate but cuts followers by offsets alone,
// to the candidate's log end: the pre-KIP-101 rule, blind to a diverged
// tail that sits within the candidate's length.
func bareOffsets(in promoter.Input) (promoter.Plan, error) {
	plan, err := promoter.Decide(in)
	if err != nil {
		return plan, err
	}
	cend := logEndOf(plan, plan.Candidate)
	plan.Truncations = nil
	for _, id := range plan.Followers {
		if end := logEndOf(plan, id); end > cend {
			plan.Truncations = append(plan.Truncations, promoter.Truncation{ReplicaID: id, From: end, To: cend})
		}
	}
	return plan, nil
}

func logEndOf(plan promoter.Plan, id string) uint64 {
	for _, f := range plan.Fenced {
		if f.GetReplicaId() == id {
			return f.GetLogEnd()
		}
	}
	panic("logEndOf: no replica " + id)
}
