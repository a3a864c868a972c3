package main

import (
	"context"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/internal/chaos/check"
	"github.com/tenurelog/tenure/internal/chaos/workload"
	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// livenessBound is how long after healing a scenario's range has to serve
// again (check.LivenessBound) with the stack's timings: the lease TTL
// (--lease-ttl) and the promoter binary's defaults (cmd/tenure/promoter.go,
// promoter.Config): 26.6 s at the default 2 s TTL.
func (cfg config) livenessBound() time.Duration {
	return check.LivenessBound(check.LivenessTimings{
		LeaseTTL: cfg.leaseTTL, StatusInterval: time.Second, ProbeInterval: 100 * time.Millisecond,
		ProbeTimeout: 300 * time.Millisecond, ProbeMisses: 3, FenceTimeout: time.Second,
		RPCTimeout: 2 * time.Second, RetryMax: 2 * time.Second,
	})
}

// agreementWindow is how long the promoter's view is polled when the
// scenario's own waits already took it past the bound: a view lags by up
// to a status probe (1 s), so one look alone could catch a transient.
const agreementWindow = 3 * time.Second

// checkLiveness is the liveness checker's observation of the range after
// the scenario healed its fault (at sc.healed): an acknowledged append and
// an OK read within the bound, taken from the workload's history when it
// has them and else tried (AppendOne, ReadOne) in what is left of the
// bound, and then the elected promoter's view agreeing with the replicas'.
func (sc *scenario) checkLiveness(ctx context.Context, w *workload.Workload, hist *check.History) check.Liveness {
	bound := sc.cfg.livenessBound()
	l := check.Liveness{Range: sc.rangeID, Bound: bound}
	healed := sc.healed
	if healed.IsZero() {
		// The scenario failed before healing anything: judge from now.
		healed = time.Now()
	}
	deadline := healed.Add(bound)
	var served time.Time
	seen := func(k check.Kind) bool {
		for _, op := range hist.Ops() {
			if op.Kind == k && op.Outcome == check.OK && !op.Call.Before(healed) && !op.Return.After(deadline) {
				if op.Return.After(served) {
					served = op.Return
				}
				return true
			}
		}
		return false
	}
	var detail []string
	l.Appended = seen(check.Append)
	if !l.Appended && time.Now().Before(deadline) {
		if err := w.AppendOne(ctx, time.Until(deadline)); err != nil {
			detail = append(detail, err.Error())
		} else {
			l.Appended, served = true, time.Now()
		}
	}
	if l.Appended {
		l.Read = seen(check.Read)
		if !l.Read && time.Now().Before(deadline) {
			if err := w.ReadOne(ctx, time.Until(deadline)); err != nil {
				detail = append(detail, err.Error())
			} else {
				l.Read, served = true, time.Now()
			}
		}
	} else if len(detail) == 0 {
		detail = append(detail, "no append acknowledged after healing")
	}
	until := deadline
	if later := time.Now().Add(agreementWindow); later.After(until) {
		until = later
	}
	// Polled until the promoter calls the range healthy and agrees, and
	// judged on its last answer (check.PromoterAgrees).
	for {
		agrees, healthy, view := sc.promoterAgrees(ctx)
		l.Agreed, l.Promoter = agrees, view
		if (agrees && healthy) || !l.Appended || !l.Read || time.Now().After(until) || ctx.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !l.Stuck() {
		l.Took = served.Sub(healed)
		return l
	}
	l.Detail = strings.Join(append(detail, l.Promoter), "; ")
	return l
}

// promoterAgrees asks both promoters for their status and compares the
// elected one's view of the range with the replicas' (check.PromoterAgrees).
func (sc *scenario) promoterAgrees(ctx context.Context) (agrees, healthy bool, view string) {
	var ps *tenurev1.RangePromotionState
	elected := false
	for _, p := range []string{"promoter-1", "promoter-2"} {
		cl := tenurev1connect.NewPromoterServiceClient(sc.stack.httpClient(), sc.stack.url(p, "7200"), transport.ClientOptions()...)
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := cl.GetStatus(cctx, connect.NewRequest(&tenurev1.PromoterServiceGetStatusRequest{}))
		cancel()
		if err != nil || !resp.Msg.GetElected() {
			continue
		}
		elected = true
		for _, r := range resp.Msg.GetRanges() {
			if r.GetRangeId() == sc.rangeID {
				ps = r
			}
		}
	}
	if !elected {
		return false, false, "no promoter is elected"
	}
	return check.PromoterAgrees(ps, sc.statuses(ctx))
}
