package replica_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// crash stops a node as a power loss would: its server goes first (peers
// see connections drop), then its store keeps only what an fsync covered.
func (c *cluster) crash(n *node) {
	if n.srv != nil {
		_ = n.srv.Close()
		n.srv = nil
		n.hc.CloseIdleConnections()
	}
	if n.r != nil {
		if err := n.r.Crash(); err != nil {
			c.t.Logf("crash %s: %v", n.id, err)
		}
		n.r = nil
	}
}

// TestRandomizedPowerLossWithConcurrentClients is randomRun with power
// losses instead of clean stops, and with appends and reads running
// concurrently with the promotions: fences land while appends wait for their
// commit and while fetch answers are applied. At the end every acknowledged
// record, and every record a Read returned, sits at its offset in the final
// log (invariants 1, 2 and the read rule).
func TestRandomizedPowerLossWithConcurrentClients(t *testing.T) {
	seeds := uint64(envInt("TENURE_POWERLOSS_SEEDS", 3))
	steps := envInt("TENURE_POWERLOSS_STEPS", 40)
	for seed := uint64(1); seed <= seeds; seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) { crashRun(t, seed, steps) })
	}
}

// powerLossReplicas is the replica set's size (TENURE_POWERLOSS_REPLICAS):
// 3 by default; 5 lets two replicas be down and stale quorums overlap less.
var powerLossReplicas = envInt("TENURE_POWERLOSS_REPLICAS", 3)

// maxClientCalls bounds each client goroutine of crashRun in count, as
// the run's steps bound it in time: far more calls than a run makes.
const maxClientCalls = 100000

func crashRun(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, seed+1000))
	c := newCluster(t, powerLossReplicas)
	up := map[*node]bool{}
	for _, n := range c.nodes {
		up[n] = true
	}

	// mu guards the leader and the nodes' clients, which restarts replace.
	var mu sync.Mutex
	var leader *node
	var leaderLC tenurev1connect.LogServiceClient
	acked := map[uint64]ackedRecord{}
	seen := map[uint64]ackedRecord{} // offset -> record a Read returned
	var failure string               // the first violation a client goroutine saw
	epoch := uint64(0)

	promote := func(reach []*node) {
		epoch++
		if cand := c.promoteOver(t, epoch, reach); cand != nil {
			mu.Lock()
			leader, leaderLC = cand, cand.lc
			mu.Unlock()
		}
	}

	current := func() (tenurev1connect.LogServiceClient, bool) {
		mu.Lock()
		defer mu.Unlock()
		return leaderLC, leader != nil && up[leader]
	}

	promote(c.nodes)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 3; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < maxClientCalls; i++ {
				select {
				case <-stop:
					return
				default:
				}
				lc, ok := current()
				if !ok {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				n := 1 + i%3
				vals := make([][]byte, n)
				for j := range vals {
					vals[j] = []byte(fmt.Sprintf("s%d-w%d-%d-%d", seed, w, i, j))
				}
				ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
				resp, err := lc.Append(ctx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: rangeID, Records: vals}))
				cancel()
				if err != nil {
					time.Sleep(2 * time.Millisecond)
					continue
				}
				a := resp.Msg
				mu.Lock()
				for j, v := range vals {
					off := a.GetBaseOffset() + uint64(j)
					if prev, ok := acked[off]; ok && failure == "" {
						failure = fmt.Sprintf("offset %d acknowledged twice: %q (epoch %d) and %q (epoch %d)", off, prev.value, prev.epoch, v, a.GetEpoch())
					}
					acked[off] = ackedRecord{epoch: a.GetEpoch(), value: v}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range maxClientCalls {
			select {
			case <-stop:
				return
			default:
			}
			lc, ok := current()
			if !ok {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			resp, err := lc.Read(ctx, connect.NewRequest(&tenurev1.ReadRequest{RangeId: rangeID, Offset: 0, MaxRecords: 4096}))
			cancel()
			if err != nil {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			mu.Lock()
			for _, r := range resp.Msg.GetRecords() {
				rec := ackedRecord{epoch: r.GetEpoch(), value: r.GetValue()}
				if prev, ok := seen[r.GetOffset()]; ok && (prev.epoch != rec.epoch || !bytes.Equal(prev.value, rec.value)) && failure == "" {
					failure = fmt.Sprintf("reads disagree at %d: %q (epoch %d), then %q (epoch %d)", r.GetOffset(), prev.value, prev.epoch, rec.value, rec.epoch)
				}
				seen[r.GetOffset()] = rec
			}
			mu.Unlock()
			time.Sleep(3 * time.Millisecond)
		}
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()

	upNodes := func() []*node {
		var out []*node
		for _, n := range c.nodes {
			if up[n] {
				out = append(out, n)
			}
		}
		return out
	}
	for step := 0; step < steps; step++ {
		time.Sleep(time.Duration(rng.IntN(60)) * time.Millisecond)
		switch p := rng.Float64(); {
		case p < 0.25:
			// Down to a bare quorum at most, so promotions stay possible.
			if n := c.nodes[rng.IntN(len(c.nodes))]; up[n] && len(upNodes()) > wire.Quorum(len(c.nodes)) {
				mu.Lock()
				up[n] = false
				mu.Unlock()
				c.crash(n)
			}
		case p < 0.45:
			for _, n := range c.nodes {
				if !up[n] {
					c.start(n)
					mu.Lock()
					up[n] = true
					if n == leader {
						leaderLC = n.lc
					}
					mu.Unlock()
					break
				}
			}
		case p < 0.55:
			c.flipGate(rng)
		default:
			promote(someOf(rng, upNodes()))
		}
	}

	for _, n := range c.nodes {
		n.gate.open()
		if !up[n] {
			c.start(n)
			mu.Lock()
			up[n] = true
			mu.Unlock()
		}
	}
	before := epoch
	promote(c.nodes)
	if leader == nil || epoch == before {
		t.Fatal("the final promotion over all replicas did not happen")
	}
	close(stop)
	wg.Wait()
	log := c.settledLog(leader)
	mu.Lock()
	defer mu.Unlock()
	if failure != "" {
		t.Fatal(failure)
	}
	checkInLog(t, log, acked, "acknowledged")
	checkInLog(t, log, seen, "read")
	t.Logf("seed %d: %d epochs, %d acknowledged, %d read, final log %d records", seed, epoch, len(acked), len(seen), len(log))
}
