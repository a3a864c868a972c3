package promoter_test

import (
	"fmt"

	"pgregory.net/rapid"

	"github.com/tenurelog/tenure/services/promoter"
)

// This file is the membership half of the simulated range
// (plan_world_test.go): disks that are wiped and come back under their old
// id with a new incarnation, and membership changes one replica at a time
// (add a learner, make a learner a voter, remove a member), each made only
// after the newest leader's epoch-start record committed, in flight until a
// leader adopted under the new set commits its own, and carried out by a
// promotion. The invariants checked after every step are the same.

// isMember: a voter or a learner of the current set.
func (w *world) isMember(i int) bool { return w.voter[i] || w.learner[i] }

// fenceable: what a promotion fences: the members, and the voters a removal
// in flight dropped (fencing is what stops them serving).
func (w *world) fenceable(i int) bool {
	return w.isMember(i) || w.oldVoter != nil && w.oldVoter[i]
}

// counts: a voter of the old or the new set, of its recorded incarnation.
func (w *world) counts(i int) bool {
	return (w.voter[i] || w.oldVoter != nil && w.oldVoter[i]) && w.rs[i].inc == w.memberInc[i]
}

// input is the promotion's membership as the lease service would give it.
func (w *world) input(e uint64) promoter.Input {
	in := promoter.Input{Epoch: e, Incarnations: map[string]string{}}
	for i, id := range w.ids {
		switch {
		case w.voter[i]:
			in.Replicas = append(in.Replicas, id)
		case w.learner[i]:
			in.Learners = append(in.Learners, id)
		}
		if w.fenceable(i) {
			in.Incarnations[id] = fmt.Sprint(w.memberInc[i])
		}
	}
	if w.oldVoter != nil {
		in.OldVoters = []string{}
		for i, id := range w.ids {
			if w.oldVoter[i] {
				in.OldVoters = append(in.OldVoters, id)
			}
		}
	}
	return in
}

// hasQuorum is the world's own count of what Decide must require: known,
// fenced answers of the members' incarnations from a majority of the voters,
// and of the old voters while a change is in flight.
func (w *world) hasQuorum(reach []bool, kinds []int) bool {
	majority := func(set []bool) bool {
		n, got := 0, 0
		for i, in := range set {
			if !in {
				continue
			}
			n++
			if reach[i] && w.known(i, kinds[i]) && w.rs[i].inc == w.memberInc[i] {
				got++
			}
		}
		return got >= n/2+1
	}
	return majority(w.voter) && (w.oldVoter == nil || majority(w.oldVoter))
}

// wipe: a replica's disk is replaced. It comes back under its id with
// nothing: no log, no journal, no HWM, no fence, and a new incarnation; it
// hosts nothing until it is added again. At most one member is wiped at a
// time, so runs keep a quorum to recover with more often than not.
//
// A wipe never destroys the last copy of an acknowledged record that a
// promotion can still consult (holdsElsewhere): no protocol survives that,
// and the checks would blame the planner for a loss of more disks than the
// range tolerates. The member rule alone does not bound it: a wiped member
// removed from the range no longer counts as wiped, and a second wipe
// then met the only replica holding what the first disk had acknowledged
// (3 voters; {3,3} committed on r1 and r3; r1 wiped and removed; r3
// wiped: two disks lost of three, the seed CI met on 2026-12-06).
func (w *world) wipe(t *rapid.T) error {
	for i := range w.rs {
		if w.isMember(i) && w.rs[i].inc != w.memberInc[i] {
			return nil
		}
	}
	i := rapid.IntRange(0, len(w.rs)-1).Draw(t, "wiped")
	if !w.holdsElsewhere(i) {
		return nil
	}
	r := w.rs[i]
	w.nextInc++
	*r = simReplica{id: r.id, leader: -1, inc: w.nextInc}
	w.wipes++
	return nil
}

// holdsElsewhere reports whether every acknowledged record sits, at its
// offset, in the log of a replica other than i that a promotion counts: a
// voter (of the new or the old set) of its recorded incarnation. A copy on
// a learner or on a removed voter is no copy: neither can lead.
func (w *world) holdsElsewhere(i int) bool {
	for o, rec := range w.committed {
		held := false
		for j, r := range w.rs {
			if j != i && w.counts(j) && o < len(r.log) && r.log[o] == rec {
				held = true
				break
			}
		}
		if !held {
			return false
		}
	}
	return true
}

// canChange is when the promoter makes a membership step: with no change in
// flight, and only once the newest leader's own epoch-start record has
// committed (the single-server-change bug of Raft, 2015: a step on a leader
// that has not yet committed in its epoch can meet a step of an earlier
// leader in no common replica).
func (w *world) canChange() bool {
	if w.oldVoter != nil {
		return false
	}
	top := w.newestLeader()
	if top < 0 {
		return false
	}
	l := w.rs[top]
	return l.hwm > l.journal[len(l.journal)-1].Start
}

// changeMembership makes one step and runs its promotion, as the promoter
// does. canChange holds.
func (w *world) changeMembership(t *rapid.T) error {
	voters := 0
	for i := range w.rs {
		if w.voter[i] {
			voters++
		}
	}
	i := rapid.IntRange(0, len(w.rs)-1).Draw(t, "member")
	old := append([]bool(nil), w.voter...)
	switch {
	case !w.isMember(i):
		// Add as a learner, recording the incarnation it has now.
		w.learner[i], w.memberInc[i] = true, w.rs[i].inc
	case w.rs[i].inc != w.memberInc[i] || !rapid.Bool().Draw(t, "promote-not-remove"):
		// A wiped member is removed (to be added again); others sometimes.
		if w.voter[i] && voters <= 2 {
			return nil
		}
		w.voter[i], w.learner[i] = false, false
	case w.learner[i]:
		w.learner[i], w.voter[i] = false, true
	default:
		return nil
	}
	w.oldVoter, w.changeEpoch = old, w.epoch
	w.steps++
	reach := make([]bool, len(w.rs))
	for j := range reach {
		reach[j] = rapid.Bool().Draw(t, "reach")
	}
	return w.promote(t, reach)
}

// completeChange ends the change in flight once a leader adopted after it
// (so under the new set) has committed its own epoch-start record.
func (w *world) completeChange(l *simReplica) {
	if w.oldVoter == nil || l.epoch <= w.changeEpoch {
		return
	}
	// Only the newest leader completes it; there may be none (a newer
	// epoch was granted and its leader is not leading yet).
	if top := w.newestLeader(); top < 0 || w.rs[top] != l {
		return
	}
	if l.hwm > l.journal[len(l.journal)-1].Start {
		w.oldVoter = nil
	}
}
