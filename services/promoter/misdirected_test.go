package promoter

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// An address that reaches another replica (a restarted container back at
// an address another replica had) must not let one replica's fence answer
// count as two members toward the quorum. Here r3's listed address is r2's:
// with r1 down only r2 can answer, so no quorum of two may form.
func TestFenceAnswerFromTheWrongReplicaDoesNotCount(t *testing.T) {
	c := newCluster(t, 3)
	members := c.members()
	members[2].Address = members[1].Address // "r3" is reached at r2's address
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const rangeID = "misdirected"
	if _, err := c.lease.Client.CreateRange(ctx, connect.NewRequest(&tenurev1.CreateRangeRequest{RangeId: rangeID, Replicas: members})); err != nil {
		t.Fatal(err)
	}
	c.stop(c.byID["r1"])
	p := c.newPromoter("p1", false)

	tr, err := p.promote(ctx, rangeID, -1, "", "test: r3's address reaches r2")
	if err == nil {
		t.Fatalf("promoted with r1 down and r3's address reaching r2: %v; r2 was counted twice", tr)
	}
	if connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "no quorum") || !strings.Contains(err.Error(), "misdirected") {
		t.Fatalf("promote = %v, want Unavailable: no quorum, with r3's answer refused as misdirected", err)
	}
	// r2 was fenced once, as itself.
	st, err := c.replicaClient(members[1].GetAddress()).GetStatus(ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: rangeID}))
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Msg.GetReplicaId(); got != "r2" {
		t.Fatalf("status at r2's address is from %s", got)
	}
}
