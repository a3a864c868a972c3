package check

import (
	"bytes"
	"fmt"
	"sort"
	"strings"
)

// rangeRun is one range's share of a Run, indexed for the record checkers.
type rangeRun struct {
	name        string
	ops         []Op
	finals      []replicaFinal // one per distinct replica, sorted by name
	truncations []Truncation
	// claims are the committed client records the clients learned of: one
	// per value, acknowledgements first, then records OK reads returned
	// that no acknowledgement already named.
	claims []claim
	// logStart is the highest log start the system reported for the range:
	// a final replica's (ReplicaLog.LogStart) or one a read answered
	// (Op.LogStart, an OutOfRange's LogStartDetail included). Every record
	// below it was committed and then deleted by retention on purpose: a
	// replica only ever removes records below its HWM (logstore
	// AdvanceLogStart, ResetTo). Never inferred from a missing record: a
	// missing record above it is a loss.
	logStart uint64
}

type replicaFinal struct {
	ReplicaLog
	at map[uint64]int // offset -> index in Records
}

// committed says whether offset o is in the replica's committed prefix.
// HWM is exclusive: every offset below it is committed.
func (f *replicaFinal) committed(o uint64) bool {
	return f.LogStart <= o && o < f.HWM
}

// span describes the replica's committed prefix for a problem line.
func (f *replicaFinal) span() string {
	if f.LogStart == 0 {
		return fmt.Sprintf("hwm %d", f.HWM)
	}
	return fmt.Sprintf("log start %d, hwm %d", f.LogStart, f.HWM)
}

// record returns the replica's record at o, if it stores one.
func (f *replicaFinal) record(o uint64) (Record, bool) {
	i, ok := f.at[o]
	if !ok {
		return Record{}, false
	}
	return f.Records[i], true
}

// claim is one committed client record as a client saw it.
type claim struct {
	value  []byte
	offset uint64
	epoch  uint64 // 0 when the source did not name it
	source string
}

func indexRanges(run Run) map[string]*rangeRun {
	ranges := map[string]*rangeRun{}
	get := func(name string) *rangeRun {
		rs := ranges[name]
		if rs == nil {
			rs = &rangeRun{name: name}
			ranges[name] = rs
		}
		return rs
	}
	for _, op := range run.History {
		rs := get(op.Range)
		rs.ops = append(rs.ops, op)
		if op.Kind == Read && op.Outcome == OK {
			rs.logStart = max(rs.logStart, op.LogStart)
		}
	}
	seen := map[[2]string]bool{}
	for _, l := range run.Final {
		// A replica listed twice for a range is counted once, so it cannot
		// make up a majority on its own; the first listing is the one judged.
		key := [2]string{l.Range, l.Replica}
		if seen[key] {
			continue
		}
		seen[key] = true
		f := replicaFinal{ReplicaLog: l, at: make(map[uint64]int, len(l.Records))}
		for i, r := range l.Records {
			f.at[r.Offset] = i
		}
		rs := get(l.Range)
		rs.finals = append(rs.finals, f)
		rs.logStart = max(rs.logStart, l.LogStart)
	}
	for _, t := range run.Truncations {
		rs := get(t.Range)
		rs.truncations = append(rs.truncations, t)
	}
	for _, rs := range ranges {
		sort.Slice(rs.finals, func(i, j int) bool { return rs.finals[i].Replica < rs.finals[j].Replica })
		rs.claims = collectClaims(rs.ops)
	}
	return ranges
}

func collectClaims(ops []Op) []claim {
	var claims []claim
	seen := map[string]bool{}
	for _, op := range ops {
		if op.Kind == Append && op.Outcome == OK && !seen[string(op.Value)] {
			seen[string(op.Value)] = true
			claims = append(claims, claim{op.Value, op.Offset, op.Epoch,
				fmt.Sprintf("ack to client %d", op.Client)})
		}
	}
	for _, op := range ops {
		if op.Kind != Read || op.Outcome != OK {
			continue
		}
		for _, r := range op.Records {
			if r.EpochStart || seen[string(r.Value)] {
				continue
			}
			seen[string(r.Value)] = true
			claims = append(claims, claim{r.Value, r.Offset, r.Epoch,
				fmt.Sprintf("read by client %d from %d", op.Client, op.Offset)})
		}
	}
	return claims
}

// recordKey is what must agree between two observations of one offset.
type recordKey struct {
	value      string
	epoch      uint64 // 0: not named by the source, matches any epoch
	epochStart bool
}

func (a recordKey) matches(b recordKey) bool {
	// Epoch 0 is never a record's epoch (DESIGN: "0 means no grant yet and
	// is never recorded"), so it can only mean the source did not say.
	sameEpoch := a.epoch == b.epoch || a.epoch == 0 || b.epoch == 0
	return a.value == b.value && a.epochStart == b.epochStart && sameEpoch
}

func (a recordKey) String() string {
	if a.epochStart {
		return fmt.Sprintf("epoch-start of %d", a.epoch)
	}
	return fmt.Sprintf("%s@e%d", short([]byte(a.value)), a.epoch)
}

// checkInconsistentOffsets counts offsets observed holding two different
// records. Sources: every replica's committed prefix, every OK read and
// every acknowledgement; all of them speak only of committed records, and
// a committed offset has exactly one record forever.
func (rs *rangeRun) checkInconsistentOffsets(p *problems) int {
	type seen struct {
		key    recordKey
		source string
		bad    bool
	}
	at := map[uint64]*seen{}
	bad := 0
	observe := func(o uint64, k recordKey, source string) {
		s := at[o]
		if s == nil {
			at[o] = &seen{key: k, source: source}
			return
		}
		if s.bad || s.key.matches(k) {
			return
		}
		s.bad = true
		bad++
		p.add("inconsistent-offset", "range %s offset %d: %s has %s, %s has %s",
			rs.name, o, s.source, s.key, source, k)
	}
	for i := range rs.finals {
		f := &rs.finals[i]
		source := "replica " + f.Replica
		for _, r := range f.Records {
			if f.committed(r.Offset) {
				observe(r.Offset, recordKey{string(r.Value), r.Epoch, r.EpochStart}, source)
			}
		}
	}
	for _, op := range rs.ops {
		if op.Kind == Append && op.Outcome == OK {
			observe(op.Offset, recordKey{string(op.Value), op.Epoch, false},
				fmt.Sprintf("ack to client %d", op.Client))
		}
	}
	for _, op := range rs.ops {
		if op.Kind == Read && op.Outcome == OK {
			source := fmt.Sprintf("read by client %d", op.Client)
			for _, r := range op.Records {
				observe(r.Offset, recordKey{string(r.Value), r.Epoch, r.EpochStart}, source)
			}
		}
	}
	return bad
}

// checkDuplicates counts append values seen at more than one offset:
// values are unique per run, so a second offset means the record was
// written twice (a retried append applied twice, or a re-replicated tail
// at a shifted offset).
func (rs *rangeRun) checkDuplicates(p *problems) int {
	offsets := map[string]map[uint64]string{} // value -> offset -> first source
	var order []string
	observe := func(v []byte, o uint64, source string) {
		m := offsets[string(v)]
		if m == nil {
			m = map[uint64]string{}
			offsets[string(v)] = m
			order = append(order, string(v))
		}
		if _, ok := m[o]; !ok {
			m[o] = source
		}
	}
	for i := range rs.finals {
		f := &rs.finals[i]
		for _, r := range f.Records {
			if !r.EpochStart && f.committed(r.Offset) {
				observe(r.Value, r.Offset, "replica "+f.Replica)
			}
		}
	}
	for _, op := range rs.ops {
		if op.Kind == Append && op.Outcome == OK {
			observe(op.Value, op.Offset, fmt.Sprintf("ack to client %d", op.Client))
		}
		if op.Kind == Read && op.Outcome == OK {
			source := fmt.Sprintf("read by client %d", op.Client)
			for _, r := range op.Records {
				if !r.EpochStart {
					observe(r.Value, r.Offset, source)
				}
			}
		}
	}
	dups := 0
	for _, v := range order {
		m := offsets[v]
		if len(m) < 2 {
			continue
		}
		dups++
		var where []string
		for _, o := range sortedOffsets(m) {
			where = append(where, fmt.Sprintf("%d (%s)", o, m[o]))
		}
		p.add("duplicate", "range %s value %s at offsets %s", rs.name, short([]byte(v)), strings.Join(where, ", "))
	}
	return dups
}

func sortedOffsets[V any](m map[uint64]V) []uint64 {
	out := make([]uint64, 0, len(m))
	for o := range m {
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// checkLost counts committed client records (claims) that the final state
// does not hold where it must, and returns how many claims it excused as
// deleted by retention (trimmed). A committed record must be (a) at its
// offset with its value on every replica whose committed prefix,
// [LogStart, HWM), holds that offset, since a replica's committed prefix is
// the committed log; and (b) stored, committed yet or not, on a majority
// of the range's replicas, since it was committed by reaching a quorum and
// no truncation may remove it. The majority is of the voters
// (ReplicaLog.NotVoter): a removed replica or a learner neither makes one
// up nor is needed for one.
//
// Retention is the one way a committed record may go: a claim below the
// range's reported log start (rangeRun.logStart) was deleted on purpose,
// so (b) no longer applies to it, and no replica whose own log starts
// above it is asked for it. (a) still applies: a replica that reports
// holding the offset in its committed prefix must hold the record.
func (rs *rangeRun) checkLost(p *problems) (lost, trimmed int) {
	voters := 0
	for i := range rs.finals {
		if !rs.finals[i].NotVoter {
			voters++
		}
	}
	quorum := voters/2 + 1
	for _, c := range rs.claims {
		// Strictly below: the log start itself is the first offset kept.
		deleted := c.offset < rs.logStart
		if deleted {
			trimmed++
		}
		holders := 0
		var missing []string
		for i := range rs.finals {
			f := &rs.finals[i]
			if c.offset < f.LogStart {
				// Deleted here by retention (or below the leader's log
				// start this replica was reset to); then deleted is true.
				continue
			}
			r, ok := f.record(c.offset)
			has := ok && !r.EpochStart && bytes.Equal(r.Value, c.value)
			if has && !f.NotVoter {
				holders++
			}
			if !has && f.committed(c.offset) {
				what := "nothing"
				if ok {
					what = recordKey{string(r.Value), r.Epoch, r.EpochStart}.String()
				}
				missing = append(missing, fmt.Sprintf("%s (%s) holds %s", f.Replica, f.span(), what))
			}
		}
		if len(missing) == 0 && (deleted || holders >= quorum) {
			continue
		}
		lost++
		detail := strings.Join(missing, "; ")
		if !deleted && holders < quorum {
			if detail != "" {
				detail += "; "
			}
			detail += fmt.Sprintf("held by %d of %d replicas, quorum %d", holders, voters, quorum)
			if rs.logStart > 0 {
				detail += fmt.Sprintf(", at or above the reported log start %d", rs.logStart)
			}
		}
		p.add("lost", "range %s offset %d value %s (%s): %s", rs.name, c.offset, short(c.value), c.source, detail)
	}
	return lost, trimmed
}

// checkDivergentPrefixes counts pairs of replicas whose committed prefixes
// differ over the offsets both have committed, [max(LogStart), min(HWM)).
// It compares record by record, which is comparing the hashes of the two
// ranges without the chance of a collision, and reports the first offset
// that differs. A record missing on one side inside the range is a
// difference: a committed prefix has no holes.
func (rs *rangeRun) checkDivergentPrefixes(p *problems) int {
	pairs := 0
	for i := range rs.finals {
		for j := i + 1; j < len(rs.finals); j++ {
			a, b := &rs.finals[i], &rs.finals[j]
			lo, hi := max(a.LogStart, b.LogStart), min(a.HWM, b.HWM)
			for o := lo; o < hi; o++ {
				ra, oka := a.record(o)
				rb, okb := b.record(o)
				if oka && okb && ra.Epoch == rb.Epoch && ra.EpochStart == rb.EpochStart && bytes.Equal(ra.Value, rb.Value) {
					continue
				}
				pairs++
				desc := func(r Record, ok bool) string {
					if !ok {
						return "nothing"
					}
					return recordKey{string(r.Value), r.Epoch, r.EpochStart}.String()
				}
				p.add("divergent-prefix", "range %s replicas %s and %s (committed [%d,%d)) first differ at offset %d: %s vs %s",
					rs.name, a.Replica, b.Replica, lo, hi, o, desc(ra, oka), desc(rb, okb))
				break
			}
		}
	}
	return pairs
}

// checkFailedButApplied counts Failed appends whose value is stored by any
// replica (committed or not) or returned by a read. Failed means the
// client was told nothing was written; a write proves the classification
// (or the server's refusal) wrong, and a harness that retries a Failed
// append as if it never happened would then duplicate it.
func (rs *rangeRun) checkFailedButApplied(p *problems) int {
	where := map[string]string{}
	for i := range rs.finals {
		f := &rs.finals[i]
		for _, r := range f.Records {
			if !r.EpochStart {
				if _, ok := where[string(r.Value)]; !ok {
					where[string(r.Value)] = fmt.Sprintf("replica %s offset %d", f.Replica, r.Offset)
				}
			}
		}
	}
	for _, op := range rs.ops {
		if op.Kind == Read && op.Outcome == OK {
			for _, r := range op.Records {
				if _, ok := where[string(r.Value)]; !ok && !r.EpochStart {
					where[string(r.Value)] = fmt.Sprintf("read by client %d at offset %d", op.Client, r.Offset)
				}
			}
		}
	}
	n := 0
	for _, op := range rs.ops {
		if op.Kind != Append || op.Outcome != Failed {
			continue
		}
		if w, ok := where[string(op.Value)]; ok {
			n++
			why := ""
			if op.Err != "" {
				why = " (" + op.Err + ")"
			}
			p.add("failed-but-applied", "range %s client %d append %s failed%s but is at %s",
				rs.name, op.Client, short(op.Value), why, w)
		}
	}
	return n
}

// epochAt is the epoch that wrote offset o according to history h: the
// epoch of the last entry starting at or below o. 0 when h is empty
// (unknown) or starts above o.
func epochAt(h []EpochStart, o uint64) uint64 {
	var e uint64
	for _, s := range h {
		if s.Start > o {
			break // starts never decrease: no later entry covers o either
		}
		e = s.Epoch
	}
	return e
}

// checkAckedTruncated counts truncations that removed a committed record.
// A truncation to T of a replica whose log ended at LogEnd removes offsets
// [T, LogEnd). The replica held the committed record at o if, per its
// fence-time history, the epoch that wrote its offset o is the record's
// epoch: one leader writes one record per offset, so equal epochs at an
// offset mean equal records (log matching).
func (rs *rangeRun) checkAckedTruncated(p *problems) int {
	n := 0
	for _, t := range rs.truncations {
		removed := 0
		for _, c := range rs.claims {
			if c.epoch == 0 {
				continue // the source did not name an epoch: cannot match
			}
			if c.offset < t.To || c.offset >= t.LogEnd {
				continue // not in the removed tail [To, LogEnd)
			}
			if epochAt(t.History, c.offset) != c.epoch {
				continue // the replica's record there is another epoch's
			}
			removed++
			if removed == 1 {
				how := "truncated"
				if t.FetchLeader != "" {
					how = "truncated on " + t.FetchLeader + "'s divergence answer"
				}
				p.add("acked-truncated", "range %s replica %s %s to %d at epoch %d (log end %d) removed offset %d value %s of epoch %d (%s)",
					rs.name, t.Replica, how, t.To, t.Epoch, t.LogEnd, c.offset, short(c.value), c.epoch, c.source)
			}
		}
		if removed > 0 {
			n++
		}
	}
	return n
}
