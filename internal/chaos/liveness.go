package chaos

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

// promoterTimings are the promoters' timings, set explicitly (they are
// promoter.Config's defaults but for the refresh) so that livenessBound is
// derived from what the promoters really run with.
var promoterTimings = check.LivenessTimings{
	LeaseTTL:       sessionTTL,
	StatusInterval: time.Second,
	ProbeInterval:  100 * time.Millisecond,
	ProbeTimeout:   300 * time.Millisecond,
	ProbeMisses:    3,
	FenceTimeout:   time.Second,
	RPCTimeout:     2 * time.Second,
	RetryMax:       2 * time.Second,
}

// livenessBound is how long after healing the range has to serve again
// (check.LivenessBound: 26.6 s here).
var livenessBound = check.LivenessBound(promoterTimings)

// checkLiveness is the liveness checker's observation of the run's range,
// healed at healed: within livenessBound an append acknowledged and a read
// answered through the workload's clients (recorded in the history like
// every other operation), then the elected promoter's view agreeing with
// the replicas'.
func (c *Cluster) checkLiveness(w *workload.Workload, healed time.Time) check.Liveness {
	l := check.Liveness{Range: rangeID, Bound: livenessBound}
	deadline := healed.Add(livenessBound)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	var detail []string
	if err := w.AppendOne(ctx, time.Until(deadline)); err != nil {
		detail = append(detail, err.Error())
	} else {
		l.Appended = true
		if err := w.ReadOne(ctx, time.Until(deadline)); err != nil {
			detail = append(detail, err.Error())
		} else {
			l.Read = true
		}
	}
	// The promoter's view lags what it acts on by up to a status probe:
	// polled until it calls the range healthy and agrees, and judged on
	// its last answer at the bound. Once the range has not served, the
	// view is read once, for the report.
	for {
		agrees, healthy, view := c.promoterAgrees(rangeID)
		l.Agreed, l.Promoter = agrees, view
		if (agrees && healthy) || !l.Appended || !l.Read || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !l.Stuck() {
		l.Took = time.Since(healed)
		return l
	}
	l.Detail = strings.Join(append(detail, l.Promoter), "; ")
	return l
}

// promoterAgrees asks the elected promoter (around the Network) for its
// view of rangeID and compares it with the replicas' (check.PromoterAgrees).
func (c *Cluster) promoterAgrees(rangeID string) (agrees, healthy bool, view string) {
	var ps *tenurev1.RangePromotionState
	elected := false
	for _, q := range c.promoters {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		cl := tenurev1connect.NewPromoterServiceClient(c.direct, q.srv.URL(), transport.ClientOptions()...)
		resp, err := cl.GetStatus(ctx, connect.NewRequest(&tenurev1.PromoterServiceGetStatusRequest{}))
		cancel()
		if err != nil || !resp.Msg.GetElected() {
			continue
		}
		elected = true
		for _, r := range resp.Msg.GetRanges() {
			if r.GetRangeId() == rangeID {
				ps = r
			}
		}
	}
	if !elected {
		return false, false, "no promoter is elected"
	}
	statuses := map[string]*tenurev1.RangeStatus{}
	for _, rn := range c.replicas {
		if st := c.status(rn, rangeID); st != nil {
			statuses[rn.id] = st
		}
	}
	return check.PromoterAgrees(ps, statuses)
}
