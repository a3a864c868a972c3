package check

import (
	"fmt"
	"strings"
	"time"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// Liveness is what one range did once every fault of a run was healed: the
// liveness checker's input. A safe system can still wedge (a leader that
// leads and refuses forever, with the promoter calling it healthy): no
// safety column sees that, because nothing wrong is ever accepted.
type Liveness struct {
	Range string
	// Bound is how long after healing the range had to serve and the
	// promoter's view had to agree with the replicas' (LivenessBound).
	Bound time.Duration
	// Appended and Read say that an append was acknowledged and a read
	// answered OK, both through the workload's clients, within Bound.
	Appended, Read bool
	// Agreed says that, polled within Bound after the append and the
	// read, the elected promoter's view agreed with the replicas'
	// (PromoterAgrees): polled until it calls the range healthy, and
	// judged on its last answer.
	Agreed bool
	// Promoter is the elected promoter's last view, for the report (a
	// promoter still not calling a serving range healthy at the bound is
	// worth a look, though not stuck).
	Promoter string
	// Took is how long after healing all three held (0 when they did not).
	Took time.Duration
	// Detail is what the harness last saw when the range did not make it:
	// the error of the last append or read, the promoter's and the
	// leader's view.
	Detail string
}

// Stuck says whether the range failed to come back within its bound.
func (l Liveness) Stuck() bool { return !l.Appended || !l.Read || !l.Agreed }

// LivenessTimings are the timings a range's recovery after healing waits
// on: the replicas' lease TTL and the promoter's intervals (promoter.Config).
type LivenessTimings struct {
	LeaseTTL       time.Duration
	StatusInterval time.Duration // promoter: full status probes
	ProbeInterval  time.Duration // promoter: liveness probes
	ProbeTimeout   time.Duration
	ProbeMisses    int
	FenceTimeout   time.Duration
	RPCTimeout     time.Duration
	RetryMax       time.Duration // promoter: the backoff's cap between attempts
}

// livenessAttempts is how many promotion attempts a range may need after
// healing: one that races the last of the fault (a replica still catching
// up, a lease service just back), one that fails on what the first left
// behind, and one that succeeds.
const livenessAttempts = 3

// LivenessBound is how long after healing a range may take to serve again
// and be seen healthy by the promoter:
//
//   - 2 x LeaseTTL: a lease granted or kept alive just before healing runs
//     out (once), and the keeper of a leader that lost its session opens a
//     new one and rebinds (once more);
//   - StatusInterval + ProbeMisses x ProbeInterval + ProbeTimeout: the
//     promoter sees a leader that does not serve (a full status probe) or
//     does not answer (consecutive missed probes);
//   - livenessAttempts x (FenceTimeout + 2 x RPCTimeout + RetryMax): that
//     many promotion attempts, each a fence round, the slowest of its
//     truncate/adopt and bind calls, and the capped backoff before the next.
//
// With the in-process harness's timings (2 s TTL, the promoter's defaults
// but a 300 ms refresh) that is 26.6 s; a range that is not back by then
// is wedged, not slow: the issue-31 wedge stayed unavailable for as long as
// it was watched. The bound is a liveness bound, not a speed: a healthy
// run serves within a second or two of healing.
func LivenessBound(t LivenessTimings) time.Duration {
	detect := t.StatusInterval + time.Duration(t.ProbeMisses)*t.ProbeInterval + t.ProbeTimeout
	attempt := t.FenceTimeout + 2*t.RPCTimeout + t.RetryMax
	return 2*t.LeaseTTL + detect + livenessAttempts*attempt
}

// checkLiveness counts the stuck ranges of a run and describes each.
func checkLiveness(ls []Liveness, p *problems) int {
	n := 0
	for _, l := range ls {
		if !l.Stuck() {
			continue
		}
		n++
		var what string
		switch {
		case !l.Appended:
			what = "no append acknowledged"
		case !l.Read:
			what = "appended, but no read answered"
		default:
			what = "served, but the promoter's view never agreed with the replicas'"
		}
		p.add("stuck", "range %s: %s within %v of healing: %s", l.Range, what, l.Bound, l.Detail)
	}
	return n
}

// String is the range's liveness in one line, for logs.
func (l Liveness) String() string {
	if !l.Stuck() {
		return fmt.Sprintf("range %s live %v after healing (bound %v; %s)", l.Range, l.Took.Round(time.Millisecond), l.Bound, l.Promoter)
	}
	return fmt.Sprintf("range %s STUCK (bound %v): appended %t, read %t, promoter agreed %t: %s", l.Range, l.Bound, l.Appended, l.Read, l.Agreed, l.Detail)
}

// PromoterAgrees says whether the elected promoter's view of a range (ps,
// nil when it has none) agrees with what its replicas report (statuses, by
// replica id; a replica that did not answer is missing): when the promoter
// calls the range healthy, the leader it names must lead at the
// promoter's epoch, fenced at it, with a valid lease and not halted. The
// wedge of issue 31 is a promoter saying healthy of a leader with
// lease_valid=false: it will never act on a range it believes healthy. A
// promoter that does not call the range healthy (promoting, unavailable,
// no-quorum) claims nothing to disagree with; whether the range serves is
// the append's and the read's to say. A promoter that does not know the
// range at all will never act on it: that disagrees. healthy reports the
// promoter's state, view what was compared, for the report.
func PromoterAgrees(ps *tenurev1.RangePromotionState, statuses map[string]*tenurev1.RangeStatus) (agrees, healthy bool, view string) {
	if ps == nil {
		return false, false, "the elected promoter does not know the range"
	}
	view = fmt.Sprintf("promoter: %s at epoch %d led by %q", ps.GetState(), ps.GetEpoch(), ps.GetLeaderId())
	if ps.GetLastError() != "" {
		view += fmt.Sprintf(" (last error: %s)", ps.GetLastError())
	}
	if ps.GetState() != "healthy" {
		return true, false, view
	}
	st := statuses[ps.GetLeaderId()]
	if st == nil {
		return false, true, view + fmt.Sprintf("; %s does not answer", ps.GetLeaderId())
	}
	view += fmt.Sprintf("; %s: %s at epoch %d (fenced %d), lease_valid=%t", ps.GetLeaderId(),
		strings.ToLower(strings.TrimPrefix(st.GetRole().String(), "ROLE_")), st.GetEpoch(), st.GetFencedEpoch(), st.GetLeaseValid())
	if st.GetHalted() != "" {
		view += ", halted: " + st.GetHalted()
	}
	agrees = st.GetRole() == tenurev1.Role_ROLE_LEADER && st.GetEpoch() == ps.GetEpoch() && st.GetFencedEpoch() == ps.GetEpoch() &&
		st.GetLeaseValid() && st.GetHalted() == ""
	return agrees, true, view
}
