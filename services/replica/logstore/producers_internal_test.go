package logstore

import (
	"errors"
	"math/rand/v2"
	"testing"
)

// TestProducerTableIsAFunctionOfTheWindow: the table kept up to date append
// by append since the log began decides every append exactly as a table
// built record by record from only the records in the window does. That is what lets a
// restarted replica, a truncated one or a promoted follower rebuild the
// dedupe state by reading the window, and agree with the leader that kept it.
func TestProducerTableIsAFunctionOfTheWindow(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 28))
		type rec struct {
			off uint64
			p   Producer
		}
		ids := []ProducerID{{1}, {2}, {3}}
		var log []rec
		next := map[ProducerID]uint64{}
		epochs := map[ProducerID]uint32{}
		full := newProducerTable()
		off := uint64(0)
		// floor is the log start: retention removes records now and then,
		// and a table built from the log reads only what it holds.
		floor := uint64(0)
		for range 3000 {
			// Offsets jump: the records between are other producers'
			// or non-idempotent ones, which the table never sees; some
			// jumps leave a producer out of the window.
			switch rng.IntN(20) {
			case 0:
				off += ProducerWindow/2 + rng.Uint64N(ProducerWindow)
			case 1, 2:
				off += rng.Uint64N(ProducerWindow / 8)
			default:
				off += 1 + rng.Uint64N(3)
			}
			id := ids[rng.IntN(len(ids))]
			if rng.IntN(40) == 0 {
				epochs[id]++
				next[id] = 0
			}
			n := 1 + rng.Uint64N(4)
			for i := range n {
				log = append(log, rec{off + i, Producer{ID: id, Epoch: epochs[id], Seq: next[id] + i}})
			}
			// The leader's path: one append's records in one step.
			full.observeRun(off, Producer{ID: id, Epoch: epochs[id], Seq: next[id]}, n)
			next[id] += n
			off += n
			end := off + rng.Uint64N(3)
			if rng.IntN(30) == 0 {
				floor = max(floor, off-rng.Uint64N(min(off, ProducerWindow/4)+1))
				full.advanceFloor(floor)
			}

			window := newProducerTable()
			for _, r := range log {
				if r.off >= max(windowStart(end), floor) {
					window.observe(r.off, r.p)
				}
			}
			window.advanceFloor(floor)
			for range 8 {
				a := ProducerAppend{ID: ids[rng.IntN(len(ids))], Epoch: uint32(rng.IntN(int(epochs[id]) + 2)), FirstSeq: rng.Uint64N(next[id] + 3)}
				cnt := 1 + rng.IntN(4)
				b1, d1, e1 := full.check(a, cnt, end)
				b2, d2, e2 := window.check(a, cnt, end)
				if b1 != b2 || d1 != d2 || !sameKind(e1, e2) {
					t.Fatalf("seed %d end %d: check(%+v, %d) = %d, %v, %v from the whole log; %d, %v, %v from the window", seed, end, a, cnt, b1, d1, e1, b2, d2, e2)
				}
			}
		}
	}
}

func sameKind(a, b error) bool {
	for _, k := range []error{ErrSequence, ErrProducerFenced, ErrProducerWindow} {
		if errors.Is(a, k) != errors.Is(b, k) {
			return false
		}
	}
	return (a == nil) == (b == nil)
}
