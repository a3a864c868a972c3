package lease_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

func policy(maxBytes uint64, maxAge time.Duration) *tenurev1.RetentionPolicy {
	return &tenurev1.RetentionPolicy{MaxBytes: maxBytes, MaxAgeMs: maxAge.Milliseconds()}
}

func wantPolicy(t *testing.T, what string, got, want *tenurev1.RetentionPolicy) {
	t.Helper()
	if !proto.Equal(got, want) {
		t.Fatalf("%s: retention = %v, want %v", what, got, want)
	}
}

func setRetention(ctx context.Context, c tenurev1connect.LeaseServiceClient, id string, p *tenurev1.RetentionPolicy) (*tenurev1.RangeInfo, error) {
	resp, err := c.SetRetention(ctx, connect.NewRequest(&tenurev1.SetRetentionRequest{RangeId: id, Retention: p}))
	if err != nil {
		return nil, err
	}
	return resp.Msg.GetRange(), nil
}

// A range created without a policy has the defaults, written out in etcd (a
// later change of the defaults does not change it); one created with a
// policy has exactly that one. Every read path answers it.
func TestCreateRangeRetention(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, 20*time.Second)
	c := env.Client

	plain := createRange(t, ctx, c, "plain")
	wantPolicy(t, "CreateRange without a policy", plain.GetRetention(), wire.DefaultRetention())
	if wire.DefaultRetention().GetMaxAgeMs() != (7 * 24 * time.Hour).Milliseconds() {
		t.Fatalf("default max_age_ms = %d, want 7 days (the documented default)", wire.DefaultRetention().GetMaxAgeMs())
	}
	kv, err := env.EtcdClient.Get(ctx, testPrefix(t)+"retention/plain")
	if err != nil || len(kv.Kvs) != 1 {
		t.Fatalf("etcd Get(retention/plain) = %v, %v; want the defaults stored explicitly", kv, err)
	}
	var stored map[string]int64
	if err := json.Unmarshal(kv.Kvs[0].Value, &stored); err != nil || stored["max_age_ms"] != wire.DefaultRetentionAgeMs || len(stored) != 2 {
		t.Fatalf("stored policy %s (%v), want both fields with max_age_ms %d", kv.Kvs[0].Value, err, wire.DefaultRetentionAgeMs)
	}

	want := policy(64<<10, 12*time.Hour)
	resp, err := c.CreateRange(ctx, connect.NewRequest(&tenurev1.CreateRangeRequest{RangeId: "small", Replicas: replicas("r1", "r2", "r3"), Retention: want}))
	if err != nil {
		t.Fatalf("CreateRange(small, %v) = %v", want, err)
	}
	wantPolicy(t, "CreateRange's answer", resp.Msg.GetRange().GetRetention(), want)
	wantPolicy(t, "GetRange", getRange(t, ctx, c, "small").GetRetention(), want)
	unlimited := policy(0, 0)
	if _, err := c.CreateRange(ctx, connect.NewRequest(&tenurev1.CreateRangeRequest{RangeId: "forever", Replicas: replicas("r1"), Retention: unlimited})); err != nil {
		t.Fatalf("CreateRange(forever, unlimited) = %v", err)
	}
	wantPolicy(t, "GetRange of an unlimited range", getRange(t, ctx, c, "forever").GetRetention(), unlimited)

	list, err := c.ListRanges(ctx, connect.NewRequest(&tenurev1.ListRangesRequest{}))
	if err != nil {
		t.Fatalf("ListRanges() = %v", err)
	}
	byID := map[string]*tenurev1.RetentionPolicy{}
	for _, r := range list.Msg.GetRanges() {
		byID[r.GetRangeId()] = r.GetRetention()
	}
	wantPolicy(t, "ListRanges plain", byID["plain"], wire.DefaultRetention())
	wantPolicy(t, "ListRanges small", byID["small"], want)
	wantPolicy(t, "ListRanges forever", byID["forever"], unlimited)

	batch, err := c.GetRanges(ctx, connect.NewRequest(&tenurev1.GetRangesRequest{RangeIds: []string{"small", "plain"}}))
	if err != nil {
		t.Fatalf("GetRanges() = %v", err)
	}
	wantPolicy(t, "GetRanges small", batch.Msg.GetResults()[0].GetRange().GetRetention(), want)
	wantPolicy(t, "GetRanges plain", batch.Msg.GetResults()[1].GetRange().GetRetention(), wire.DefaultRetention())

	// The grant answers the policy too: the promoter passes it to the new
	// leader in Adopt.
	sess := openSession(t, ctx, c, "promoter", ttlMs)
	g, err := c.GrantEpoch(ctx, connect.NewRequest(&tenurev1.GrantEpochRequest{RangeId: "small", PreviousEpoch: 0, HolderId: "promoter", SessionId: sess}))
	if err != nil {
		t.Fatalf("GrantEpoch(small) = %v", err)
	}
	wantPolicy(t, "GrantEpoch's range", g.Msg.GetRange().GetRetention(), want)
}

// A range stored before retention existed (no retention key) reads as the
// defaults, and SetRetention gives it a policy of its own.
func TestRangeWithoutStoredPolicyReadsDefaults(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, 20*time.Second)
	createRange(t, ctx, env.Client, "old")
	if _, err := env.EtcdClient.Delete(ctx, testPrefix(t)+"retention/old"); err != nil {
		t.Fatalf("etcd Delete(retention/old) = %v", err)
	}
	wantPolicy(t, "GetRange of a range with no stored policy", getRange(t, ctx, env.Client, "old").GetRetention(), wire.DefaultRetention())
	want := policy(1<<30, 0)
	if _, err := setRetention(ctx, env.Client, "old", want); err != nil {
		t.Fatalf("SetRetention(old) = %v", err)
	}
	wantPolicy(t, "GetRange after SetRetention", getRange(t, ctx, env.Client, "old").GetRetention(), want)
}

// SetRetention replaces the policy, answers the range as stored, leaves the
// membership and its revision alone, refuses bad input and unknown ranges,
// and a range deleted and created again does not inherit the old policy.
func TestSetRetention(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, 20*time.Second)
	c := env.Client
	before := createRange(t, ctx, c, "r")

	want := policy(256<<20, 36*time.Hour)
	after, err := setRetention(ctx, c, "r", want)
	if err != nil {
		t.Fatalf("SetRetention(r, %v) = %v", want, err)
	}
	wantPolicy(t, "SetRetention's answer", after.GetRetention(), want)
	if after.GetMembershipRevision() != before.GetMembershipRevision() || ids(after.GetReplicas()) != ids(before.GetReplicas()) {
		t.Fatalf("SetRetention moved the membership: revision %d -> %d, replicas %s -> %s",
			before.GetMembershipRevision(), after.GetMembershipRevision(), ids(before.GetReplicas()), ids(after.GetReplicas()))
	}
	wantPolicy(t, "GetRange after SetRetention", getRange(t, ctx, c, "r").GetRetention(), want)

	for _, tc := range []struct {
		name string
		req  *tenurev1.SetRetentionRequest
		code connect.Code
	}{
		{"no policy", &tenurev1.SetRetentionRequest{RangeId: "r"}, connect.CodeInvalidArgument},
		{"negative age", &tenurev1.SetRetentionRequest{RangeId: "r", Retention: &tenurev1.RetentionPolicy{MaxAgeMs: -1}}, connect.CodeInvalidArgument},
		{"age beyond 100 years", &tenurev1.SetRetentionRequest{RangeId: "r", Retention: &tenurev1.RetentionPolicy{MaxAgeMs: wire.MaxRetentionAgeMs + 1}}, connect.CodeInvalidArgument},
		{"bad range id", &tenurev1.SetRetentionRequest{RangeId: "a/b", Retention: policy(1, 0)}, connect.CodeInvalidArgument},
		{"unknown range", &tenurev1.SetRetentionRequest{RangeId: "nope", Retention: policy(1, 0)}, connect.CodeNotFound},
	} {
		_, err := c.SetRetention(ctx, connect.NewRequest(tc.req))
		wantCode(t, "SetRetention "+tc.name, err, tc.code)
	}
	// CreateRange validates the same way.
	_, err = c.CreateRange(ctx, connect.NewRequest(&tenurev1.CreateRangeRequest{RangeId: "bad", Replicas: replicas("r1"), Retention: &tenurev1.RetentionPolicy{MaxAgeMs: -5}}))
	wantCode(t, "CreateRange with a negative age", err, connect.CodeInvalidArgument)
	wantPolicy(t, "GetRange after refused changes", getRange(t, ctx, c, "r").GetRetention(), want)
	// The largest age is accepted: the bound is inclusive.
	if _, err := setRetention(ctx, c, "r", &tenurev1.RetentionPolicy{MaxAgeMs: wire.MaxRetentionAgeMs}); err != nil {
		t.Fatalf("SetRetention(max age) = %v", err)
	}

	if _, err := c.DeleteRange(ctx, connect.NewRequest(&tenurev1.DeleteRangeRequest{RangeId: "r"})); err != nil {
		t.Fatalf("DeleteRange(r) = %v", err)
	}
	_, err = setRetention(ctx, c, "r", want)
	wantCode(t, "SetRetention of a deleted range", err, connect.CodeNotFound)
	kv, err := env.EtcdClient.Get(ctx, testPrefix(t)+"retention/r")
	if err != nil || len(kv.Kvs) != 0 {
		t.Fatalf("etcd Get(retention/r) after DeleteRange = %v, %v; want no key left behind", kv, err)
	}
	createRange(t, ctx, c, "r")
	wantPolicy(t, "a range created again", getRange(t, ctx, c, "r").GetRetention(), wire.DefaultRetention())
}

// SetRetention racing membership writes loses neither: every address change
// lands, on the revision its own previous write returned (a policy write
// that moved the membership revision would abort it), and the last policy
// written is the one stored.
func TestSetRetentionConcurrentMembershipChange(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, 30*time.Second)
	c := env.Client
	info := createRange(t, ctx, c, "r")
	const rounds = 20
	var wg sync.WaitGroup
	errs := make(chan error, 2*rounds)
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := 1; i <= rounds; i++ {
			if _, err := setRetention(ctx, c, "r", policy(uint64(i)<<20, time.Duration(i)*time.Hour)); err != nil {
				errs <- fmt.Errorf("SetRetention round %d: %w", i, err)
				return
			}
		}
	}()
	var last *tenurev1.RangeInfo
	go func() {
		defer wg.Done()
		cur := info
		for i := 1; i <= rounds; i++ {
			rs := replicas("r1", "r2", "r3")
			rs[0].Address = fmt.Sprintf("http://127.0.0.1:%d", 9000+i)
			resp, err := c.SetReplicas(ctx, connect.NewRequest(&tenurev1.SetReplicasRequest{RangeId: "r", Replicas: rs, ExpectedRevision: cur.GetMembershipRevision()}))
			if err != nil {
				errs <- fmt.Errorf("SetReplicas round %d at revision %d: %w", i, cur.GetMembershipRevision(), err)
				return
			}
			cur = resp.Msg.GetRange()
		}
		last = cur
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got := getRange(t, ctx, c, "r")
	wantPolicy(t, "after the race", got.GetRetention(), policy(rounds<<20, rounds*time.Hour))
	if a := got.GetReplicas()[0].GetAddress(); a != fmt.Sprintf("http://127.0.0.1:%d", 9000+rounds) {
		t.Fatalf("after the race r1's address = %s, want the last one set", a)
	}
	if got.GetMembershipRevision() != last.GetMembershipRevision() {
		t.Fatalf("membership revision = %d, want %d (the last SetReplicas'): a policy write moved it", got.GetMembershipRevision(), last.GetMembershipRevision())
	}
}
