package replica_test

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/tenurelog/tenure/internal/testlog"
	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
	"github.com/tenurelog/tenure/services/lease"
	"github.com/tenurelog/tenure/services/lease/leasetest"
	"github.com/tenurelog/tenure/services/replica"
)

// retentionRig is one replica leading range "ret" alone (a quorum of one),
// with a short retention interval, and the range in a real lease service.
type retentionRig struct {
	t     *testing.T
	ctx   context.Context
	lease *leasetest.Env
	rc    tenurev1connect.ReplicaServiceClient
	lc    tenurev1connect.LogServiceClient
	// url is the replica's; logs what it logged at Info.
	url  string
	logs *testlog.Buffer
}

const retentionInterval = 50 * time.Millisecond

// newRetentionRig starts the lease service and the replica, and creates
// range "ret" on it with the policy created; with refresh, the replica
// re-reads policies from the lease service (its Keeper is
// Config.Policies), else it knows only what Adopt tells it.
func newRetentionRig(t *testing.T, refresh bool, created *tenurev1.RetentionPolicy) *retentionRig {
	t.Helper()
	g := newRetentionReplica(t, refresh, retentionInterval)
	if _, err := g.lease.Client.CreateRange(g.ctx, connect.NewRequest(&tenurev1.CreateRangeRequest{
		RangeId: "ret", Replicas: []*tenurev1.Replica{{Id: "r1", Address: g.url}}, Retention: created,
	})); err != nil {
		t.Fatal(err)
	}
	return g
}

// newRetentionReplica is newRetentionRig without a range, its retention
// passes every interval.
func newRetentionReplica(t *testing.T, refresh bool, interval time.Duration) *retentionRig {
	t.Helper()
	env := leasetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	logs := &testlog.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("replica logs:\n%s", logs.String())
		}
	})
	cfg := replica.Config{ID: "r1", DataDir: t.TempDir(), RetentionInterval: interval,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	if refresh {
		keeper, err := lease.NewKeeper(env.Client, "r1", "http://r1", lease.WithKeeperLogger(cfg.Logger))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { keeper.Close(context.Background()) })
		cfg.Policies = keeper
	}
	r, srv, err := replica.Start(cfg, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.Close()
		r.Close()
	})
	hc := transport.NewHTTPClient()
	return &retentionRig{t: t, ctx: ctx, lease: env, url: srv.URL(), logs: logs,
		rc: tenurev1connect.NewReplicaServiceClient(hc, srv.URL(), transport.ClientOptions()...),
		lc: tenurev1connect.NewLogServiceClient(hc, srv.URL(), transport.ClientOptions()...)}
}

// lead fences and adopts r1 as the leader at epoch 1, with the policy
// Adopt carries (nil: none, as from an older promoter).
func (g *retentionRig) lead(p *tenurev1.RetentionPolicy) {
	g.t.Helper()
	if _, err := g.rc.Fence(g.ctx, connect.NewRequest(&tenurev1.FenceRequest{RangeId: "ret", Epoch: 1, FencerId: "test"})); err != nil {
		g.t.Fatalf("Fence = %v", err)
	}
	rs := []*tenurev1.Replica{{Id: "r1", Address: "http://r1"}}
	if _, err := g.rc.Adopt(g.ctx, connect.NewRequest(&tenurev1.AdoptRequest{RangeId: "ret", Epoch: 1, Role: tenurev1.Role_ROLE_LEADER,
		LeaderId: "r1", Replicas: rs, Retention: p})); err != nil {
		g.t.Fatalf("Adopt = %v", err)
	}
}

// appendKiB appends n batches of one 4 KiB record each.
func (g *retentionRig) appendBatches(n int) {
	g.t.Helper()
	for i := range n {
		if _, err := g.lc.Append(g.ctx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: "ret", Records: [][]byte{bytes.Repeat([]byte{byte('a' + i%26)}, 4<<10)}})); err != nil {
			g.t.Fatalf("Append %d = %v", i, err)
		}
	}
}

func (g *retentionRig) status() *tenurev1.RangeStatus {
	g.t.Helper()
	resp, err := g.rc.GetStatus(g.ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: "ret"}))
	if err != nil || len(resp.Msg.GetRanges()) != 1 {
		g.t.Fatalf("GetStatus = %v, %v", resp, err)
	}
	return resp.Msg.GetRanges()[0]
}

// waitStart waits (bounded) until the log start passes from, checking at
// every sample that it never passes the HWM, and returns the status.
func (g *retentionRig) waitStart(from uint64, what string) *tenurev1.RangeStatus {
	g.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		st := g.status()
		if st.GetLogStart() > st.GetHighWaterMark() {
			g.t.Fatalf("log start %d above the HWM %d: uncommitted records removed", st.GetLogStart(), st.GetHighWaterMark())
		}
		if st.GetLogStart() > from {
			return st
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("timed out waiting for %s: log start %d, HWM %d, log end %d, stored %d bytes", what, st.GetLogStart(), st.GetHighWaterMark(), st.GetLogEnd(), st.GetStoredBytes())
		}
		time.Sleep(retentionInterval / 2)
	}
}

// stays checks, over several retention intervals, that the log start does
// not move from want.
func (g *retentionRig) stays(want uint64, what string) {
	g.t.Helper()
	for range 8 {
		time.Sleep(retentionInterval)
		if st := g.status(); st.GetLogStart() != want {
			g.t.Fatalf("%s: log start moved %d -> %d", what, want, st.GetLogStart())
		}
	}
}

// The policy Adopt carries is applied by the leader: the log start advances
// past the batches beyond the size limit, never past the HWM, the stored
// bytes end within the limit, and status reports both and the policy.
func TestLeaderAppliesTheRetentionAdoptCarries(t *testing.T) {
	p := &tenurev1.RetentionPolicy{MaxBytes: 16 << 10}
	g := newRetentionRig(t, false, p)
	g.lead(p)
	g.appendBatches(24) // 96 KiB, six times the limit
	st := g.waitStart(0, "retention to advance the log start")
	deadline := time.Now().Add(15 * time.Second)
	for st.GetStoredBytes() > p.GetMaxBytes() && time.Now().Before(deadline) {
		time.Sleep(retentionInterval)
		st = g.status()
	}
	if st.GetStoredBytes() == 0 || st.GetStoredBytes() > p.GetMaxBytes() {
		t.Fatalf("stored bytes %d after retention, want within (0, %d]", st.GetStoredBytes(), p.GetMaxBytes())
	}
	if !proto.Equal(st.GetRetention(), p) {
		t.Fatalf("status retention = %v, want %v (the policy in force)", st.GetRetention(), p)
	}
	if st.GetLogStart() > st.GetHighWaterMark() || st.GetLogEnd()-st.GetLogStart() > 5 {
		t.Fatalf("log start %d, HWM %d, log end %d: want at most 4 batches of 4 KiB (+ the epoch start) left", st.GetLogStart(), st.GetHighWaterMark(), st.GetLogEnd())
	}
}

// A leader that learned no policy (Adopt carried none and no lease service
// to ask) removes nothing: the defaults could be shorter than the range's
// real policy.
func TestLeaderWithoutAPolicyRemovesNothing(t *testing.T) {
	g := newRetentionRig(t, false, &tenurev1.RetentionPolicy{MaxBytes: 16 << 10})
	g.lead(nil)
	g.appendBatches(12)
	// Stored bytes count a batch from its append on (logstore
	// StoredBytes): no wait for the index.
	st := g.status()
	if st.GetRetention() != nil || st.GetStoredBytes() <= 16<<10 {
		t.Fatalf("status = retention %v, stored %d bytes; want no policy in force, and more stored than the 16 KiB the range was created with", st.GetRetention(), st.GetStoredBytes())
	}
	g.stays(0, "no policy known")
}

// The leader re-reads the policy from the lease service every interval: a
// policy set after its adoption applies without a promotion, and raising
// the limit stops further deletion.
func TestLeaderRefreshesThePolicyFromTheLeaseService(t *testing.T) {
	g := newRetentionRig(t, true, &tenurev1.RetentionPolicy{}) // created unlimited
	g.lead(&tenurev1.RetentionPolicy{})
	g.appendBatches(24)
	g.stays(0, "unlimited")

	small := &tenurev1.RetentionPolicy{MaxBytes: 16 << 10}
	if _, err := g.lease.Client.SetRetention(g.ctx, connect.NewRequest(&tenurev1.SetRetentionRequest{RangeId: "ret", Retention: small})); err != nil {
		t.Fatalf("SetRetention = %v", err)
	}
	st := g.waitStart(0, "the new policy to apply")

	large := &tenurev1.RetentionPolicy{MaxBytes: 1 << 30}
	if _, err := g.lease.Client.SetRetention(g.ctx, connect.NewRequest(&tenurev1.SetRetentionRequest{RangeId: "ret", Retention: large})); err != nil {
		t.Fatalf("SetRetention = %v", err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for !proto.Equal(st.GetRetention(), large) {
		if time.Now().After(deadline) {
			t.Fatalf("status retention = %v, want %v within a few intervals", st.GetRetention(), large)
		}
		time.Sleep(retentionInterval)
		st = g.status()
	}
	g.appendBatches(24)
	g.stays(st.GetLogStart(), "the limit raised to 1 GiB")
}
