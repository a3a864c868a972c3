package promoter_test

import (
	"errors"
	"fmt"
	"slices"

	"connectrpc.com/connect"
	"pgregory.net/rapid"

	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/services/promoter"
)

// This file is a simulated range for the property test: the Go counterpart
// of shared/model/promotion_sim.py. Replicas hold logs of (epoch, id)
// records and epoch journals. Leaders append (zombies too, as long as nobody
// fenced them), followers fetch with the KIP-320 check and journal a new
// epoch from the record's own epoch, the HWM advances by quorum and only
// past the leader's epoch-start record, promotions fence a random subset and
// hand the answers to a planner whose plan the world then carries out, and
// a reconcile loop brings stragglers under the newest leader. Every choice
// is a rapid draw, so a failing run shrinks to a short one.
//
// Where the Python model asserts, the world returns a *violation naming
// which check failed, so a test can also count what catches a wrong planner.

// record is one log record: the epoch that wrote it and a unique id. Two
// records are the same record exactly when both are equal.
type record struct{ epoch, id uint64 }

type role uint8

const (
	follower role = iota
	leader
	stopped // a leader fenced by a later promotion: it acts no more
)

type simReplica struct {
	id      string
	log     []record
	journal []journal.EpochStart
	// Invariant: hwm <= len(log).
	hwm uint64
	// fenced is the highest epoch it was fenced at.
	fenced uint64
	role   role
	// epoch is the epoch it leads or follows; leader is whom it follows.
	epoch  uint64
	leader int // index into world.rs; -1 for none
	// acked is, on a leader, each follower's fetch offset that passed the
	// fetch check (-1: none yet). Only these count toward the commit.
	acked []int64
	// inc is the incarnation of its disk: a wipe gives it a new one.
	inc uint64
	// config is, on a leader, the voters it was adopted with: only their
	// fetch offsets count, and its quorum is a majority of them.
	config []bool
}

func (r *simReplica) logEnd() uint64 { return uint64(len(r.log)) }

// recordEpoch is journal.Journal.Record's rule: the same pair again is a
// no-op, an older epoch is ignored, a start below the latest is refused.
func (r *simReplica) recordEpoch(epoch, start uint64) error {
	if n := len(r.journal); n > 0 {
		last := r.journal[n-1]
		if epoch < last.Epoch {
			return nil
		}
		if epoch == last.Epoch {
			if start != last.Start {
				return violationf("model", "%s journals epoch %d at %d, already at %d", r.id, epoch, start, last.Start)
			}
			return nil
		}
		if start < last.Start {
			return violationf("model", "%s journals epoch %d at %d, below the latest start %d", r.id, epoch, start, last.Start)
		}
	}
	r.journal = append(r.journal, journal.EpochStart{Epoch: epoch, Start: start})
	return nil
}

// truncate is the replica's own guard: never below its HWM.
func (r *simReplica) truncate(to uint64, kind, why string) error {
	if to < r.hwm {
		return violationf(kind, "%s truncates to %d below its HWM %d (%s)", r.id, to, r.hwm, why)
	}
	if to < r.logEnd() {
		r.log = r.log[:to]
		r.journal = slices.DeleteFunc(r.journal, func(e journal.EpochStart) bool { return e.Start >= to })
	}
	return nil
}

// planner is Decide or a deliberately wrong stand-in.
type planner func(promoter.Input) (promoter.Plan, error)

// violation is a failed check. kind says which check.
type violation struct{ kind, msg string }

func (v *violation) Error() string { return v.kind + ": " + v.msg }

func violationf(kind, format string, args ...any) *violation {
	return &violation{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// worldStats accumulates over runs, for the test log.
type worldStats struct {
	runs, steps, promotions, plans, unavailable int
	truncations, unreconciled, fetchCuts        int
	committed                                   int
	memberSteps, wipes, excluded                int
	// handovers counts plans whose candidate is the handover target where
	// the same answers without the handover chose another replica.
	handovers int
	maxEpoch  uint64
}

type world struct {
	rs    []*simReplica
	ids   []string
	q     int
	epoch uint64 // the last epoch granted
	uid   uint64
	// committed[o] is the acknowledged record at offset o. The acknowledged
	// offsets are always exactly [0, len(committed)).
	committed []record
	plan      planner
	// mixed: some fence answers come from older versions or broken journals.
	mixed bool
	stats *worldStats

	// Membership (plan_members_world_test.go). voter and learner say who is
	// a member; oldVoter is the voter set before the change in flight (nil
	// when none is), made at epoch changeEpoch; memberInc is each member's
	// recorded incarnation. members says whether this run changes
	// membership and wipes disks at all.
	members        bool
	voter, learner []bool
	oldVoter       []bool
	changeEpoch    uint64
	memberInc      []uint64
	nextInc        uint64
	steps, wipes   int
}

// answer kinds in a fence
const (
	answerKnown  = iota // the replica's history, as journaled
	answerOlder         // Unimplemented: an older version
	answerBroken        // an empty history (missing or broken journal)
)

// runWorld runs one protocol run of up to steps steps with n replicas,
// planning every promotion with plan. It returns the first violation.
func runWorld(t *rapid.T, n, steps int, plan planner, stats *worldStats) error {
	w := &world{q: n/2 + 1, plan: plan, stats: stats}
	w.mixed = rapid.Bool().Draw(t, "mixed-versions")
	w.members = rapid.Bool().Draw(t, "membership")
	pool := n
	if w.members {
		pool++ // a spare to add
	}
	for i := range pool {
		id := fmt.Sprintf("r%d", i+1)
		w.ids = append(w.ids, id)
		w.nextInc++
		w.rs = append(w.rs, &simReplica{id: id, leader: -1, inc: w.nextInc})
		w.voter = append(w.voter, i < n)
		w.learner = append(w.learner, false)
		w.memberInc = append(w.memberInc, w.nextInc)
	}
	stats.runs++
	defer func() {
		stats.committed += len(w.committed)
		stats.maxEpoch = max(stats.maxEpoch, w.epoch)
		stats.memberSteps += w.steps
		stats.wipes += w.wipes
	}()

	// The range's first promotion reaches everyone.
	all := make([]bool, len(w.rs))
	for i := range all {
		all[i] = true
	}
	if err := w.promote(t, all); err != nil {
		return err
	}
	for range steps {
		stats.steps++
		var err error
		// rapid biases draws toward small values (0..9 comes out about 43%
		// of the time) and shrinks toward 0, so the ranges are laid out for
		// this mix: fetch 43%, append 27%, advance 16%, reconcile 5%,
		// promote 9.5%. Against the model's mix (advance 10%) leaderships
		// last a little longer and commit more, which is what gives a wrong
		// candidate something to lose.
		// A membership run also draws, each step, whether to wipe a disk
		// (about 1 in 150) or make a membership step (about 1 in 5, when one can
		// be made; the regular action otherwise).
		m := -1
		if w.members {
			m = rapid.IntRange(0, 99).Draw(t, "membership-action")
		}
		switch a := rapid.IntRange(0, 99).Draw(t, "action"); {
		case m == 99:
			err = w.wipe(t)
		case m >= 70 && w.canChange():
			err = w.changeMembership(t)
		case a < 10:
			err = w.fetch(t)
		case a < 45:
			w.append(t)
		case a < 75:
			err = w.advanceAll()
		case a < 85:
			w.reconcile(t)
		default:
			reach := make([]bool, len(w.rs))
			for i := range reach {
				reach[i] = rapid.Bool().Draw(t, "reach")
			}
			err = w.promote(t, reach)
		}
		if err == nil {
			err = w.check()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// append: a leader appends one record under its epoch. Zombies too: a leader
// nobody fenced does not know it was deposed.
func (w *world) append(t *rapid.T) {
	var leaders []*simReplica
	for _, r := range w.rs {
		if r.role == leader {
			leaders = append(leaders, r)
		}
	}
	if len(leaders) == 0 {
		return
	}
	l := leaders[rapid.IntRange(0, len(leaders)-1).Draw(t, "appender")]
	// A replica fenced above its epoch acts no more under it.
	if l.fenced <= l.epoch {
		w.uid++
		l.log = append(l.log, record{l.epoch, w.uid})
	}
}

// fetch: one follower pulls from its leader, KIP-320 style.
func (w *world) fetch(t *rapid.T) error {
	fi := rapid.IntRange(0, len(w.rs)-1).Draw(t, "fetcher")
	f := w.rs[fi]
	if f.role != follower || f.leader < 0 {
		return nil
	}
	l := w.rs[f.leader]
	// Both sides act only at exactly their own epoch: a leader or follower
	// fenced above it has stopped.
	if l.role != leader || l.epoch != f.epoch || l.fenced > l.epoch || f.fenced > f.epoch {
		return nil
	}
	if len(f.log) > 0 {
		last := f.log[len(f.log)-1].epoch
		found, end, ok := journal.EndOffsetFor(l.journal, last, l.logEnd())
		if !ok || found != last || end < f.logEnd() {
			// The leader never wrote f's tail under that epoch: cut it.
			to := uint64(0)
			if ok {
				to = end
			}
			w.stats.fetchCuts++
			return f.truncate(min(to, f.logEnd()), "fetch-cut-below-hwm", "fetch divergence")
		}
	}
	if f.logEnd() > l.logEnd() {
		return violationf("model", "%s passed the fetch check ending at %d beyond leader %s at %d", f.id, f.logEnd(), l.id, l.logEnd())
	}
	// Only an offset that passed the check counts toward the commit.
	l.acked[fi] = int64(f.logEnd())
	k := uint64(rapid.IntRange(1, 4).Draw(t, "batch"))
	for _, rec := range l.log[f.logEnd():min(f.logEnd()+k, l.logEnd())] {
		// A follower journals a new epoch from the record's own epoch, at
		// the offset it lands on: its history mirrors the leader's.
		if len(f.journal) == 0 || rec.epoch > f.journal[len(f.journal)-1].Epoch {
			if err := f.recordEpoch(rec.epoch, f.logEnd()); err != nil {
				return err
			}
		}
		f.log = append(f.log, rec)
	}
	f.hwm = max(f.hwm, min(l.hwm, f.logEnd()))
	return nil
}

// advanceAll lets every unfenced leader advance its HWM.
func (w *world) advanceAll() error {
	for _, l := range w.rs {
		if err := w.advance(l); err != nil {
			return err
		}
	}
	return nil
}

// advance: the HWM moves to the highest offset on a quorum, and only past
// the leader's own epoch-start record (Raft §5.4.2).
func (w *world) advance(l *simReplica) error {
	if l.role != leader || l.fenced > l.epoch {
		return nil
	}
	// The leader is a voter of its own config (only voters lead), and only
	// its config's voters count.
	ends := []uint64{l.logEnd()}
	voters := 0
	for i, a := range l.acked {
		if !l.config[i] {
			continue
		}
		voters++
		if a >= 0 && w.rs[i] != l {
			ends = append(ends, uint64(a))
		}
	}
	q := voters/2 + 1
	if len(ends) < q {
		return nil
	}
	slices.Sort(ends)
	slices.Reverse(ends)
	c := ends[q-1]
	start := l.journal[len(l.journal)-1].Start
	if c <= start || c <= l.hwm {
		return nil
	}
	if c > l.logEnd() || l.hwm > uint64(len(w.committed)) {
		return violationf("model", "leader %s commits to %d (log end %d, HWM %d, %d acknowledged)", l.id, c, l.logEnd(), l.hwm, len(w.committed))
	}
	for o := l.hwm; o < c; o++ {
		if o < uint64(len(w.committed)) {
			if w.committed[o] != l.log[o] {
				return violationf("committed-twice", "offset %d acknowledged as %v and again as %v by %s at epoch %d", o, w.committed[o], l.log[o], l.id, l.epoch)
			}
			continue
		}
		w.committed = append(w.committed, l.log[o])
	}
	l.hwm = c
	w.completeChange(l)
	return nil
}

// reconcile: the promoter's loop brings a straggler under the newest leader
// (fence at the current epoch, adopt as follower; the fetch check cuts
// whatever diverged).
func (w *world) reconcile(t *rapid.T) {
	top := w.newestLeader()
	if top < 0 {
		return
	}
	l := w.rs[top]
	ri := rapid.IntRange(0, len(w.rs)-1).Draw(t, "straggler")
	r := w.rs[ri]
	// Only a member, of its own incarnation: the fence names the recorded
	// one, and a wiped replica refuses it.
	if !w.isMember(ri) || r.inc != w.memberInc[ri] {
		return
	}
	if r != l && r.fenced <= l.epoch && r.epoch < l.epoch {
		r.fenced, r.role, r.epoch, r.leader = l.epoch, follower, l.epoch, top
	}
}

// newestLeader is the leader of the newest epoch any replica acts under, or
// -1 if that epoch's leader is not (yet) leading.
func (w *world) newestLeader() int {
	top, newest := -1, uint64(0)
	for i, r := range w.rs {
		newest = max(newest, r.epoch)
		if r.role == leader && (top < 0 || r.epoch > w.rs[top].epoch) {
			top = i
		}
	}
	if top < 0 || w.rs[top].epoch != newest {
		return -1
	}
	return top
}

// promote grants the next epoch, fences the reached replicas, asks the
// planner and carries its plan out.
func (w *world) promote(t *rapid.T, reach []bool) error {
	w.stats.promotions++
	w.epoch++
	e := w.epoch
	in := w.input(e)
	if p := rapid.IntRange(0, len(in.Replicas)).Draw(t, "preferred"); p < len(in.Replicas) {
		in.Preferred = in.Replicas[p]
	}
	// A planned handover to a random member, about half the time: the
	// planner may then lead from a shorter log than the most complete, and
	// every check below (no acknowledged record lost) must still hold.
	if h := rapid.IntRange(0, 2*len(in.Replicas)).Draw(t, "handover-to"); h < len(in.Replicas) {
		in.HandoverTo = in.Replicas[h]
	}
	omitRefused := rapid.Bool().Draw(t, "omit-refused")
	kinds := make([]int, len(w.rs))
	for i, r := range w.rs {
		if !w.fenceable(i) {
			continue
		}
		if !reach[i] {
			if !omitRefused {
				in.Answers = append(in.Answers, promoter.Answer{ReplicaID: r.id, Err: errors.New("unreachable")})
			}
			continue
		}
		// e is the newest epoch, so every reached replica accepts it.
		r.fenced = e
		actingLeader := r.role == leader
		if r.role == leader {
			r.role = stopped
		}
		a := promoter.Answer{ReplicaID: r.id, LogEnd: r.logEnd(), HWM: r.hwm, Incarnation: fmt.Sprint(r.inc), ActingLeader: actingLeader}
		if w.mixed {
			// Draws shrink toward 0: known is the simplest answer. Each
			// unknown kind comes out about 7% of the time.
			switch k := rapid.IntRange(0, 15).Draw(t, "answer"); k {
			case 14:
				kinds[i] = answerOlder
			case 15:
				kinds[i] = answerBroken
			}
		}
		switch kinds[i] {
		case answerKnown:
			a.History = slices.Clone(r.journal)
		case answerOlder:
			a.Unimplemented = true
		}
		in.Answers = append(in.Answers, a)
	}
	quorum := w.hasQuorum(reach, kinds)

	plan, err := w.plan(in)
	if err != nil {
		var pe *promoter.PlanError
		if errors.As(err, &pe) && pe.Code == connect.CodeUnavailable && !quorum {
			w.stats.unavailable++
			return nil
		}
		return violationf("planner-error", "promotion at epoch %d (quorum of known fenced members: %v): %v", e, quorum, err)
	}
	if !quorum {
		return violationf("bad-plan", "a plan at epoch %d without a quorum of known, fenced voters of the member's incarnation", e)
	}
	w.stats.plans++
	if in.HandoverTo != "" && plan.Candidate == in.HandoverTo {
		without := in
		without.HandoverTo = ""
		if base, err := promoter.Decide(without); err == nil && base.Candidate != plan.Candidate {
			w.stats.handovers++
		}
	}
	return w.apply(e, reach, kinds, plan)
}

// known reports whether replica i's answer kind gives a known history.
func (w *world) known(i int, kind int) bool {
	return kind == answerKnown || kind == answerBroken && w.rs[i].logEnd() == 0
}

// apply checks the plan's shape and carries it out: truncations while
// fenced, then adoption.
func (w *world) apply(e uint64, reach []bool, kinds []int, plan promoter.Plan) error {
	index := make(map[string]int, len(w.ids))
	for i, id := range w.ids {
		index[id] = i
	}
	// Every fenced replica has exactly one part: candidate, follower (known
	// history) or unreconciled (unknown history).
	part := make([]string, len(w.rs))
	assign := func(id, p string) error {
		i, ok := index[id]
		if !ok || !reach[i] || part[i] != "" {
			return violationf("bad-plan", "epoch %d: %s %q is unknown, unfenced or listed twice", e, p, id)
		}
		part[i] = p
		return nil
	}
	if err := assign(plan.Candidate, "candidate"); err != nil {
		return err
	}
	for _, id := range plan.Followers {
		if err := assign(id, "follower"); err != nil {
			return err
		}
	}
	for _, id := range plan.Unreconciled {
		if err := assign(id, "unreconciled"); err != nil {
			return err
		}
	}
	for _, id := range plan.Learners {
		if err := assign(id, "learner"); err != nil {
			return err
		}
	}
	for _, id := range plan.Excluded {
		if err := assign(id, "excluded"); err != nil {
			return err
		}
	}
	var bound uint64
	for i, r := range w.rs {
		if !reach[i] || !w.fenceable(i) {
			continue
		}
		known := w.known(i, kinds[i])
		mismatch := r.inc != w.memberInc[i]
		if w.counts(i) {
			bound = max(bound, r.hwm)
		}
		var ok bool
		switch {
		case mismatch:
			ok = part[i] == "excluded"
		case !w.isMember(i):
			// A removed voter: fenced, never adopted.
			ok = part[i] == ""
		case w.learner[i] && known:
			ok = part[i] == "learner" || part[i] == "excluded"
		case !known:
			ok = part[i] == "unreconciled"
		default:
			ok = part[i] == "follower" || part[i] == "candidate"
		}
		if !ok {
			return violationf("bad-plan", "epoch %d: %s (history known: %v, voter %v, learner %v, incarnation %d of member's %d) is %q",
				e, r.id, known, w.voter[i], w.learner[i], r.inc, w.memberInc[i], part[i])
		}
	}
	if !w.voter[index[plan.Candidate]] {
		return violationf("bad-plan", "epoch %d: candidate %s is not a voter", e, plan.Candidate)
	}
	if plan.CommittedBound != bound {
		return violationf("bad-plan", "epoch %d: committed bound %d, largest fenced HWM %d", e, plan.CommittedBound, bound)
	}
	cand := w.rs[index[plan.Candidate]]

	for _, tr := range plan.Truncations {
		i, ok := index[tr.ReplicaID]
		if !ok || part[i] != "follower" && part[i] != "learner" {
			return violationf("bad-plan", "epoch %d: truncation of %q, which is not a follower with a known history", e, tr.ReplicaID)
		}
		r := w.rs[i]
		if tr.From != r.logEnd() || tr.To >= tr.From {
			return violationf("bad-plan", "epoch %d: truncation of %s %d -> %d, its log ends at %d", e, r.id, tr.From, tr.To, r.logEnd())
		}
		for o := tr.To; o < tr.From && o < uint64(len(w.committed)); o++ {
			if r.log[o] == w.committed[o] {
				return violationf("plan-removes-acked", "epoch %d: truncation of %s to %d removes acknowledged record %v at %d", e, r.id, tr.To, r.log[o], o)
			}
		}
		if err := r.truncate(tr.To, "plan-below-hwm", fmt.Sprintf("plan at epoch %d", e)); err != nil {
			return err
		}
		w.stats.truncations++
	}
	// A replica agrees with the candidate before it follows it.
	for _, id := range slices.Concat(plan.Followers, plan.Learners) {
		r := w.rs[index[id]]
		if r.logEnd() > cand.logEnd() || !slices.Equal(r.log, cand.log[:r.logEnd()]) {
			return violationf("follower-not-prefix", "epoch %d: follower %s (end %d) is not a prefix of candidate %s (end %d) after the plan", e, r.id, r.logEnd(), cand.id, cand.logEnd())
		}
	}
	w.stats.unreconciled += len(plan.Unreconciled)
	w.stats.excluded += len(plan.Excluded)

	// Adopt: the leader journals (e, log end) before writing the epoch-start
	// record, and raises its HWM to the committed bound.
	if plan.CommittedBound > cand.logEnd() {
		return violationf("bad-plan", "epoch %d: committed bound %d beyond candidate %s's log end %d", e, plan.CommittedBound, cand.id, cand.logEnd())
	}
	if err := cand.recordEpoch(e, cand.logEnd()); err != nil {
		return err
	}
	w.uid++
	cand.log = append(cand.log, record{e, w.uid})
	cand.role, cand.epoch, cand.leader = leader, e, -1
	cand.acked = slices.Repeat([]int64{-1}, len(w.rs))
	cand.config = slices.Clone(w.voter)
	cand.hwm = max(cand.hwm, plan.CommittedBound)
	for i, r := range w.rs {
		if part[i] == "follower" || part[i] == "unreconciled" || part[i] == "learner" {
			r.role, r.epoch, r.leader = follower, e, index[plan.Candidate]
		}
	}
	return nil
}

// check is run after every step: invariants 1 to 3 of docs/design.md.
func (w *world) check() error {
	for _, r := range w.rs {
		if r.hwm > r.logEnd() {
			return violationf("hwm-beyond-log", "%s HWM %d beyond its log end %d", r.id, r.hwm, r.logEnd())
		}
		// Every replica's committed prefix is exactly the acknowledged
		// records. (So any two replicas' committed prefixes agree.)
		if r.hwm > uint64(len(w.committed)) {
			return violationf("hwm-prefix", "%s HWM %d beyond the %d acknowledged records", r.id, r.hwm, len(w.committed))
		}
		for o := range r.hwm {
			if r.log[o] != w.committed[o] {
				return violationf("hwm-prefix", "%s HWM %d but offset %d holds %v, acknowledged %v", r.id, r.hwm, o, r.log[o], w.committed[o])
			}
		}
	}
	// The newest leader holds every acknowledged record.
	if top := w.newestLeader(); top >= 0 {
		l := w.rs[top]
		for o, rec := range w.committed {
			if o >= len(l.log) || l.log[o] != rec {
				return violationf("leader-lacks-acked", "leader %s at epoch %d lacks acknowledged %v at %d (log end %d)", l.id, l.epoch, rec, o, l.logEnd())
			}
		}
	}
	return nil
}
