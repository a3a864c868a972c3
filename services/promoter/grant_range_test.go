package promoter

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
	"github.com/tenurelog/tenure/services/lease"
)

// rangelessGrants serves the lease service as a version before
// GrantEpochResponse.range: grants answer no range.
type rangelessGrants struct{ *lease.Service }

func (s rangelessGrants) GrantEpoch(ctx context.Context, req *connect.Request[tenurev1.GrantEpochRequest]) (*connect.Response[tenurev1.GrantEpochResponse], error) {
	resp, err := s.Service.GrantEpoch(ctx, req)
	if err == nil {
		resp.Msg.Range = nil
	}
	return resp, err
}

func (s rangelessGrants) GrantEpochs(ctx context.Context, req *connect.Request[tenurev1.GrantEpochsRequest]) (*connect.Response[tenurev1.GrantEpochsResponse], error) {
	resp, err := s.Service.GrantEpochs(ctx, req)
	if err == nil {
		for _, r := range resp.Msg.GetResults() {
			if g := r.GetGrant(); g != nil {
				g.Range = nil
			}
		}
	}
	return resp, err
}

// A failover grants before it reads the range, and takes the replica set
// from the grant; against a lease service whose grants carry no range it
// reads the range after the grant instead, and still promotes: the first
// leaders, and new ones after their leader is killed, each recorded once.
func TestFailoverWithGrantsWithoutRange(t *testing.T) {
	c := newCluster(t, 3)
	path, h := tenurev1connect.NewLeaseServiceHandler(rangelessGrants{c.lease.Service}, transport.HandlerOptions()...)
	older, err := transport.Serve("127.0.0.1:0", transport.Registration{Name: tenurev1connect.LeaseServiceName, Path: path, Handler: h})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { older.Close() })
	ids := []string{"a", "b", "c"}
	for _, id := range ids {
		c.createRange(id, "r1")
	}
	p := c.newPromoter("p1", true, func(cfg *Config) { cfg.LeaseURL = older.URL() })
	epochs, killedLed := map[string]uint64{}, map[string]bool{}
	var killed string
	for _, id := range ids {
		leader, e := c.leader(id, 1, 20*time.Second)
		epochs[id] = e
		if killed == "" {
			killed = leader
		}
		killedLed[id] = leader == killed
	}
	c.stop(c.byID[killed])
	ctx := context.Background()
	for _, id := range ids {
		// A live replica leads (the killed one's ranges at a new epoch),
		// and the record of its epoch names it.
		leader, e := c.leader(id, epochs[id], 20*time.Second)
		waitFor(t, "the transition record of "+id, 10*time.Second, func() bool {
			trs, err := p.transitions(ctx, id, 1)
			return err == nil && len(trs) == 1 && trs[0].GetEpoch() == e && trs[0].GetLeaderId() == leader
		})
		if leader == killed || (epochs[id] == e && killedLed[id]) {
			t.Errorf("range %s: led by %s at epoch %d after %s, its leader at epoch %d, was killed", id, leader, e, killed, epochs[id])
		}
	}
}
