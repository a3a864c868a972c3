package promoter

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/internal/metrics"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// `tenurectl promote RANGE --unsafe-accept-data-loss` on a healthy range
// (every replica answers, a quorum is fenced) loses nothing: the safe plan
// runs, and the transition is a normal one, neither marked nor counted as
// unsafe (tenure_promoter_unsafe_promotions_total is an alert series). The
// unsafe path is for a range without a safe plan (membership_test.go's
// TestUnsafePromotion* tests).
func TestUnsafeRequestWithAQuorumPromotesSafely(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := newCluster(t, 3)
	c.createRange("r", "r1")
	preg := metrics.NewRegistry("promoter")
	p := c.newPromoter("p1", true, func(cfg *Config) { cfg.Metrics = preg })
	psrv, err := metrics.Serve("127.0.0.1:0", preg, c.log)
	if err != nil {
		t.Fatal(err)
	}
	defer psrv.Close()
	_, e1 := c.leader("r", 1, 20*time.Second)
	a, err := c.appendOne("r", "committed", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}

	resp, err := handler{p}.Promote(ctx, connect.NewRequest(&tenurev1.PromoteRequest{RangeId: "r", UnsafeAcceptDataLoss: true}))
	if err != nil {
		t.Fatalf("unsafe Promote on a healthy range: %v", err)
	}
	tr := resp.Msg.GetTransition()
	if tr.GetUnsafe() || strings.Contains(tr.GetReason(), "unsafe promotion") || tr.GetEpoch() <= e1 {
		t.Errorf("transition: epoch %d, unsafe %v, reason %q; want a safe promotion above epoch %d, not called unsafe",
			tr.GetEpoch(), tr.GetUnsafe(), tr.GetReason(), e1)
	}
	trs, err := p.transitions(ctx, "r", 1)
	if err != nil || len(trs) != 1 || trs[0].GetEpoch() != tr.GetEpoch() || trs[0].GetUnsafe() {
		t.Errorf("recorded transition %v (err %v), want the safe one at epoch %d", trs, err, tr.GetEpoch())
	}
	s := scrape(t, psrv.URL())
	want(t, "promoter", s, `tenure_promoter_unsafe_promotions_total`, 0)
	want(t, "promoter", s, `tenure_promoter_promotions_total{outcome="promoted",reason="operator"}`, 1)
	if n, _ := s.Get(`tenure_promoter_promotions_total{outcome="promoted",reason="unsafe"}`); n != 0 {
		t.Errorf(`promotions_total{reason="unsafe"} = %v, want 0`, n)
	}
	c.leader("r", tr.GetEpoch(), 20*time.Second)
	c.checkAcked("r", []acked{a})
}
