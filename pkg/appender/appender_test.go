package appender_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/appender"
	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
	"github.com/tenurelog/tenure/services/replica"
)

// member is one real replica: Badger in a temp dir, HTTP/2 on 127.0.0.1.
type member struct {
	id, url string
	rc      tenurev1connect.ReplicaServiceClient
	lc      tenurev1connect.LogServiceClient
}

func startMembers(t *testing.T, hc *http.Client, ids ...string) []*member {
	t.Helper()
	var out []*member
	for _, id := range ids {
		r, srv, err := replica.Start(replica.Config{ID: id, DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler), FetchWait: 100 * time.Millisecond}, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close(); r.Close() })
		out = append(out, &member{id: id, url: srv.URL(),
			rc: tenurev1connect.NewReplicaServiceClient(hc, srv.URL(), transport.ClientOptions()...),
			lc: tenurev1connect.NewLogServiceClient(hc, srv.URL(), transport.ClientOptions()...)})
	}
	return out
}

// elect makes leader lead range "r" at epoch, the others follow, as a
// promoter would: fence all, adopt the leader, then the followers.
func elect(ctx context.Context, t *testing.T, ms []*member, epoch uint64, leader *member) {
	t.Helper()
	var set []*tenurev1.Replica
	for _, m := range ms {
		set = append(set, &tenurev1.Replica{Id: m.id, Address: m.url})
	}
	var bound uint64
	for _, m := range ms {
		resp, err := m.rc.Fence(ctx, connect.NewRequest(&tenurev1.FenceRequest{RangeId: "r", Epoch: epoch, FencerId: "test"}))
		if err != nil {
			t.Fatalf("Fence(%s, %d): %v", m.id, epoch, err)
		}
		bound = max(bound, resp.Msg.GetHighWaterMark())
	}
	adopt := func(m *member, role tenurev1.Role) {
		if _, err := m.rc.Adopt(ctx, connect.NewRequest(&tenurev1.AdoptRequest{RangeId: "r", Epoch: epoch, Role: role,
			LeaderId: leader.id, LeaderAddress: leader.url, Replicas: set, CommittedBound: bound})); err != nil {
			t.Fatalf("Adopt(%s, %d, %v): %v", m.id, epoch, role, err)
		}
	}
	adopt(leader, tenurev1.Role_ROLE_LEADER)
	for _, m := range ms {
		if m != leader {
			adopt(m, tenurev1.Role_ROLE_FOLLOWER)
		}
	}
}

// An Appender told to follow the leader appends to whichever replica leads:
// a follower's not-leader answer names the leader, and the refused append
// goes there. It follows again when leadership moves back. Without
// FollowLeader the refusal is the answer.
func TestAppenderFollowsTheNotLeaderDetail(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hc := transport.NewHTTPClient()
	ms := startMembers(t, hc, "r1", "r2")
	r1, r2 := ms[0], ms[1]
	elect(ctx, t, ms, 1, r1)

	if _, err := appender.New(r2.lc).Append(ctx, "r", [][]byte{[]byte("x")}); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("Append to the follower without FollowLeader = %v, want failed precondition", err)
	}
	dial := func(url string) tenurev1connect.LogServiceClient {
		return tenurev1connect.NewLogServiceClient(hc, url, transport.ClientOptions()...)
	}
	a := appender.New(r2.lc, appender.FollowLeader(dial))
	defer a.Close()
	for i, want := range []struct {
		leader *member
		epoch  uint64
	}{{r1, 1}, {r1, 1}, {r2, 2}, {r2, 2}} {
		if i == 2 {
			elect(ctx, t, ms, 2, r2) // the appender's streams now reach a follower
		}
		ack, err := a.Append(ctx, "r", [][]byte{[]byte(fmt.Sprint("v", i))})
		if err != nil {
			t.Fatalf("append %d (leader %s): %v", i, want.leader.id, err)
		}
		if ack.GetEpoch() != want.epoch {
			t.Fatalf("append %d acknowledged at epoch %d, want %d (leader %s)", i, ack.GetEpoch(), want.epoch, want.leader.id)
		}
	}
}
