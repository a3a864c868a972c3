package replica_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// A randomised run of idempotent producers against real replicas: appends,
// retries of appends whose outcome was unknown (with the same producer
// sequence and values), crashes and restarts, fetch partitions, zombie
// leaders and promotions with truncations. The model: every (producer,
// sequence) appears at most once in the final log, and every acknowledged
// one exactly once, at the offset its first acknowledgement named (a later
// acknowledgement of a retry names the same one).
func TestRandomizedIdempotentProducers(t *testing.T) {
	if testing.Short() {
		t.Skip("randomised cluster run")
	}
	for seed := uint64(1); seed <= randomSeeds; seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) { randomProducersRun(t, seed, 2*randomSteps) })
	}
}

// modelProducer is one producer of the model: the next sequence it will
// use, and the batch it sent last whose outcome is unknown (retried, with
// the same sequence and values, before anything new).
type modelProducer struct {
	id      []byte
	next    uint64
	pending [][]byte
}

func producerValue(id []byte, seq uint64) []byte { return fmt.Appendf(nil, "p%x-s%d", id[:1], seq) }

func (c *cluster) produce(ctx context.Context, n *node, p *modelProducer, vals [][]byte) (*tenurev1.AppendResponse, error) {
	resp, err := n.lc.Append(ctx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: rangeID, Records: vals, ProducerId: p.id, FirstSequence: p.next}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

func randomProducersRun(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, 28))
	c := newCluster(t, 3)
	up := map[*node]bool{}
	for _, n := range c.nodes {
		up[n] = true
	}
	producers := []*modelProducer{{id: bytes16(1)}, {id: bytes16(2)}}
	// acked is, per acknowledged value ("p<id>-s<seq>"), its offset and
	// the epoch the acknowledgement named.
	acked := map[string]producedAt{}
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
	// send appends p's pending batch, or a new one, to n, and takes an
	// acknowledgement into the model.
	send := func(n *node, p *modelProducer, timeout time.Duration) error {
		if p.pending == nil {
			for i := range 1 + rng.IntN(3) {
				p.pending = append(p.pending, producerValue(p.id, p.next+uint64(i)))
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		a, err := c.produce(ctx, n, p, p.pending)
		cancel()
		if err != nil {
			return err // unknown: retried later with the same sequence
		}
		for i, v := range p.pending {
			off := a.GetBaseOffset() + uint64(i)
			if prev, ok := acked[string(v)]; ok && (prev.offset != off || prev.epoch != a.GetEpoch()) {
				t.Fatalf("%s acknowledged at %d (epoch %d), and again at %d (epoch %d, duplicate %v)", v, prev.offset, prev.epoch, off, a.GetEpoch(), a.GetDuplicate())
			}
			acked[string(v)] = producedAt{offset: off, epoch: a.GetEpoch()}
		}
		p.next += uint64(len(p.pending))
		p.pending = nil
		return nil
	}

	promote(c.nodes)
	for step := 0; step < steps; step++ {
		switch x := rng.Float64(); {
		case x < 0.5 && leader != nil && up[leader]:
			// A short bound, so that some appends end unknown while
			// their records are on their way.
			_ = send(leader, producers[rng.IntN(len(producers))], time.Duration(50+rng.IntN(600))*time.Millisecond)
		case x < 0.57:
			// A retry sent to a zombie (any up replica that does not
			// lead the newest epoch) is never acknowledged.
			for _, n := range upNodes() {
				if n != leader {
					if p := producers[rng.IntN(len(producers))]; p.pending != nil {
						if err := send(n, p, 200*time.Millisecond); err == nil {
							t.Fatalf("append to %s, not the leader of epoch %d, was acknowledged", n.id, epoch)
						}
					}
					break
				}
			}
		case x < 0.65:
			if n := c.nodes[rng.IntN(len(c.nodes))]; up[n] && len(upNodes()) == len(c.nodes) {
				c.stop(n)
				up[n] = false
			}
		case x < 0.75:
			for _, n := range c.nodes {
				if !up[n] {
					c.start(n)
					up[n] = true
					break
				}
			}
		case x < 0.82:
			c.flipGate(rng)
		default:
			promote(someOf(rng, upNodes()))
		}
	}

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
	// Every unknown outcome is resolved by retrying it until it is
	// acknowledged: exactly once, whatever happened to the first tries.
	for _, p := range producers {
		for try := 0; p.pending != nil; try++ {
			err := send(leader, p, 5*time.Second)
			if err != nil && try == 20 {
				t.Fatalf("retry of %s: %v", p.pending[0], err)
			}
		}
	}
	log := c.settledLog(leader)
	seen := map[string]producedAt{}
	for _, rec := range log {
		if len(rec.GetProducerId()) == 0 {
			continue
		}
		v := string(rec.GetValue())
		if want := string(producerValue(rec.GetProducerId(), rec.GetProducerSequence())); v != want {
			t.Fatalf("record %d holds %q, its producer fields say %q", rec.GetOffset(), v, want)
		}
		if prev, ok := seen[v]; ok {
			t.Fatalf("%s is in the log twice: at %d and %d", v, prev.offset, rec.GetOffset())
		}
		seen[v] = producedAt{offset: rec.GetOffset(), epoch: rec.GetEpoch()}
	}
	for v, a := range acked {
		if got, ok := seen[v]; !ok || got != a {
			t.Fatalf("acknowledged %s at %d (epoch %d); the final log has it at %d (epoch %d, present %v)", v, a.offset, a.epoch, got.offset, got.epoch, ok)
		}
	}
	total := uint64(0)
	for _, p := range producers {
		total += p.next
	}
	if uint64(len(seen)) != total {
		t.Fatalf("the final log holds %d producer records, the producers were acknowledged %d", len(seen), total)
	}
	t.Logf("seed %d: %d epochs, %d acknowledged producer records, final log %d records", seed, epoch, len(acked), len(log))
}

// producedAt is where a value sits: its offset and the epoch that wrote it.
type producedAt struct{ offset, epoch uint64 }

func bytes16(b byte) []byte {
	id := make([]byte, 16)
	id[0] = b
	return id
}

// TestIdempotentAppendAnswers: the codes a producer sees. A retry answers its
// original offsets, also from a new leader; a gap is FailedPrecondition
// naming the expected sequence; an older producer epoch is refused; a
// malformed producer id is InvalidArgument; an append without producer
// fields is written anew every time.
func TestIdempotentAppendAnswers(t *testing.T) {
	c := newCluster(t, 3)
	n1, n2, n3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, n1, n2, n3)
	ctx := ctxT(t)
	p := &modelProducer{id: bytes16(5)}
	first, err := c.produce(ctx, n1, p, values("a", 2))
	if err != nil || first.GetDuplicate() {
		t.Fatalf("first append = %v, %v", first, err)
	}
	again, err := c.produce(ctx, n1, p, values("a", 2))
	if err != nil || !again.GetDuplicate() || again.GetBaseOffset() != first.GetBaseOffset() {
		t.Fatalf("retry = %v, %v; want duplicate at %d", again, err, first.GetBaseOffset())
	}
	c.waitCaughtUp(n1, n2, n3)
	c.elect(2, n2, n1, n3)
	again, err = c.produce(ctx, n2, p, values("a", 2))
	if err != nil || !again.GetDuplicate() || again.GetBaseOffset() != first.GetBaseOffset() || again.GetEpoch() != 1 {
		t.Fatalf("retry on the new leader = %v, %v; want duplicate at %d, epoch 1 (the epoch that wrote it)", again, err, first.GetBaseOffset())
	}
	p.next = 5
	_, err = c.produce(ctx, n2, p, values("b", 1))
	wantCode(t, "append after a gap", err, connect.CodeFailedPrecondition)
	if want := "expected sequence 2"; !strings.Contains(err.Error(), want) {
		t.Fatalf("append after a gap = %v, want it to name %q", err, want)
	}
	// Epoch 1 of the producer fences epoch 0.
	if _, err := n2.lc.Append(ctx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: rangeID, Records: values("c", 1), ProducerId: p.id, ProducerEpoch: 1})); err != nil {
		t.Fatalf("append at producer epoch 1 = %v", err)
	}
	p.next = 2
	_, err = c.produce(ctx, n2, p, values("d", 1))
	wantCode(t, "append at the fenced producer epoch 0", err, connect.CodeFailedPrecondition)
	_, err = n2.lc.Append(ctx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: rangeID, Records: values("e", 1), ProducerId: []byte{1, 2, 3}}))
	wantCode(t, "append with a 3-byte producer id", err, connect.CodeInvalidArgument)
	a1 := c.mustAppend(n2, values("plain", 1)...)
	a2 := c.mustAppend(n2, values("plain", 1)...)
	if a1.GetBaseOffset() == a2.GetBaseOffset() || a2.GetDuplicate() {
		t.Fatalf("appends without a producer: %v then %v; want two records", a1, a2)
	}
}
