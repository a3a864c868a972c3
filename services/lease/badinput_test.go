package lease_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/lease"
	"github.com/tenurelog/tenure/services/lease/leasetest"
)

// TestBadInput: every malformed or impossible request gets a Connect error
// with the code that means it and a message that says what is wrong.
func TestBadInput(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, time.Minute)
	c := env.Client
	info := createRange(t, ctx, c, "known")
	sid := openSession(t, ctx, c, "promoter", 60_000)
	grant(t, ctx, c, "known", 0, "promoter", sid)

	tests := []struct {
		name string
		call func() error
		code connect.Code
		// says is a fragment the message must contain.
		says string
	}{
		{"GetRange unknown range", func() error {
			_, err := c.GetRange(ctx, connect.NewRequest(&tenurev1.GetRangeRequest{RangeId: "nope"}))
			return err
		}, connect.CodeNotFound, `range "nope" not found`},
		{"GetLease unknown range", func() error {
			_, err := c.GetLease(ctx, connect.NewRequest(&tenurev1.GetLeaseRequest{RangeId: "nope"}))
			return err
		}, connect.CodeNotFound, `range "nope" not found`},
		{"GrantEpoch unknown range", func() error {
			_, err := c.GrantEpoch(ctx, connect.NewRequest(&tenurev1.GrantEpochRequest{RangeId: "nope", HolderId: "promoter", SessionId: sid}))
			return err
		}, connect.CodeNotFound, `range "nope" not found`},
		{"GrantEpoch invalid range id", func() error {
			_, err := c.GrantEpoch(ctx, connect.NewRequest(&tenurev1.GrantEpochRequest{RangeId: "a/b", HolderId: "promoter", SessionId: sid}))
			return err
		}, connect.CodeInvalidArgument, "has byte '/'"},
		{"GrantEpoch missing holder", func() error {
			_, err := c.GrantEpoch(ctx, connect.NewRequest(&tenurev1.GrantEpochRequest{RangeId: "known", PreviousEpoch: 1}))
			return err
		}, connect.CodeInvalidArgument, "holder_id is missing"},
		{"GrantEpoch holder without session", func() error {
			_, err := c.GrantEpoch(ctx, connect.NewRequest(&tenurev1.GrantEpochRequest{RangeId: "known", PreviousEpoch: 1, HolderId: "stranger"}))
			return err
		}, connect.CodeFailedPrecondition, "no live session"},
		{"GrantEpoch stale previous", func() error {
			_, err := c.GrantEpoch(ctx, connect.NewRequest(&tenurev1.GrantEpochRequest{RangeId: "known", PreviousEpoch: 0, HolderId: "promoter"}))
			return err
		}, connect.CodeAborted, "current epoch is 1"},
		{"BindLease epoch 0", func() error {
			_, err := c.BindLease(ctx, connect.NewRequest(&tenurev1.BindLeaseRequest{RangeId: "known", Epoch: 0, HolderId: "promoter"}))
			return err
		}, connect.CodeInvalidArgument, "epoch 0 is never granted"},
		{"BindLease epoch not current", func() error {
			_, err := c.BindLease(ctx, connect.NewRequest(&tenurev1.BindLeaseRequest{RangeId: "known", Epoch: 7, HolderId: "promoter"}))
			return err
		}, connect.CodeFailedPrecondition, "the current epoch is 1"},
		{"ReleaseLease epoch 0", func() error {
			_, err := c.ReleaseLease(ctx, connect.NewRequest(&tenurev1.ReleaseLeaseRequest{RangeId: "known", Epoch: 0, SessionId: sid}))
			return err
		}, connect.CodeInvalidArgument, "epoch 0 is never granted"},
		{"KeepAlive epoch 0", func() error {
			_, err := c.KeepAlive(ctx, connect.NewRequest(&tenurev1.KeepAliveRequest{SessionId: sid, Held: []*tenurev1.RangeEpoch{{RangeId: "known"}}}))
			return err
		}, connect.CodeInvalidArgument, "epoch 0 is never granted"},
		{"KeepAlive unknown session", func() error {
			_, err := c.KeepAlive(ctx, connect.NewRequest(&tenurev1.KeepAliveRequest{SessionId: 12345}))
			return err
		}, connect.CodeNotFound, "session 12345 not found"},
		{"OpenSession negative TTL", func() error {
			_, err := c.OpenSession(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{HolderId: "h", TtlMs: -2000}))
			return err
		}, connect.CodeInvalidArgument, "must be positive"},
		{"OpenSession TTL not whole seconds", func() error {
			_, err := c.OpenSession(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{HolderId: "h", TtlMs: 2500}))
			return err
		}, connect.CodeInvalidArgument, "not whole seconds"},
		{"OpenSession TTL below etcd's minimum", func() error {
			_, err := c.OpenSession(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{HolderId: "h", TtlMs: 1000}))
			return err
		}, connect.CodeInvalidArgument, "below etcd's minimum lease TTL of 2000 ms"},
		{"OpenSession missing holder", func() error {
			_, err := c.OpenSession(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{TtlMs: 2000}))
			return err
		}, connect.CodeInvalidArgument, "holder_id is missing"},
		{"CreateRange invalid range id", func() error {
			_, err := c.CreateRange(ctx, connect.NewRequest(&tenurev1.CreateRangeRequest{RangeId: ".hidden", Replicas: replicas("r1")}))
			return err
		}, connect.CodeInvalidArgument, "starts with '.'"},
		{"CreateRange no replicas", func() error {
			_, err := c.CreateRange(ctx, connect.NewRequest(&tenurev1.CreateRangeRequest{RangeId: "empty"}))
			return err
		}, connect.CodeInvalidArgument, "replica set is empty"},
		{"CreateRange existing", func() error {
			_, err := c.CreateRange(ctx, connect.NewRequest(&tenurev1.CreateRangeRequest{RangeId: "known", Replicas: replicas("r1")}))
			return err
		}, connect.CodeAlreadyExists, `range "known" already exists`},
		{"SetReplicas stale revision", func() error {
			_, err := c.SetReplicas(ctx, connect.NewRequest(&tenurev1.SetReplicasRequest{RangeId: "known", Replicas: replicas("r1"), ExpectedRevision: info.GetMembershipRevision() - 1}))
			return err
		}, connect.CodeAborted, "membership revision is now"},
		{"WatchLeases invalid range id", func() error {
			return watchErr(ctx, c, &tenurev1.WatchLeasesRequest{RangeIds: []string{""}})
		}, connect.CodeInvalidArgument, "range id is empty"},
		{"WatchLeases negative revision", func() error {
			return watchErr(ctx, c, &tenurev1.WatchLeasesRequest{AfterRevision: -1})
		}, connect.CodeInvalidArgument, "after_revision -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if got := connect.CodeOf(err); err == nil || got != tt.code || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("%s = %v (code %v), want code %v saying %q", tt.name, err, got, tt.code, tt.says)
			}
		})
	}

	// The default TTL (ttl_ms 0) is granted, not refused.
	resp, err := c.OpenSession(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{HolderId: "h"}))
	if err != nil || resp.Msg.GetTtlMs() != lease.DefaultSessionTTL.Milliseconds() {
		t.Fatalf("OpenSession(ttl_ms 0) = %v, %v; want the default %v", resp, err, lease.DefaultSessionTTL)
	}
}

// TestNewRefusesBadDefaultTTL: a default TTL etcd cannot honour fails at
// start, not on every OpenSession.
func TestNewRefusesBadDefaultTTL(t *testing.T) {
	cli := leasetest.EtcdClient(t, sharedEtcd)
	ctx := testCtx(t, 30*time.Second)
	for _, d := range []time.Duration{0, -time.Second, 1500 * time.Millisecond, time.Second} {
		if _, err := lease.New(ctx, cli, lease.WithDefaultTTL(d)); err == nil {
			t.Errorf("New(WithDefaultTTL(%v)) succeeded, want an error", d)
		}
	}
}

// watchErr opens a watch and returns how it ended (bounded).
func watchErr(ctx context.Context, c interface {
	WatchLeases(context.Context, *connect.Request[tenurev1.WatchLeasesRequest]) (*connect.ServerStreamForClient[tenurev1.WatchLeasesResponse], error)
}, req *tenurev1.WatchLeasesRequest) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, err := c.WatchLeases(ctx, connect.NewRequest(req))
	if err != nil {
		return err
	}
	defer stream.Close()
	for stream.Receive() {
	}
	return stream.Err()
}
