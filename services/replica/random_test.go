package replica_test

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// A randomised run against real replicas: appends, crashes and restarts,
// fetch partitions and promotions over random fence quorums (the driver
// plays the promoter by the design's rules), zombie leaders included. At the
// end every acknowledged record sits at its offset, byte for byte, in the
// newest leader's log and in every replica's (invariants 1 and 2); along the
// way no promotion finds a candidate short of the committed bound and no
// planned truncation goes below a replica's HWM (invariant 3).
func TestRandomizedPromotions(t *testing.T) {
	if testing.Short() {
		t.Skip("randomised cluster run")
	}
	for seed := uint64(1); seed <= randomSeeds; seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) { randomRun(t, seed, randomSteps) })
	}
}

type ackedRecord struct {
	epoch uint64
	value []byte
}

func randomRun(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, seed))
	c := newCluster(t, 3)
	up := map[*node]bool{}
	for _, n := range c.nodes {
		up[n] = true
	}
	acked := map[uint64]ackedRecord{} // offset -> record
	epoch := uint64(0)
	var leader *node

	promote := func(reach []*node) {
		epoch++
		if l := c.promoteOver(t, epoch, reach); l != nil {
			leader = l
		}
	}
	upNodes := func() []*node {
		var out []*node
		for _, n := range c.nodes {
			if up[n] {
				out = append(out, n)
			}
		}
		return out
	}

	promote(c.nodes)
	for step := 0; step < steps; step++ {
		switch p := rng.Float64(); {
		case p < 0.45 && leader != nil && up[leader]:
			n := 1 + rng.IntN(5)
			vals := make([][]byte, n)
			for i := range vals {
				vals[i] = []byte(fmt.Sprintf("s%d-e%d-%d-%d", seed, epoch, step, i))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
			a, err := c.append(ctx, leader, vals...)
			cancel()
			if err == nil {
				for i, v := range vals {
					off := a.GetBaseOffset() + uint64(i)
					if prev, ok := acked[off]; ok {
						t.Fatalf("offset %d acknowledged twice: %q (epoch %d) and %q (epoch %d)", off, prev.value, prev.epoch, v, a.GetEpoch())
					}
					acked[off] = ackedRecord{epoch: a.GetEpoch(), value: v}
				}
			}
		case p < 0.55:
			// A zombie's append: any up replica that is not the newest leader.
			for _, n := range upNodes() {
				if n != leader {
					ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
					if _, err := c.append(ctx, n, []byte("zombie")); err == nil {
						t.Fatalf("append to %s, not the leader of epoch %d, was acknowledged", n.id, epoch)
					}
					cancel()
					break
				}
			}
		case p < 0.65:
			if n := c.nodes[rng.IntN(len(c.nodes))]; up[n] && len(upNodes()) == len(c.nodes) {
				c.stop(n)
				up[n] = false
			}
		case p < 0.75:
			for _, n := range c.nodes {
				if !up[n] {
					c.start(n)
					up[n] = true
					break
				}
			}
		case p < 0.82:
			c.flipGate(rng)
		default:
			promote(someOf(rng, upNodes()))
		}
	}

	// Heal everything and promote once over all replicas.
	for _, n := range c.nodes {
		n.gate.open()
		if !up[n] {
			c.start(n)
			up[n] = true
		}
	}
	before := epoch
	promote(c.nodes)
	if leader == nil || epoch == before {
		t.Fatal("the final promotion over all replicas did not happen")
	}
	log := c.settledLog(leader)
	checkInLog(t, log, acked, "acknowledged")
	t.Logf("seed %d: %d epochs, %d acknowledged records, final log %d records", seed, epoch, len(acked), len(log))
}

// promoteOver plays the promoter at epoch over reach, by the design's
// rules: fence each, and with a quorum fenced pick the candidate (the
// highest last epoch, then the longest log), truncate every other fenced
// replica to where it diverges from the candidate, and adopt. It fails the
// test if the candidate is short of the committed bound or a truncation
// would go below a replica's HWM (invariant 3), and returns the new leader,
// or nil when fewer than a quorum answered the fence.
func (c *cluster) promoteOver(t *testing.T, epoch uint64, reach []*node) *node {
	t.Helper()
	var fenced []*node
	answers := map[*node]*tenurev1.FenceResponse{}
	for _, n := range reach {
		if a, err := c.fence(n, epoch); err == nil {
			fenced = append(fenced, n)
			answers[n] = a
		}
	}
	if len(fenced) < wire.Quorum(len(c.nodes)) {
		t.Logf("step: promotion at %d reached %d replicas; abandoned", epoch, len(fenced))
		return nil
	}
	var cand *node
	var bound uint64
	lastEpoch := func(a *tenurev1.FenceResponse) uint64 {
		if h := a.GetHistory(); len(h) > 0 {
			return h[len(h)-1].GetEpoch()
		}
		return 0
	}
	for _, n := range fenced {
		a := answers[n]
		bound = max(bound, a.GetHighWaterMark())
		if cand == nil || lastEpoch(a) > lastEpoch(answers[cand]) ||
			lastEpoch(a) == lastEpoch(answers[cand]) && a.GetLogEnd() > answers[cand].GetLogEnd() {
			cand = n
		}
	}
	ca := answers[cand]
	if ca.GetLogEnd() < bound {
		t.Fatalf("epoch %d: candidate %s log end %d below the committed bound %d", epoch, cand.id, ca.GetLogEnd(), bound)
	}
	for _, n := range fenced {
		if n == cand {
			continue
		}
		a := answers[n]
		d, ok := journal.DivergencePoint(fromWire(ca.GetHistory()), fromWire(a.GetHistory()))
		if !ok {
			d = 0
			if len(ca.GetHistory()) == 0 && len(a.GetHistory()) == 0 {
				d = math.MaxUint64
			}
		}
		target := min(a.GetLogEnd(), d, ca.GetLogEnd())
		if target < a.GetLogEnd() {
			if target < a.GetHighWaterMark() {
				t.Fatalf("epoch %d: truncation of %s to %d below its HWM %d", epoch, n.id, target, a.GetHighWaterMark())
			}
			if _, err := n.rc.Truncate(ctxT(t), connect.NewRequest(&tenurev1.TruncateRequest{RangeId: rangeID, Epoch: epoch, TargetOffset: target})); err != nil {
				t.Fatalf("epoch %d: Truncate(%s, %d) = %v", epoch, n.id, target, err)
			}
		}
	}
	c.mustAdopt(cand, epoch, tenurev1.Role_ROLE_LEADER, cand, bound)
	for _, n := range fenced {
		if n != cand {
			c.mustAdopt(n, epoch, tenurev1.Role_ROLE_FOLLOWER, cand, 0)
		}
	}
	t.Logf("step: epoch %d leader %s over %d replicas, bound %d", epoch, cand.id, len(fenced), bound)
	return cand
}

// flipGate blocks or opens, at random, the fetch gate of a random replica.
func (c *cluster) flipGate(rng *rand.Rand) {
	n := c.nodes[rng.IntN(len(c.nodes))]
	if rng.IntN(2) == 0 {
		n.gate.block()
	} else {
		n.gate.open()
	}
}

// someOf returns each of nodes with probability 3/4: the replicas a
// promoter reaches.
func someOf(rng *rand.Rand, nodes []*node) []*node {
	var reach []*node
	for _, n := range nodes {
		if rng.IntN(4) > 0 {
			reach = append(reach, n)
		}
	}
	return reach
}

// settledLog appends once through final, waits for every other replica to
// catch up, and returns final's log once every replica holds the same.
func (c *cluster) settledLog(final *node) []*tenurev1.Record {
	var followers []*node
	for _, n := range c.nodes {
		if n != final {
			followers = append(followers, n)
		}
	}
	c.mustAppend(final, []byte("final"))
	c.waitCaughtUp(final, followers...)
	log := c.storeLog(final)
	c.sameLogs(log, followers...)
	return log
}

// checkInLog fails the test unless every record of recs (offset -> record)
// sits at its offset in log, byte for byte and with its epoch; what names
// how the test came by them.
func checkInLog(t *testing.T, log []*tenurev1.Record, recs map[uint64]ackedRecord, what string) {
	t.Helper()
	for off, r := range recs {
		if off >= uint64(len(log)) || !bytes.Equal(log[off].GetValue(), r.value) || log[off].GetEpoch() != r.epoch {
			t.Fatalf("%s record at %d (%q, epoch %d) is not in the final log (%d records)", what, off, r.value, r.epoch, len(log))
		}
	}
}

func fromWire(h []*tenurev1.EpochStart) []journal.EpochStart {
	out := make([]journal.EpochStart, len(h))
	for i, e := range h {
		out[i] = journal.EpochStart{Epoch: e.GetEpoch(), Start: e.GetStartOffset()}
	}
	return out
}

// randomSeeds and randomSteps bound the randomised run: a few seconds under
// the race detector. Raise them locally to search harder.
var randomSeeds, randomSteps = uint64(envInt("TENURE_RANDOM_SEEDS", 3)), envInt("TENURE_RANDOM_STEPS", 50)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
