package promoter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// A mass failover (a dead holder loses all its leases at once, or a probe
// finds a dead leader of hundreds of ranges) runs hundreds of promotions at
// the same time, each making the same calls to the same few servers: a
// grant and a bind to the lease service, a fence to each replica, an
// adoption to each survivor. One RPC per range per step was what made it
// CPU-bound (issue #5: ~8.8 ms of CPU per range, HTTP/2 framing, marshalling,
// a dial per fence of the dead replica).
//
// A coalescer turns those concurrent single-range calls into batched RPCs,
// the way a group commit turns concurrent appends into one fsync: a call
// joins a queue for its destination and kind; at most maxInflightBatches
// (maxInflightLeaseBatches to the lease service) batches per destination
// and kind are in flight, and whatever queued up
// while they were out goes in the next one, up to wire.MaxRangesPerBatch; a
// batch that would go out beside another first waits, briefly, for the rest
// of its burst (burstQuiet). A lone call (an ordinary single failover) goes
// out at once as the single-range RPC, exactly as before. Each promotion
// still runs its own steps in its own order, decides with the pure Decide
// on its own answers, and waits only for its own range's outcome; a batch
// is only how its request travels.
//
// Tracing: each promotion's step span (fence, adopt, grant-epoch,
// bind-lease) stays in the promotion's trace and covers the wait. A batched
// RPC is a span of its own trace (it serves many promotions), linked to
// every step span it carries; each step span records the batch's size and
// trace id.
//
// A destination that answers a batch with Unimplemented (an older version)
// is sent single-range calls from then on, at most maxSingleInflight at a
// time.

// maxInflightBatches bounds the batched calls in flight per replica and
// kind. Two keeps the pipe full (one batch fills while the other is out)
// without splitting a burst into many small batches; a replica runs each
// batch's ranges concurrently, and more batches at once would only crowd
// its disk and CPU.
const maxInflightBatches = 2

// maxInflightLeaseBatches bounds the batched calls in flight to the lease
// service per kind. Its batches of grants and binds are a couple of etcd
// transactions each (nested, one per range), so they are cheap to run side
// by side, and a mass failover's 1,000 grants go out at once (8 batches)
// rather than in four rounds of two: the grant step is in every
// promotion's path.
const maxInflightLeaseBatches = 8

// A batch that would go out beside another already in flight waits for the
// burst it belongs to: until it is full, or no call has joined the queue for
// burstQuiet, or it has waited burstMaxWait. Without the wait, a mass
// failover's promotions, which start within some 30 ms of each other, went
// out as one RPC per free slot: the first seven of 334 grants alone or in
// twos, each holding a slot for a whole etcd round under load (~600 ms),
// and the rest in a second round behind them. The first call of a quiet
// coalescer still goes out at once, so a lone failover waits for nothing.
const (
	burstQuiet   = 2 * time.Millisecond
	burstMaxWait = 20 * time.Millisecond
)

// maxSingleInflight bounds the single-range calls in flight per destination
// and kind when the destination does not implement the batched call.
const maxSingleInflight = 64

// outcome is one range's answer inside a batch.
type outcome[Resp any] struct {
	resp *Resp
	err  error
}

// coalescer batches one kind of single-range call to one destination.
type coalescer[Req, Resp any] struct {
	// name names the batched RPC's span.
	name string
	// rangeID is a request's range: a batch names each range at most once.
	rangeID func(*Req) string
	// single is the single-range RPC.
	single func(context.Context, *Req) (*Resp, error)
	// batch is the batched RPC: one outcome per request, in order, or one
	// error for all of them.
	batch func(context.Context, []*Req) ([]outcome[Resp], error)
	// timeout bounds a batch whose callers set no deadline.
	timeout time.Duration
	// maxInflight bounds this coalescer's batches in flight.
	maxInflight int

	singles chan struct{} // semaphore of maxSingleInflight

	mu       sync.Mutex
	queue    []*queued[Req, Resp]
	inflight int
	// joined is when the newest call joined the queue (awaitBurstLocked).
	joined time.Time
	// unbatched is set once the destination answered Unimplemented.
	unbatched bool
}

type queued[Req, Resp any] struct {
	ctx  context.Context
	req  *Req
	done chan outcome[Resp]
}

func newCoalescer[Req, Resp any](name string, maxInflight int, timeout time.Duration, rangeID func(*Req) string,
	single func(context.Context, *Req) (*Resp, error), batch func(context.Context, []*Req) ([]outcome[Resp], error),
) *coalescer[Req, Resp] {
	return &coalescer[Req, Resp]{name: name, maxInflight: maxInflight, rangeID: rangeID, single: single, batch: batch, timeout: timeout,
		singles: make(chan struct{}, maxSingleInflight)}
}

// call sends req, in a batch with whatever else is queued, and waits for its
// own outcome or for ctx to end.
func (c *coalescer[Req, Resp]) call(ctx context.Context, req *Req) (*Resp, error) {
	q := &queued[Req, Resp]{ctx: ctx, req: req, done: make(chan outcome[Resp], 1)}
	c.mu.Lock()
	c.queue = append(c.queue, q)
	c.joined = time.Now()
	if c.inflight < c.maxInflight {
		c.inflight++
		go c.flush()
	}
	c.mu.Unlock()
	select {
	case o := <-q.done:
		return o.resp, o.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// flush sends batches until the queue is empty.
func (c *coalescer[Req, Resp]) flush() {
	for {
		c.mu.Lock()
		c.awaitBurstLocked()
		// Callers that gave up are dropped: their promotion moved on, and a
		// fence or adoption it no longer waits for is at best useless.
		//
		// A batch names each range at most once (the servers refuse a
		// batch that names one twice, as two commands for one range would
		// race in an order nobody chose): a second call for a range already
		// in this batch (a reconcile's fence beside a promotion's, a
		// refresh's rebind beside a promotion's bind) waits, in order, for
		// the next batch.
		var qs []*queued[Req, Resp]
		seen := map[string]bool{}
		rest := c.queue[:0]
		for _, q := range c.queue {
			switch id := c.rangeID(q.req); {
			case q.ctx.Err() != nil:
			case len(qs) < wire.MaxRangesPerBatch && !seen[id]:
				seen[id] = true
				qs = append(qs, q)
			default:
				rest = append(rest, q)
			}
		}
		clear(c.queue[len(rest):])
		c.queue = rest
		if len(qs) == 0 {
			c.inflight--
			c.mu.Unlock()
			return
		}
		unbatched := c.unbatched
		c.mu.Unlock()
		if len(qs) == 1 || unbatched {
			c.sendSingles(qs)
			continue
		}
		c.sendBatch(qs)
	}
}

// awaitBurstLocked returns when this flush may take its batch: at once when
// it is the only flush (nothing else in flight), otherwise once the queue
// holds a full batch, no call has joined for burstQuiet, or burstMaxWait has
// passed. c.mu is held, and released while it waits.
func (c *coalescer[Req, Resp]) awaitBurstLocked() {
	deadline := time.Now().Add(burstMaxWait)
	for c.inflight > 1 && len(c.queue) < wire.MaxRangesPerBatch {
		now := time.Now()
		until := c.joined.Add(burstQuiet)
		if deadline.Before(until) {
			until = deadline
		}
		if !now.Before(until) {
			return
		}
		c.mu.Unlock()
		time.Sleep(until.Sub(now))
		c.mu.Lock()
	}
}

// sendSingles sends each call as the single-range RPC, bounded by singles.
func (c *coalescer[Req, Resp]) sendSingles(qs []*queued[Req, Resp]) {
	var wg sync.WaitGroup
	for _, q := range qs {
		c.singles <- struct{}{}
		wg.Go(func() {
			defer func() { <-c.singles }()
			resp, err := c.single(q.ctx, q.req)
			q.done <- outcome[Resp]{resp, err}
		})
	}
	wg.Wait()
}

// sendBatch sends qs as one batched RPC and hands each caller its outcome.
func (c *coalescer[Req, Resp]) sendBatch(qs []*queued[Req, Resp]) {
	// The batch runs until its most patient caller's deadline: each caller
	// still stops waiting at its own.
	deadline := time.Now().Add(c.timeout)
	links := make([]trace.Link, 0, len(qs))
	for i, q := range qs {
		if d, ok := q.ctx.Deadline(); ok && (i == 0 || d.After(deadline)) {
			deadline = d
		}
		if sc := trace.SpanContextFromContext(q.ctx); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	ctx, span := tracer.Start(ctx, c.name, trace.WithNewRoot(), trace.WithLinks(links...),
		trace.WithAttributes(attribute.Int("tenure.batch_size", len(qs))))
	defer span.End()
	batchTrace := span.SpanContext().TraceID().String()
	for _, q := range qs {
		trace.SpanFromContext(q.ctx).SetAttributes(attribute.Int("tenure.batch_size", len(qs)), attribute.String("tenure.batch_trace_id", batchTrace))
	}

	reqs := make([]*Req, len(qs))
	for i, q := range qs {
		reqs[i] = q.req
	}
	outs, err := c.batch(ctx, reqs)
	if connect.CodeOf(err) == connect.CodeUnimplemented {
		// An older server: single-range calls from now on, starting with
		// these.
		c.mu.Lock()
		c.unbatched = true
		c.mu.Unlock()
		span.SetAttributes(attribute.Bool("tenure.unimplemented", true))
		c.sendSingles(qs)
		return
	}
	if err == nil && len(outs) != len(qs) {
		err = fmt.Errorf("%s answered %d results for %d ranges", c.name, len(outs), len(qs))
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		for _, q := range qs {
			q.done <- outcome[Resp]{err: err}
		}
		return
	}
	for i, q := range qs {
		q.done <- outs[i]
	}
}

// batchError is one range's failure in a batch answer, as the single-range
// call would have returned it.
func batchError(code uint32, message string) error {
	c := connect.Code(code)
	if c == 0 {
		// A failure without a code is not one the protocol defines.
		c = connect.CodeUnknown
	}
	return connect.NewError(c, errors.New(message))
}

// checkOrder is the outcome for a result naming another range than its
// request: the peer's answer is a claim, and one out of order would hand a
// range another range's fence.
func checkOrder(got, want string) error {
	if got != want {
		return connect.NewError(connect.CodeInternal, fmt.Errorf("batched answer names range %q where %q was asked", got, want))
	}
	return nil
}

// replicaBatchers are the coalescers of one replica address.
type replicaBatchers struct {
	fence *coalescer[tenurev1.FenceRequest, tenurev1.FenceResponse]
	adopt *coalescer[tenurev1.AdoptRequest, tenurev1.AdoptResponse]
}

// leaseBatchers are the coalescers of the lease service.
type leaseBatchers struct {
	get   *coalescer[tenurev1.GetRangeRequest, tenurev1.GetRangeResponse]
	grant *coalescer[tenurev1.GrantEpochRequest, tenurev1.GrantEpochResponse]
	bind  *coalescer[tenurev1.BindLeaseRequest, tenurev1.BindLeaseResponse]
}

func (p *Promoter) newLeaseBatchers() *leaseBatchers {
	lc := p.lease
	return &leaseBatchers{
		get: newCoalescer("get-ranges", maxInflightLeaseBatches, p.cfg.RPCTimeout, (*tenurev1.GetRangeRequest).GetRangeId,
			func(ctx context.Context, r *tenurev1.GetRangeRequest) (*tenurev1.GetRangeResponse, error) {
				resp, err := lc.GetRange(ctx, connect.NewRequest(r))
				if err != nil {
					return nil, err
				}
				return resp.Msg, nil
			},
			func(ctx context.Context, rs []*tenurev1.GetRangeRequest) ([]outcome[tenurev1.GetRangeResponse], error) {
				ids := make([]string, len(rs))
				for i, r := range rs {
					ids[i] = r.GetRangeId()
				}
				resp, err := lc.GetRanges(ctx, connect.NewRequest(&tenurev1.GetRangesRequest{RangeIds: ids}))
				if err != nil {
					return nil, err
				}
				return outcomes(resp.Msg.GetResults(), rs, (*tenurev1.GetRangeRequest).GetRangeId,
					func(r *tenurev1.GetRangeResult) (string, *tenurev1.GetRangeResponse, error) {
						if e := r.GetError(); e != nil {
							return r.GetRangeId(), nil, batchError(e.GetCode(), e.GetMessage())
						}
						if r.GetRange() == nil {
							return r.GetRangeId(), nil, nil
						}
						return r.GetRangeId(), &tenurev1.GetRangeResponse{Range: r.GetRange()}, nil
					}), nil
			}),
		grant: newCoalescer("grant-epochs", maxInflightLeaseBatches, p.cfg.RPCTimeout, (*tenurev1.GrantEpochRequest).GetRangeId,
			func(ctx context.Context, r *tenurev1.GrantEpochRequest) (*tenurev1.GrantEpochResponse, error) {
				resp, err := lc.GrantEpoch(ctx, connect.NewRequest(r))
				if err != nil {
					return nil, err
				}
				return resp.Msg, nil
			},
			func(ctx context.Context, rs []*tenurev1.GrantEpochRequest) ([]outcome[tenurev1.GrantEpochResponse], error) {
				resp, err := lc.GrantEpochs(ctx, connect.NewRequest(&tenurev1.GrantEpochsRequest{Grants: rs}))
				if err != nil {
					return nil, err
				}
				return outcomes(resp.Msg.GetResults(), rs, (*tenurev1.GrantEpochRequest).GetRangeId,
					func(r *tenurev1.GrantEpochResult) (string, *tenurev1.GrantEpochResponse, error) {
						if e := r.GetError(); e != nil {
							return r.GetRangeId(), nil, batchError(e.GetCode(), e.GetMessage())
						}
						return r.GetRangeId(), r.GetGrant(), nil
					}), nil
			}),
		bind: newCoalescer("bind-leases", maxInflightLeaseBatches, p.cfg.RPCTimeout, (*tenurev1.BindLeaseRequest).GetRangeId,
			func(ctx context.Context, r *tenurev1.BindLeaseRequest) (*tenurev1.BindLeaseResponse, error) {
				resp, err := lc.BindLease(ctx, connect.NewRequest(r))
				if err != nil {
					return nil, err
				}
				return resp.Msg, nil
			},
			func(ctx context.Context, rs []*tenurev1.BindLeaseRequest) ([]outcome[tenurev1.BindLeaseResponse], error) {
				resp, err := lc.BindLeases(ctx, connect.NewRequest(&tenurev1.BindLeasesRequest{Binds: rs}))
				if err != nil {
					return nil, err
				}
				return outcomes(resp.Msg.GetResults(), rs, (*tenurev1.BindLeaseRequest).GetRangeId,
					func(r *tenurev1.BindLeaseResult) (string, *tenurev1.BindLeaseResponse, error) {
						if e := r.GetError(); e != nil {
							return r.GetRangeId(), nil, batchError(e.GetCode(), e.GetMessage())
						}
						return r.GetRangeId(), r.GetBind(), nil
					}), nil
			}),
	}
}

// batchers returns the coalescers of replica r, at its address, each call
// naming r (transport.ForReplica).
func (p *Promoter) batchers(r *tenurev1.Replica) *replicaBatchers {
	c := p.replicaFor(r)
	key := replicaKey(r)
	p.clientsMu.Lock()
	defer p.clientsMu.Unlock()
	if b, ok := p.replicaBatch[key]; ok {
		return b
	}
	b := &replicaBatchers{
		fence: newCoalescer("fence-ranges", maxInflightBatches, p.cfg.FenceTimeout, (*tenurev1.FenceRequest).GetRangeId,
			func(ctx context.Context, r *tenurev1.FenceRequest) (*tenurev1.FenceResponse, error) {
				resp, err := c.Fence(ctx, connect.NewRequest(r))
				if err != nil {
					return nil, err
				}
				return resp.Msg, nil
			},
			func(ctx context.Context, rs []*tenurev1.FenceRequest) ([]outcome[tenurev1.FenceResponse], error) {
				resp, err := c.FenceRanges(ctx, connect.NewRequest(&tenurev1.FenceRangesRequest{Fences: rs}))
				if err != nil {
					return nil, err
				}
				return outcomes(resp.Msg.GetResults(), rs, (*tenurev1.FenceRequest).GetRangeId,
					func(r *tenurev1.FenceRangeResult) (string, *tenurev1.FenceResponse, error) {
						if e := r.GetError(); e != nil {
							return r.GetRangeId(), nil, batchError(e.GetCode(), e.GetMessage())
						}
						return r.GetRangeId(), r.GetFence(), nil
					}), nil
			}),
		adopt: newCoalescer("adopt-ranges", maxInflightBatches, p.cfg.RPCTimeout, (*tenurev1.AdoptRequest).GetRangeId,
			func(ctx context.Context, r *tenurev1.AdoptRequest) (*tenurev1.AdoptResponse, error) {
				resp, err := c.Adopt(ctx, connect.NewRequest(r))
				if err != nil {
					return nil, err
				}
				return resp.Msg, nil
			},
			func(ctx context.Context, rs []*tenurev1.AdoptRequest) ([]outcome[tenurev1.AdoptResponse], error) {
				resp, err := c.AdoptRanges(ctx, connect.NewRequest(&tenurev1.AdoptRangesRequest{Adopts: rs}))
				if err != nil {
					return nil, err
				}
				return outcomes(resp.Msg.GetResults(), rs, (*tenurev1.AdoptRequest).GetRangeId,
					func(r *tenurev1.AdoptRangeResult) (string, *tenurev1.AdoptResponse, error) {
						if e := r.GetError(); e != nil {
							return r.GetRangeId(), nil, batchError(e.GetCode(), e.GetMessage())
						}
						return r.GetRangeId(), r.GetAdopt(), nil
					}), nil
			}),
	}
	p.replicaBatch[key] = b
	return b
}

// outcomes turns a batch answer into one outcome per request. A result that
// names another range than its request, or answers neither a value nor an
// error, fails that range; a short answer fails the missing ones (the
// coalescer refuses a wrong count before it gets here).
func outcomes[Req, Result, Resp any](results []*Result, reqs []*Req, rangeID func(*Req) string,
	unpack func(*Result) (string, *Resp, error),
) []outcome[Resp] {
	out := make([]outcome[Resp], len(results))
	for i, r := range results {
		if i >= len(reqs) {
			break
		}
		id, resp, err := unpack(r)
		if oerr := checkOrder(id, rangeID(reqs[i])); oerr != nil {
			out[i] = outcome[Resp]{err: oerr}
			continue
		}
		if err == nil && resp == nil {
			err = connect.NewError(connect.CodeInternal, fmt.Errorf("batched answer for range %q carries neither a result nor an error", id))
		}
		out[i] = outcome[Resp]{resp: resp, err: err}
	}
	return out
}
