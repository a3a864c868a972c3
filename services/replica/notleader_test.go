package replica_test

import (
	"testing"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/appender"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// A replica that does not lead answers every client path with a
// NotLeaderDetail naming the leader it follows (id, URL, epoch), so that a
// client follows it without parsing the message; one that knows no leader
// says so with its fenced epoch.
func TestNotLeaderAnswersCarryTheLeader(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2)
	c.mustFence(r3, 1)
	ctx := ctxT(t)

	_, appendErr := c.append(ctx, r2, values("a", 1)...)
	_, readErr := r2.lc.Read(ctx, connect.NewRequest(&tenurev1.ReadRequest{RangeId: rangeID}))
	_, streamErr := appender.New(r2.lc).Append(ctx, rangeID, values("s", 1))
	tail, err := r2.lc.Tail(ctx, connect.NewRequest(&tenurev1.TailRequest{RangeId: rangeID}))
	if err != nil {
		t.Fatal(err)
	}
	for tail.Receive() {
		t.Fatal("a follower's Tail sent records")
	}
	tailErr := tail.Err()
	tail.Close()
	for name, err := range map[string]error{"Append": appendErr, "Read": readErr, "AppendStream": streamErr, "Tail": tailErr} {
		wantCode(t, name+" on a follower", err, connect.CodeFailedPrecondition)
		d := wire.NotLeader(err)
		if d.GetLeaderId() != r1.id || d.GetLeaderUrl() != r1.url || d.GetEpoch() != 1 || d.GetReplicaId() != r2.id || d.GetRangeId() != rangeID {
			t.Errorf("%s on a follower: detail %v, want leader %s at %s, epoch 1, from %s", name, d, r1.id, r1.url, r2.id)
		}
	}

	_, err = c.append(ctx, r3, values("a", 1)...)
	wantCode(t, "Append on a fenced replica", err, connect.CodeFailedPrecondition)
	if d := wire.NotLeader(err); d == nil || d.GetLeaderId() != "" || d.GetLeaderUrl() != "" || d.GetEpoch() != 1 {
		t.Errorf("Append on a fenced replica: detail %v, want no leader, epoch 1", d)
	}
}
