package check

import (
	"fmt"
	"sort"
	"time"
)

// DefaultLinearizabilityTimeout bounds the porcupine search of one run.
// Linearizability checking is NP-hard; past the bound the verdict is
// VerdictUnknown rather than a hung suite.
const DefaultLinearizabilityTimeout = 60 * time.Second

// DefaultMaxProblems is how many problems of each kind a Report spells out;
// the rest are summarised in one line per kind.
const DefaultMaxProblems = 5

// Options tune Check.
type Options struct {
	// LinearizabilityTimeout bounds the porcupine search; 0 means
	// DefaultLinearizabilityTimeout. Negative means no bound.
	LinearizabilityTimeout time.Duration
	// MaxProblems is how many problems per kind are described; 0 means
	// DefaultMaxProblems.
	MaxProblems int
}

// Verdict is the outcome of the linearizability check.
type Verdict string

const (
	// VerdictOK: porcupine found a linearization of every range.
	VerdictOK Verdict = "ok"
	// VerdictIllegal: some range's history has no linearization.
	VerdictIllegal Verdict = "illegal"
	// VerdictUnknown: the search timed out before deciding.
	VerdictUnknown Verdict = "unknown"
)

// OpCounts counts client operations by kind and outcome, indexed
// directly by the Kind and Outcome constants: c[Append][OK].
type OpCounts [Read + 1][Unknown + 1]int

// Report is what Check found in one run. Every field from Lost to
// FailedButApplied is a safety column: a correct system keeps it at zero.
type Report struct {
	Seed int64
	// Void says why the run does not count ("" when it counts); see
	// Run.Void.
	Void string

	OpsByOutcome OpCounts

	// Trimmed counts committed client records (one per value) below the
	// log start the system reported for their range (a final replica's,
	// or one a read answered): deleted by retention on purpose, so no
	// quorum need hold them; a replica whose committed prefix still holds
	// the offset must hold the record all the same (Lost). Not a safety
	// column: it says how much of a run retention removed.
	Trimmed int

	// Lost counts committed records (acknowledged appends and client
	// records an OK read returned, one per value) missing from the final
	// state: absent or different at their offset on a replica whose final
	// committed prefix [LogStart, HWM) holds it, or, at or above the
	// reported log start (Trimmed), held by fewer than a majority of the
	// replicas in Final.
	Lost int
	// Duplicates counts append values seen at two or more offsets of one
	// range, across acknowledgements, replicas' committed prefixes and reads.
	Duplicates int
	// InconsistentOffsets counts offsets of one range observed holding two
	// different records (value, epoch, epoch-start flag) across replicas'
	// committed prefixes, reads and acknowledgements.
	InconsistentOffsets int
	// DivergentPrefixes counts pairs of replicas of one range whose
	// committed prefixes differ over the range both have committed,
	// [max(LogStart), min(HWM)).
	DivergentPrefixes int
	// HWMRegressions counts HWM samples lower than an earlier sample of
	// the same replica, range and incarnation.
	HWMRegressions int
	// StaleEpochAcceptances counts epoch events (acked, truncated,
	// adopted, served-fetch) at an epoch below one the replica had already
	// been fenced at when the call arrived.
	StaleEpochAcceptances int
	// AckedTruncated counts truncations that removed a committed record
	// the replica held, per its fence-time epoch history.
	AckedTruncated int
	// FailedButApplied counts appends reported Failed (certainly no
	// effect) whose value is in some replica's log or in a read.
	FailedButApplied int

	// Stuck counts, per healing, the ranges that did not serve an
	// acknowledged append and a read, or whose promoter view did not agree
	// with their replicas', within the liveness bound (Run.Liveness). It is no
	// safety column (nothing wrong was accepted) but must be zero too, and
	// it counts in void runs as well: a run whose final append failed is
	// void for the safety columns precisely because it may be stuck.
	Stuck int

	// Linearizable is porcupine's verdict over the client history;
	// IllegalRanges names the ranges without a linearization.
	Linearizable  Verdict
	IllegalRanges []string
	// CheckTime is the wall time of the whole Check, linearizability
	// search included.
	CheckTime time.Duration

	// Problems describes the findings, at most MaxProblems per kind, with
	// the offsets, values and replicas involved.
	Problems []string
}

// Safe says whether the run kept every safety property: all safety
// columns zero and no illegal history. A timed-out search (unknown) is not
// a violation: it found nothing.
func (r Report) Safe() bool {
	return r.Lost == 0 && r.Duplicates == 0 && r.InconsistentOffsets == 0 &&
		r.DivergentPrefixes == 0 && r.HWMRegressions == 0 &&
		r.StaleEpochAcceptances == 0 && r.AckedTruncated == 0 &&
		r.FailedButApplied == 0 && r.Linearizable != VerdictIllegal
}

// Live says whether every range of the run came back after healing.
func (r Report) Live() bool { return r.Stuck == 0 }

// Void says why the run does not count, or "" if it does. A run without
// traffic before the first fault or while faults were active exercised
// nothing, and one whose final append failed did not heal, so its final
// state is not a settled state to judge.
func (r Run) Void() string {
	switch {
	case r.TrafficBefore == 0:
		return "no traffic before faults"
	case r.TrafficDuring == 0:
		return "no traffic during faults"
	case !r.FinalAppendOK:
		return "final append failed"
	}
	return ""
}

// Counts says whether the run counts toward the scoreboard.
func (r Run) Counts() bool { return r.Void() == "" }

// Check judges one run with the default options.
func Check(run Run) Report { return CheckWith(run, Options{}) }

// CheckWith judges one run. It is pure: it reads run and nothing else.
func CheckWith(run Run, opts Options) Report {
	start := time.Now()
	if opts.LinearizabilityTimeout == 0 {
		opts.LinearizabilityTimeout = DefaultLinearizabilityTimeout
	}
	if opts.MaxProblems <= 0 {
		opts.MaxProblems = DefaultMaxProblems
	}
	rep := Report{Seed: run.Seed, Void: run.Void()}
	p := &problems{max: opts.MaxProblems}

	for _, op := range run.History {
		if op.Kind <= Read && op.Outcome <= Unknown {
			rep.OpsByOutcome[op.Kind][op.Outcome]++
		}
	}

	ranges := indexRanges(run)
	for _, name := range sortedKeys(ranges) {
		rs := ranges[name]
		rep.InconsistentOffsets += rs.checkInconsistentOffsets(p)
		rep.Duplicates += rs.checkDuplicates(p)
		lost, trimmed := rs.checkLost(p)
		rep.Lost += lost
		rep.Trimmed += trimmed
		rep.DivergentPrefixes += rs.checkDivergentPrefixes(p)
		rep.FailedButApplied += rs.checkFailedButApplied(p)
		rep.AckedTruncated += rs.checkAckedTruncated(p)
	}
	rep.HWMRegressions = checkHWMRegressions(run.HWMs, p)
	rep.StaleEpochAcceptances = checkStaleEpochs(run.Epochs, p)
	rep.Stuck = checkLiveness(run.Liveness, p)

	rep.Linearizable, rep.IllegalRanges = checkLinearizable(ranges, opts.LinearizabilityTimeout, p)

	rep.Problems = p.list()
	rep.CheckTime = time.Since(start)
	return rep
}

// problems collects human-readable findings, bounded per kind so that a
// run with thousands of violations still prints a readable report.
type problems struct {
	max    int
	kinds  []string // in first-seen order
	shown  map[string][]string
	hidden map[string]int
}

func (p *problems) add(kind, format string, args ...any) {
	if p.shown == nil {
		p.shown = map[string][]string{}
		p.hidden = map[string]int{}
	}
	if _, seen := p.shown[kind]; !seen {
		p.kinds = append(p.kinds, kind)
		p.shown[kind] = nil
	}
	if len(p.shown[kind]) >= p.max {
		p.hidden[kind]++
		return
	}
	p.shown[kind] = append(p.shown[kind], kind+": "+fmt.Sprintf(format, args...))
}

func (p *problems) list() []string {
	var out []string
	for _, k := range p.kinds {
		out = append(out, p.shown[k]...)
		if n := p.hidden[k]; n > 0 {
			out = append(out, fmt.Sprintf("%s: ... and %d more", k, n))
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// short renders a record value for a problem line: quoted, and cut so a
// large value does not swamp the report.
func short(v []byte) string {
	const max = 32
	if len(v) > max {
		return fmt.Sprintf("%q...(%d bytes)", v[:max], len(v))
	}
	return fmt.Sprintf("%q", v)
}
