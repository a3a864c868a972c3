package promoter

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// A leader whose lease cannot be renewed stops acknowledging appends and
// serving reads before the lease would end: here the lease service goes
// away under a real Keeper, so renewals fail and the lease runs out.
func TestLeaderStopsWhenLeaseLapses(t *testing.T) {
	c := newCluster(t, 3)
	c.createRange("r", "r1")
	p := c.newPromoter("p1", false)
	if _, err := p.promote(context.Background(), "r", 0, "", "initial"); err != nil {
		t.Fatal(err)
	}
	leader, _ := c.leader("r", 1, 10*time.Second)
	waitFor(t, "the leader's lease to be valid", 10*time.Second, func() bool { return c.status(leader, "r").GetLeaseValid() })
	if _, err := c.appendOne("r", "while leased", 10*time.Second); err != nil {
		t.Fatal(err)
	}

	lost := time.Now()
	c.lease.Server.Close()
	waitFor(t, "the leader to see its lease lapse", 10*time.Second, func() bool { return !c.status(leader, "r").GetLeaseValid() })
	t.Logf("lease seen lapsed %v after the lease service went away (session TTL 2s)", time.Since(lost))

	log := c.log_(c.byID[leader].srv.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := log.Append(ctx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: "r", Records: [][]byte{[]byte("after lapse")}}))
	if code := connect.CodeOf(err); code != connect.CodeFailedPrecondition {
		t.Errorf("Append after the lease lapsed: code %v (%v), want FailedPrecondition", code, err)
	}
	_, err = log.Read(ctx, connect.NewRequest(&tenurev1.ReadRequest{RangeId: "r"}))
	if code := connect.CodeOf(err); code != connect.CodeFailedPrecondition {
		t.Errorf("Read after the lease lapsed: code %v (%v), want FailedPrecondition", code, err)
	}
}
