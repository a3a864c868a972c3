package lease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/lease"
)

// TestKeepAliveAtStaleEpoch: a holder renewing ranges whose epochs moved on
// is told which, with the current epochs; when all of them moved on, the
// answer is FailedPrecondition naming the current epochs, so a deposed
// leader learns it must stop.
func TestKeepAliveAtStaleEpoch(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, time.Minute)
	createRange(t, ctx, env.Client, "r1")
	createRange(t, ctx, env.Client, "r2")
	old := openSession(t, ctx, env.Client, "old-leader", 60_000)
	promoter := openSession(t, ctx, env.Client, "promoter", 60_000)
	grant(t, ctx, env.Client, "r1", 0, "old-leader", old)
	grant(t, ctx, env.Client, "r2", 0, "old-leader", old)
	held := []*tenurev1.RangeEpoch{{RangeId: "r1", Epoch: 1}, {RangeId: "r2", Epoch: 1}}
	keepAlive := func() (*connect.Response[tenurev1.KeepAliveResponse], error) {
		return env.Client.KeepAlive(ctx, connect.NewRequest(&tenurev1.KeepAliveRequest{SessionId: old, Held: held}))
	}

	resp, err := keepAlive()
	if err != nil || len(resp.Msg.GetSuperseded()) != 0 || resp.Msg.GetTtlMs() != 60_000 {
		t.Fatalf("KeepAlive(current epochs) = %v, %v; want renewed to 60000 ms, nothing superseded", resp, err)
	}

	grant(t, ctx, env.Client, "r1", 1, "promoter", promoter)
	resp, err = keepAlive()
	if err != nil {
		t.Fatalf("KeepAlive(r1 stale) = %v", err)
	}
	if sup := resp.Msg.GetSuperseded(); len(sup) != 1 || sup[0].GetRangeId() != "r1" || sup[0].GetEpoch() != 2 {
		t.Fatalf("KeepAlive(r1 stale).superseded = %v, want exactly r1 at epoch 2", sup)
	}

	grant(t, ctx, env.Client, "r2", 1, "promoter", promoter)
	_, err = keepAlive()
	wantCode(t, "KeepAlive(all stale)", err, connect.CodeFailedPrecondition)
	for _, want := range []string{`range "r1" is at epoch 2`, `range "r2" is at epoch 2`} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("KeepAlive(all stale) = %v, want it to say %s", err, want)
		}
	}
	var ce *connect.Error
	if !errors.As(err, &ce) || len(ce.Details()) != 1 {
		t.Fatalf("KeepAlive(all stale) details = %v, want one KeepAliveResponse", err)
	}
	v, derr := ce.Details()[0].Value()
	if r, ok := v.(*tenurev1.KeepAliveResponse); derr != nil || !ok || len(r.GetSuperseded()) != 2 {
		t.Fatalf("KeepAlive(all stale) detail = %v, %v; want both ranges superseded", v, derr)
	}
}

// TestOneKeepAliveForAThousandRanges: a holder leading 1,000 ranges renews
// them all with one KeepAlive, which costs etcd one lease renewal and one
// range read; after a grant on one of them, the answer names exactly that one.
func TestOneKeepAliveForAThousandRanges(t *testing.T) {
	const n = 1000
	kv := &countingKV{}
	ls := &countingLease{}
	env := newEnv(t, lease.WithStoreWrappers(
		func(inner clientv3.KV) clientv3.KV { kv.KV = inner; return kv },
		func(inner clientv3.Lease) clientv3.Lease { ls.Lease = inner; return ls },
	))
	ctx := testCtx(t, 2*time.Minute)
	leader := openSession(t, ctx, env.Client, "leader", 60_000)
	held := make([]*tenurev1.RangeEpoch, n)
	ids := make(chan int)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range 16 {
		wg.Go(func() {
			for i := range ids {
				id := fmt.Sprintf("range-%04d", i)
				if _, err := env.Client.CreateRange(ctx, connect.NewRequest(&tenurev1.CreateRangeRequest{RangeId: id, Replicas: replicas("r1", "r2", "r3")})); err != nil {
					errs <- err
					continue
				}
				g, err := env.Client.GrantEpoch(ctx, connect.NewRequest(&tenurev1.GrantEpochRequest{RangeId: id, HolderId: "leader", SessionId: leader}))
				if err != nil {
					errs <- err
					continue
				}
				held[i] = &tenurev1.RangeEpoch{RangeId: id, Epoch: g.Msg.GetEpoch()}
			}
		})
	}
	for i := range n {
		ids <- i
	}
	close(ids)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("setting up %d ranges: %v", n, err)
	}

	kv.reset()
	ls.reset()
	start := time.Now()
	resp, err := env.Client.KeepAlive(ctx, connect.NewRequest(&tenurev1.KeepAliveRequest{SessionId: leader, Held: held}))
	took := time.Since(start)
	if err != nil || len(resp.Msg.GetSuperseded()) != 0 {
		t.Fatalf("KeepAlive(%d ranges) = %v, %v; want renewed, nothing superseded", n, resp, err)
	}
	if gets, txns, kas := kv.gets.Load(), kv.txns.Load(), ls.keepAlives.Load(); gets != 1 || txns != 0 || kas != 1 {
		t.Fatalf("KeepAlive(%d ranges) cost etcd %d gets, %d txns, %d lease renewals; want 1, 0, 1", n, gets, txns, kas)
	}
	t.Logf("KeepAlive of %d ranges took %v", n, took)

	promoter := openSession(t, ctx, env.Client, "promoter", 60_000)
	grant(t, ctx, env.Client, "range-0500", 1, "promoter", promoter)
	resp, err = env.Client.KeepAlive(ctx, connect.NewRequest(&tenurev1.KeepAliveRequest{SessionId: leader, Held: held}))
	if err != nil {
		t.Fatalf("KeepAlive(%d ranges, one stale) = %v", n, err)
	}
	if sup := resp.Msg.GetSuperseded(); len(sup) != 1 || sup[0].GetRangeId() != "range-0500" || sup[0].GetEpoch() != 2 {
		t.Fatalf("KeepAlive(%d ranges, one stale).superseded = %v, want exactly range-0500 at epoch 2", n, sup)
	}
}

type countingKV struct {
	clientv3.KV
	gets, txns atomic.Int64
}

func (c *countingKV) reset() { c.gets.Store(0); c.txns.Store(0) }

func (c *countingKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	c.gets.Add(1)
	return c.KV.Get(ctx, key, opts...)
}

func (c *countingKV) Txn(ctx context.Context) clientv3.Txn {
	c.txns.Add(1)
	return c.KV.Txn(ctx)
}

type countingLease struct {
	clientv3.Lease
	keepAlives atomic.Int64
}

func (c *countingLease) reset() { c.keepAlives.Store(0) }

func (c *countingLease) KeepAliveOnce(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseKeepAliveResponse, error) {
	c.keepAlives.Add(1)
	return c.Lease.KeepAliveOnce(ctx, id)
}
