package chaos

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/internal/chaos/check"
	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// Observer records, at each replica's server, every epoch-bearing call the
// replica accepted (fences, acknowledged appends, truncations, adoptions,
// fetches served as leader), for the stale-epoch and truncation checkers.
// It sees the replicas from outside: nothing in the services knows it runs.
type Observer struct {
	mu     sync.Mutex
	events []check.EpochEvent
	truncs []check.Truncation
	// fences is each replica's last fence answer per range and epoch: what
	// it held when a truncation at that epoch was commanded.
	fences map[fenceKey]*tenurev1.FenceResponse
	// cuts is, per replica process (id and harness incarnation) and range,
	// how many fetch-time truncations its status reported last
	// (fetchTruncations).
	cuts map[cutKey]uint64
}

type cutKey struct {
	replica, rangeID string
	incarnation      int
}

type fenceKey struct {
	replica, rangeID string
	epoch            uint64
}

func newObserver() *Observer {
	return &Observer{fences: map[fenceKey]*tenurev1.FenceResponse{}, cuts: map[cutKey]uint64{}}
}

// current is the observer of the run in progress. The interceptor is
// installed once per process (transport.SetInterceptors is process-wide);
// runs are sequential and swap the observer.
var (
	current     atomic.Pointer[Observer]
	installOnce sync.Once
)

func (o *Observer) install() {
	installOnce.Do(func() { transport.SetInterceptors(observing{}) })
	current.Store(o)
}

func (o *Observer) uninstall() { current.CompareAndSwap(o, nil) }

// observing is the process-wide interceptor: on the server side of a
// replica (its context names the node, see Network.Handler) it hands every
// successful call to the current Observer.
type observing struct{}

func (observing) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		node := nodeFrom(ctx)
		o := current.Load()
		if req.Spec().IsClient || node == "" || o == nil {
			return next(ctx, req)
		}
		call := time.Now()
		resp, err := next(ctx, req)
		if err == nil {
			o.record(node, req.Spec().Procedure, req.Any(), resp.Any(), call, time.Now())
		}
		return resp, err
	}
}

func (observing) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (observing) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

func (o *Observer) record(node, procedure string, req, resp any, call, ret time.Time) {
	ev := check.EpochEvent{Replica: node, Call: call, Return: ret}
	o.mu.Lock()
	defer o.mu.Unlock()
	switch procedure {
	case tenurev1connect.ReplicaServiceFenceProcedure:
		q, a := req.(*tenurev1.FenceRequest), resp.(*tenurev1.FenceResponse)
		ev.Range, ev.Kind, ev.Epoch = q.GetRangeId(), check.Fenced, q.GetEpoch()
		o.fences[fenceKey{node, q.GetRangeId(), q.GetEpoch()}] = a
	case tenurev1connect.LogServiceAppendProcedure:
		q, a := req.(*tenurev1.AppendRequest), resp.(*tenurev1.AppendResponse)
		if a.GetDuplicate() {
			// A retry's answer names the epoch that wrote its records,
			// perhaps an earlier leader's; the replica wrote nothing now,
			// under any epoch.
			return
		}
		ev.Range, ev.Kind, ev.Epoch = q.GetRangeId(), check.Acked, a.GetEpoch()
	case tenurev1connect.ReplicaServiceTruncateProcedure:
		q := req.(*tenurev1.TruncateRequest)
		ev.Range, ev.Kind, ev.Epoch = q.GetRangeId(), check.Truncated, q.GetEpoch()
		tr := check.Truncation{Replica: node, Range: q.GetRangeId(), Epoch: q.GetEpoch(), To: q.GetTargetOffset()}
		// A truncation at epoch E follows the replica's fence at E, whose
		// answer says what the replica held: the checker matches it against
		// the acknowledged records by (offset, epoch).
		if f := o.fences[fenceKey{node, q.GetRangeId(), q.GetEpoch()}]; f != nil {
			tr.LogEnd = f.GetLogEnd()
			for _, h := range f.GetHistory() {
				tr.History = append(tr.History, check.EpochStart{Epoch: h.GetEpoch(), Start: h.GetStartOffset()})
			}
		}
		o.truncs = append(o.truncs, tr)
	case tenurev1connect.ReplicaServiceAdoptProcedure:
		q := req.(*tenurev1.AdoptRequest)
		ev.Range, ev.Kind, ev.Epoch = q.GetRangeId(), check.Adopted, q.GetEpoch()
	case tenurev1connect.ReplicaServiceFetchProcedure:
		q, a := req.(*tenurev1.FetchRequest), resp.(*tenurev1.FetchResponse)
		if len(a.GetRecords()) == 0 {
			return // only fetches that handed out records matter
		}
		ev.Range, ev.Kind, ev.Epoch = q.GetRangeId(), check.ServedFetch, a.GetEpoch()
	default:
		return
	}
	o.events = append(o.events, ev)
}

func (o *Observer) results() ([]check.EpochEvent, []check.Truncation) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]check.EpochEvent(nil), o.events...), append([]check.Truncation(nil), o.truncs...)
}

// fetchTruncations records the fetch-time truncation a replica's status
// reports (RangeStatus.fetch_truncations and last_fetch_truncation_*), once
// per increase of its count, as a check.Truncation the truncation checker
// judges like a promotion's. A follower cuts its own tail when the leader
// answers that it diverges; the checker would otherwise never see it, and
// a fetch-time cut of an acknowledged record would go uncounted.
//
// The records cut are ones the replica held when fenced at the epoch it
// fetched at: what it fetched since came from that epoch's leader, which
// never answers that its own records diverge. So the cut is matched
// against that fence's answer (history and log end), as a promotion's
// truncation is, and only within it. Limits: the status keeps only the
// last cut and the count since the process started, so two cuts between
// samples show as the later one, and a cut of a process killed before the
// next sample is not seen.
func (o *Observer) fetchTruncations(replica string, incarnation int, st *tenurev1.RangeStatus) {
	o.mu.Lock()
	defer o.mu.Unlock()
	k := cutKey{replica, st.GetRangeId(), incarnation}
	n := st.GetFetchTruncations()
	if n <= o.cuts[k] {
		return
	}
	o.cuts[k] = n
	tr := check.Truncation{Replica: replica, Range: st.GetRangeId(), Epoch: st.GetLastFetchTruncationEpoch(),
		To: st.GetLastFetchTruncationTo(), LogEnd: st.GetLastFetchTruncationFrom(), FetchLeader: st.GetLastFetchTruncationLeader()}
	if f := o.fences[fenceKey{replica, st.GetRangeId(), tr.Epoch}]; f != nil {
		tr.LogEnd = min(tr.LogEnd, f.GetLogEnd())
		for _, h := range f.GetHistory() {
			tr.History = append(tr.History, check.EpochStart{Epoch: h.GetEpoch(), Start: h.GetStartOffset()})
		}
	}
	// Without the fence's history the checker cannot match records to
	// epochs and counts nothing: the cut is still listed in the run.
	o.truncs = append(o.truncs, tr)
}
