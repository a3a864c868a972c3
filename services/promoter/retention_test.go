package promoter

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// The promoter hands the range's retention policy to every leader it
// adopts: the first (read with GetRange) and a failover's (read from the
// grant's own answer). The test's replicas have no lease service to ask,
// so Adopt is the only way their leaders can learn the policy.
func TestAdoptCarriesTheRetentionPolicy(t *testing.T) {
	c := newCluster(t, 3)
	p := &tenurev1.RetentionPolicy{MaxBytes: 1 << 30, MaxAgeMs: 3 * 24 * 3600 * 1000}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.lease.Client.CreateRange(ctx, connect.NewRequest(&tenurev1.CreateRangeRequest{RangeId: "ret", Replicas: c.members(), Retention: p})); err != nil {
		t.Fatal(err)
	}
	c.newPromoter("p1", true)
	inForce := func(id string) *tenurev1.RetentionPolicy {
		resp, err := c.replicaClient(c.byID[id].srv.URL()).GetStatus(ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: "ret"}))
		if err != nil || len(resp.Msg.GetRanges()) != 1 {
			t.Fatalf("GetStatus(%s) = %v, %v", id, resp, err)
		}
		return resp.Msg.GetRanges()[0].GetRetention()
	}
	first, e1 := c.leader("ret", 1, 20*time.Second)
	if got := inForce(first); !proto.Equal(got, p) {
		t.Fatalf("first leader %s applies %v, want %v", first, got, p)
	}
	for _, id := range []string{"r1", "r2", "r3"} {
		if id != first && inForce(id) != nil {
			t.Errorf("follower %s reports a policy in force (%v): followers apply none", id, inForce(id))
		}
	}
	c.stop(c.byID[first])
	next, _ := c.leader("ret", e1+1, 20*time.Second)
	if got := inForce(next); !proto.Equal(got, p) {
		t.Fatalf("failover leader %s applies %v, want %v", next, got, p)
	}
}
