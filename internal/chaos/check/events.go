package check

import (
	"sort"
	"time"
)

// checkHWMRegressions counts samples lower than an earlier sample of the
// same replica, range and incarnation. The HWM is persisted and monotonic
// (DESIGN: "Monotonic, persisted"); incarnations are kept apart only
// because a sample taken across a restart may race the reload.
func checkHWMRegressions(samples []HWMSample, p *problems) int {
	type key struct {
		replica, rng string
		inc          int
	}
	groups := map[key][]HWMSample{}
	var order []key
	for _, s := range samples {
		k := key{s.Replica, s.Range, s.Incarnation}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], s)
	}
	n := 0
	for _, k := range order {
		g := groups[k]
		// Stable: samples taken at the same instant keep the order the
		// harness recorded them in.
		sort.SliceStable(g, func(i, j int) bool { return g[i].At.Before(g[j].At) })
		var high uint64
		var highAt time.Time
		for i, s := range g {
			if i > 0 && s.HWM < high {
				n++
				p.add("hwm-regression", "range %s replica %s incarnation %d: hwm %d at %s after %d at %s",
					k.rng, k.replica, k.inc, s.HWM, s.At.Format(time.RFC3339Nano), high, highAt.Format(time.RFC3339Nano))
			}
			if i == 0 || s.HWM > high {
				high, highAt = s.HWM, s.At
			}
		}
	}
	return n
}

// checkStaleEpochs counts acceptances under an epoch below one the replica
// had been fenced at: an event of kind Acked, Truncated, Adopted,
// ServedFetch or Fenced at epoch e whose Call came after the Return of a
// Fenced event at E > e on the same replica and range. (A second Fence
// below E is accepting a command from a lower epoch too: the design says a
// replica already fenced higher refuses.) Only a fence that had returned
// before the call began counts: a call concurrent with the fence may have
// been decided first. Fenced at E then Adopted or Truncated at E is the
// promotion itself and is fine (e == E is not below E).
func checkStaleEpochs(events []EpochEvent, p *problems) int {
	type key struct{ replica, rng string }
	type fence struct {
		epoch uint64
		ret   time.Time
	}
	fences := map[key][]fence{}
	for _, e := range events {
		if e.Kind == Fenced {
			k := key{e.Replica, e.Range}
			fences[k] = append(fences[k], fence{e.Epoch, e.Return})
		}
	}
	// Per replica and range: fences in Return order, and the highest epoch
	// fenced up to each of them, so each event costs one binary search.
	highest := map[key][]uint64{}
	for k, fs := range fences {
		sort.SliceStable(fs, func(i, j int) bool { return fs[i].ret.Before(fs[j].ret) })
		hs := make([]uint64, len(fs))
		var h uint64
		for i, f := range fs {
			h = max(h, f.epoch)
			hs[i] = h
		}
		fences[k], highest[k] = fs, hs
	}
	n := 0
	for _, e := range events {
		switch e.Kind {
		case Acked, Truncated, Adopted, ServedFetch, Fenced:
		default:
			continue
		}
		k := key{e.Replica, e.Range}
		fs := fences[k]
		// Fences that returned strictly before the call: fs[:i].
		i := sort.Search(len(fs), func(i int) bool { return !fs[i].ret.Before(e.Call) })
		if i == 0 {
			continue
		}
		fenced := highest[k][i-1]
		// The replica had durably promised, at fenced, to accept nothing
		// below it; an acceptance at a lower epoch breaks invariant 4.
		if e.Epoch < fenced {
			n++
			p.add("stale-epoch", "range %s replica %s %s at epoch %d at %s, after it was fenced at epoch %d",
				e.Range, e.Replica, e.Kind, e.Epoch, e.Call.Format(time.RFC3339Nano), fenced)
		}
	}
	return n
}
