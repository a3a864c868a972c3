package promoter

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// A preferred replica that answers its fence later than a quorum of the
// others still leads, on the range's first promotion and when an operator
// names it: its answer is waited for within the fence timeout. In compose,
// --preferred replica-1 lost the first election: its fence was cancelled
// about 140 ms in, once the two others had answered.
func TestSlowPreferredReplicaStillLeads(t *testing.T) {
	c := newCluster(t, 3)
	var slow atomic.Pointer[string] // the address whose fences are delayed
	base := transport.NewHTTPClient()
	t.Cleanup(base.CloseIdleConnections)
	hc := &http.Client{Transport: roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if a := slow.Load(); a != nil && req.URL.Host == *a && strings.Contains(req.URL.Path, "/Fence") {
			select {
			case <-time.After(300 * time.Millisecond):
			case <-req.Context().Done():
			}
		}
		return base.Transport.RoundTrip(req)
	})}
	r1 := strings.TrimPrefix(c.byID["r1"].srv.URL(), "http://")
	slow.Store(&r1)
	c.createRange("r", "r1")
	// A fence timeout far above the delay: the wait it bounds must not be
	// what a loaded machine decides.
	p := c.newPromoter("p1", true, func(cfg *Config) { cfg.HTTPClient = hc; cfg.FenceTimeout = 10 * time.Second })
	if leader, _ := c.leader("r", 1, 20*time.Second); leader != "r1" {
		t.Fatalf("the first leader of r, preferred r1 (fenced slowly), is %s", leader)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, want := range []string{"r2", "r1"} {
		// The preferred replica only breaks ties: let every replica
		// hold the whole log first.
		waitFor(t, "every replica to hold the leader's log", 10*time.Second, func() bool {
			end := c.logEnd("r1", "r")
			return end > 0 && c.logEnd("r2", "r") == end && c.logEnd("r3", "r") == end
		})
		var resp *connect.Response[tenurev1.PromoteResponse]
		var err error
		for attempt := 0; attempt < 50; attempt++ {
			resp, err = handler{p}.Promote(ctx, connect.NewRequest(&tenurev1.PromoteRequest{RangeId: "r", PreferredReplicaId: want}))
			if connect.CodeOf(err) != connect.CodeUnavailable { // not the loop's own promotion still running
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("Promote(preferred %s): %v", want, err)
		}
		if got := resp.Msg.GetTransition().GetLeaderId(); got != want {
			t.Fatalf("Promote(preferred %s, r1 fenced slowly) made %s the leader", want, got)
		}
	}
}
