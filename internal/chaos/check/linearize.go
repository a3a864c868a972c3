package check

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// The porcupine model of one range's append-only log.
//
// The log holds records at offsets. Epoch-start records occupy offsets but
// carry no client data and no client op writes them, so the model keeps
// only client records, and offsets of consecutive client records need not
// be consecutive: only strictly increasing.
//
// Which appends took effect is settled before the search, from what the
// run observed:
//   - OK append: took effect, at its acknowledged offset.
//   - Failed append: certainly took no effect; dropped. (If its value shows
//     up anyway, FailedButApplied counts it, and any read returning it is
//     illegal: no append in the model wrote it.)
//   - Unknown append: its own answer names no offset. Values are unique, so
//     if its value is in a replica's committed prefix or an OK read, it took
//     effect at that offset: it is kept, with a Return at the end of time,
//     so it may linearize anywhere after its Call. If its value appears
//     nowhere, it did not take effect as far as any client or the final
//     committed log can tell: dropped.
//
// Every kept append therefore must be linearized, each at a fixed offset,
// and offsets must increase along the linearization. So in any complete
// linearization the records applied at any point are exactly the k kept
// appends of lowest offset, and the state is just k. An append at sorted
// position i is legal iff k == i (and its offset is above its
// predecessor's; two kept appends at one offset cannot both linearize).
//
// An OK read from f answering high-water mark h and records R sees the
// committed log at its linearization point:
//   - every committed record is below h, and every record below h is
//     committed: so k == the number of kept appends with offset < h. (The
//     second half is what catches a read whose HWM stepped back.)
//   - every client record in R is a kept append at the same offset;
//   - every kept append with offset in [f, h) is in R (if the read was
//     Limited, only up to the last offset it returned).
// The last two do not depend on k once k is fixed, so they are decided
// before the search; a read failing them can never linearize.
// A read answered OutOfRange below the log start L (Op.BelowLogStart)
// returns nothing, but says that every record below L was committed when
// the replica answered (retention removes only records below the HWM, and
// a replica's HWM is never ahead of the range's): k >= the number of kept
// appends with offset < L. It says nothing of records at or above L. An
// OK read's answered log start says no more than its HWM does.
// Failed and Unknown reads tell nothing and are left out.

// rangeLin is one range's linearizability problem.
type rangeLin struct {
	name string
	// impossible says why some op can never linearize whatever the
	// order ("" if none): then the range is illegal without a search.
	impossible string
	offsets    []uint64 // offsets of the kept appends, ascending
	ops        []porcupine.Operation
	why        []string // per porcupine op: how to name it in a problem
}

type linInput struct {
	r *rangeLin
	// append: pos is the append's position among the kept appends.
	// read: want is the k the read requires; valid is whether its
	// returned records are consistent with the kept appends at that k.
	// belowStart: the read was answered below the log start, and want is
	// the least k it requires.
	isAppend   bool
	belowStart bool
	pos        int
	want       int
	valid      bool
}

func linStep(state, input, _ any) (bool, any) {
	k := state.(int)
	in := input.(linInput)
	if in.isAppend {
		// Offsets strictly increase along the log: only the next kept
		// append in offset order may go next, and a second append at the
		// same offset never can.
		if k != in.pos || (k > 0 && in.r.offsets[k-1] >= in.r.offsets[k]) {
			return false, nil
		}
		return true, k + 1
	}
	if in.belowStart {
		return in.valid && k >= in.want, k
	}
	return in.valid && k == in.want, k
}

var logModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		var parts [][]porcupine.Operation
		index := map[*rangeLin]int{}
		for _, op := range history {
			r := op.Input.(linInput).r
			i, ok := index[r]
			if !ok {
				i = len(parts)
				index[r] = i
				parts = append(parts, nil)
			}
			parts[i] = append(parts[i], op)
		}
		return parts
	},
	Init: func() any { return 0 },
	Step: linStep,
	DescribeOperation: func(input, _ any) string {
		in := input.(linInput)
		if in.isAppend {
			return fmt.Sprintf("append @%d", in.r.offsets[in.pos])
		}
		if in.belowStart {
			return fmt.Sprintf("read below the log start sees at least %d records", in.want)
		}
		return fmt.Sprintf("read sees %d records", in.want)
	},
}

// buildLin turns one range's ops into porcupine operations; p receives the
// reads that can never linearize, with the reason.
func buildLin(rs *rangeRun, base time.Time, p *problems) *rangeLin {
	r := &rangeLin{name: rs.name}

	// Where each value sits, as far as committed data tells: replicas'
	// committed prefixes first, then OK reads. Only an Unknown append is
	// placed from here; an OK append keeps its acknowledged offset.
	known := map[string]uint64{}
	for i := range rs.finals {
		f := &rs.finals[i]
		for _, rec := range f.Records {
			if _, ok := known[string(rec.Value)]; !ok && !rec.EpochStart && f.committed(rec.Offset) {
				known[string(rec.Value)] = rec.Offset
			}
		}
	}
	for _, op := range rs.ops {
		if op.Kind == Read && op.Outcome == OK {
			for _, rec := range op.Records {
				if _, ok := known[string(rec.Value)]; !ok && !rec.EpochStart {
					known[string(rec.Value)] = rec.Offset
				}
			}
		}
	}

	type kept struct {
		op     int // index in rs.ops
		offset uint64
	}
	var appends []kept
	for i, op := range rs.ops {
		if op.Kind != Append {
			continue
		}
		switch op.Outcome {
		case OK:
			appends = append(appends, kept{i, op.Offset})
		case Unknown:
			if o, ok := known[string(op.Value)]; ok {
				appends = append(appends, kept{i, o})
			}
		}
	}
	sort.SliceStable(appends, func(i, j int) bool { return appends[i].offset < appends[j].offset })
	pos := make(map[string]int, len(appends))
	for i, a := range appends {
		r.offsets = append(r.offsets, a.offset)
		pos[string(rs.ops[a.op].Value)] = i
		// One offset holds one record: a second kept append there can
		// never take its turn.
		if i > 0 && a.offset == appends[i-1].offset && r.impossible == "" {
			r.impossible = fmt.Sprintf("appends %s and %s both took effect at offset %d",
				short(rs.ops[appends[i-1].op].Value), short(rs.ops[a.op].Value), a.offset)
		}
	}
	// below(o) is how many kept appends sit below offset o.
	below := func(o uint64) int {
		return sort.Search(len(r.offsets), func(i int) bool { return r.offsets[i] >= o })
	}

	ts := func(t time.Time) int64 { return int64(t.Sub(base)) }
	add := func(op Op, in linInput, ret int64, why string) {
		call := ts(op.Call)
		ret = max(ret, call) // a clock step must not make Return precede Call
		r.ops = append(r.ops, porcupine.Operation{ClientId: op.Client, Input: in, Call: call, Return: ret})
		r.why = append(r.why, why)
	}
	for i, a := range appends {
		op := rs.ops[a.op]
		ret := int64(math.MaxInt64) // Unknown: may take effect any time after Call
		if op.Outcome == OK {
			ret = ts(op.Return)
		}
		add(op, linInput{r: r, isAppend: true, pos: i}, ret,
			fmt.Sprintf("%s append %s by client %d at offset %d", op.Outcome, short(op.Value), op.Client, a.offset))
	}
	for _, op := range rs.ops {
		if op.Kind != Read || op.Outcome != OK {
			continue
		}
		if op.BelowLogStart {
			in := linInput{r: r, belowStart: true, want: below(op.LogStart), valid: true}
			why := fmt.Sprintf("read by client %d from %d answered below the log start %d", op.Client, op.Offset, op.LogStart)
			// The replica refuses only offsets below its log start: one
			// at or above it was readable, or the answer names no start.
			if op.LogStart <= op.Offset {
				in.valid = false
				reason := fmt.Sprintf("offset %d is not below the log start %d", op.Offset, op.LogStart)
				p.add("illegal-read", "range %s %s: %s", rs.name, why, reason)
				if r.impossible == "" {
					r.impossible = why + ": " + reason
				}
			}
			add(op, in, ts(op.Return), why)
			continue
		}
		in := linInput{r: r, want: below(op.HWM), valid: true}
		why := fmt.Sprintf("read by client %d from %d answering hwm %d with %d records", op.Client, op.Offset, op.HWM, len(op.Records))
		if reason := readInvalid(op, r.offsets, pos, in.want, below); reason != "" {
			in.valid = false
			p.add("illegal-read", "range %s %s: %s", rs.name, why, reason)
			if r.impossible == "" {
				r.impossible = why + ": " + reason
			}
		}
		add(op, in, ts(op.Return), why)
	}
	return r
}

// readInvalid says why an OK read's records cannot be the committed log
// holding the first want kept appends, or "" if they can.
func readInvalid(op Op, offsets []uint64, pos map[string]int, want int, below func(uint64) int) string {
	upper := op.HWM // a full read returns everything committed from op.Offset
	if op.Limited {
		// A limited read stopped early: it vouches only for offsets up to
		// the last one it returned.
		upper = op.Offset
		if n := len(op.Records); n > 0 {
			upper = op.Records[n-1].Offset + 1
		}
	}
	// Retention removes only committed records, and a read is served
	// from at or above the log start it answers (below it, it is refused).
	if op.LogStart > op.HWM {
		return fmt.Sprintf("answered log start %d, above its own hwm %d", op.LogStart, op.HWM)
	}
	if op.LogStart > op.Offset {
		return fmt.Sprintf("served offset %d, below the log start %d it answered", op.Offset, op.LogStart)
	}
	lo, hi := below(op.Offset), min(below(upper), want)
	returned := map[int]bool{}
	for j, rec := range op.Records {
		// A read returns the committed log from its offset in order:
		// offsets strictly increase (the Limited bound above relies on
		// it), and none is at or past the HWM, which is exclusive.
		if j > 0 && rec.Offset <= op.Records[j-1].Offset {
			return fmt.Sprintf("returned offset %d after offset %d", rec.Offset, op.Records[j-1].Offset)
		}
		if rec.Offset >= op.HWM {
			return fmt.Sprintf("returned offset %d, at or past its own hwm %d", rec.Offset, op.HWM)
		}
		if rec.EpochStart {
			continue
		}
		i, ok := pos[string(rec.Value)]
		if !ok {
			return fmt.Sprintf("returned %s at offset %d, which no OK or resolved append wrote", short(rec.Value), rec.Offset)
		}
		if offsets[i] != rec.Offset {
			return fmt.Sprintf("returned %s at offset %d, but it was appended at %d", short(rec.Value), rec.Offset, offsets[i])
		}
		// Its offset is below the HWM (checked above), so i < want, by
		// the definition of want; kept as a guard on that reasoning.
		if i >= want {
			return fmt.Sprintf("returned %s at offset %d, beyond the %d records below its hwm %d", short(rec.Value), rec.Offset, want, op.HWM)
		}
		if i >= lo && i < hi {
			returned[i] = true
		}
	}
	for i := lo; i < hi; i++ {
		if !returned[i] {
			return fmt.Sprintf("left out the record at offset %d, committed below its hwm", offsets[i])
		}
	}
	return ""
}

// checkLinearizable runs porcupine over every range at once (partitioned
// by range), bounded by timeout. On an illegal verdict it checks the ranges
// one by one to name them and describe where the search got stuck.
func checkLinearizable(ranges map[string]*rangeRun, timeout time.Duration, p *problems) (Verdict, []string) {
	var base time.Time
	for _, rs := range ranges {
		for _, op := range rs.ops {
			if base.IsZero() || op.Call.Before(base) {
				base = op.Call
			}
		}
	}
	// A range where some op can never linearize, whatever the order, is
	// illegal without a search; the others are searched together.
	var illegal []string
	var searched []*rangeLin
	var all []porcupine.Operation
	for _, name := range sortedKeys(ranges) {
		r := buildLin(ranges[name], base, p)
		switch {
		case r.impossible != "":
			illegal = append(illegal, r.name)
			p.add("linearizability", "range %s: %s", r.name, r.impossible)
		case len(r.ops) > 0:
			searched = append(searched, r)
			all = append(all, r.ops...)
		}
	}
	if timeout < 0 {
		timeout = 0 // porcupine: 0 is no bound
	}
	deadline := time.Now().Add(timeout)
	switch porcupine.CheckOperationsTimeout(logModel, all, timeout) {
	case porcupine.Ok:
		if len(illegal) > 0 {
			return VerdictIllegal, illegal
		}
		return VerdictOK, nil
	case porcupine.Unknown:
		if len(illegal) > 0 {
			// Known illegal outweighs not knowing about the rest.
			return VerdictIllegal, illegal
		}
		p.add("linearizability", "search timed out after %s", timeout)
		return VerdictUnknown, nil
	}
	// Illegal: search the ranges one by one to name them and say where
	// each got stuck, within what is left of the bound.
	named := false
	for _, r := range searched {
		left := time.Until(deadline)
		if timeout > 0 && left <= 0 {
			p.add("linearizability", "range %s not re-checked: out of time", r.name)
			continue
		}
		if timeout == 0 {
			left = 0
		}
		res, info := porcupine.CheckOperationsVerbose(logModel, r.ops, left)
		if res != porcupine.Illegal {
			continue
		}
		named = true
		illegal = append(illegal, r.name)
		p.add("linearizability", "range %s: %s", r.name, stuckAt(r, info))
	}
	if !named {
		// The combined search found a range illegal, but re-checking ran
		// out of time before naming it.
		illegal = append(illegal, "?")
	}
	sort.Strings(illegal)
	return VerdictIllegal, illegal
}

// stuckAt describes the longest linearizable prefix porcupine found and the
// first op, by call time, it could not place after it.
func stuckAt(r *rangeLin, info porcupine.LinearizationInfo) string {
	var longest []int
	for _, part := range info.PartialLinearizations() {
		for _, l := range part {
			if len(l) > len(longest) {
				longest = l
			}
		}
	}
	in := make([]bool, len(r.ops))
	for _, i := range longest {
		in[i] = true
	}
	first := -1
	for i, op := range r.ops {
		if !in[i] && (first < 0 || op.Call < r.ops[first].Call) {
			first = i
		}
	}
	if first < 0 {
		return fmt.Sprintf("no linearization of %d ops", len(r.ops))
	}
	return fmt.Sprintf("no linearization of %d ops; the longest places %d, and the first op by call outside it is %s",
		len(r.ops), len(longest), r.why[first])
}
