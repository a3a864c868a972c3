package lease_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// GrantEpochs keeps GrantEpoch's compare-and-swap per range: a stale
// previous epoch, an unknown range or a malformed entry fails that range
// alone, with the code (and current epoch) the single call would answer,
// and every other range of the batch is granted.
func TestGrantEpochsRefusesPerRange(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, time.Minute)
	for _, id := range []string{"a", "b", "c"} {
		createRange(t, ctx, env.Client, id)
	}
	sid := openSession(t, ctx, env.Client, "p1", 60_000)
	grant(t, ctx, env.Client, "a", 0, "p1", sid) // a is at epoch 1

	g := func(id string, prev uint64) *tenurev1.GrantEpochRequest {
		return &tenurev1.GrantEpochRequest{RangeId: id, PreviousEpoch: prev, HolderId: "p1", SessionId: sid}
	}
	resp, err := env.Client.GrantEpochs(ctx, connect.NewRequest(&tenurev1.GrantEpochsRequest{Grants: []*tenurev1.GrantEpochRequest{
		g("a", 0),       // stale: a is at 1
		g("b", 0),       // granted
		g("missing", 0), // unknown range
		g("bad/id", 0),  // malformed
		g("c", 0),       // granted
	}}))
	if err != nil {
		t.Fatalf("GrantEpochs() = %v", err)
	}
	rs := resp.Msg.GetResults()
	if len(rs) != 5 {
		t.Fatalf("GrantEpochs() answered %d results, want 5", len(rs))
	}
	wantErr := func(i int, code connect.Code, current uint64) {
		t.Helper()
		e := rs[i].GetError()
		if rs[i].GetGrant() != nil || e == nil || connect.Code(e.GetCode()) != code || e.GetCurrentEpoch() != current {
			t.Errorf("result %d (%s) = %v, want error %v with current epoch %d", i, rs[i].GetRangeId(), rs[i], code, current)
		}
	}
	wantErr(0, connect.CodeAborted, 1)
	if !strings.Contains(rs[0].GetError().GetMessage(), "current epoch is 1") {
		t.Errorf("lost grant message %q does not name the current epoch", rs[0].GetError().GetMessage())
	}
	wantErr(2, connect.CodeNotFound, 0)
	wantErr(3, connect.CodeInvalidArgument, 0)
	for _, i := range []int{1, 4} {
		if rs[i].GetError() != nil || rs[i].GetGrant().GetEpoch() != 1 || rs[i].GetGrant().GetLease().GetSessionId() != sid {
			t.Errorf("result %d (%s) = %v, want epoch 1 bound to session %d", i, rs[i].GetRangeId(), rs[i], sid)
		}
	}
	// The same batch again: every grant that succeeded is now stale.
	resp, err = env.Client.GrantEpochs(ctx, connect.NewRequest(&tenurev1.GrantEpochsRequest{Grants: []*tenurev1.GrantEpochRequest{g("b", 0), g("c", 1)}}))
	if err != nil {
		t.Fatalf("GrantEpochs() = %v", err)
	}
	rs = resp.Msg.GetResults()
	wantErr(0, connect.CodeAborted, 1)
	if rs[1].GetGrant().GetEpoch() != 2 {
		t.Errorf("GrantEpochs(c, previous 1) = %v, want epoch 2", rs[1])
	}
	// And the single call agrees with what the batch stored.
	l, err := env.Client.GetLease(ctx, connect.NewRequest(&tenurev1.GetLeaseRequest{RangeId: "c"}))
	if err != nil || l.Msg.GetLease().GetEpoch() != 2 {
		t.Errorf("GetLease(c) = %v, %v; want epoch 2", l, err)
	}
}

// Two promoters granting the same ranges in batches at once: each range is
// granted exactly once (distinct epochs, invariant 7); the loser of each
// range hears Aborted with the winner's epoch.
func TestGrantEpochsRacingPromoters(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, time.Minute)
	const n = 40
	for i := range n {
		createRange(t, ctx, env.Client, fmt.Sprintf("m%02d", i))
	}
	holders := []string{"p1", "p2"}
	sids := []int64{openSession(t, ctx, env.Client, "p1", 60_000), openSession(t, ctx, env.Client, "p2", 60_000)}
	results := make([][]*tenurev1.GrantEpochResult, 2)
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			req := &tenurev1.GrantEpochsRequest{}
			for i := range n {
				// The two promoters list the ranges in opposite orders, so
				// their transactions interleave rather than one batch
				// finishing first.
				id := fmt.Sprintf("m%02d", i)
				if w == 1 {
					id = fmt.Sprintf("m%02d", n-1-i)
				}
				req.Grants = append(req.Grants, &tenurev1.GrantEpochRequest{RangeId: id, PreviousEpoch: 0, HolderId: holders[w], SessionId: sids[w]})
			}
			resp, err := env.Client.GrantEpochs(ctx, connect.NewRequest(req))
			if err != nil {
				t.Errorf("%s: GrantEpochs() = %v", holders[w], err)
				return
			}
			results[w] = resp.Msg.GetResults()
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	won := map[string]string{}
	for w, rs := range results {
		for _, r := range rs {
			switch {
			case r.GetError() == nil && r.GetGrant().GetEpoch() == 1:
				if prev, ok := won[r.GetRangeId()]; ok {
					t.Errorf("range %s: epoch 1 granted to both %s and %s", r.GetRangeId(), prev, holders[w])
				}
				won[r.GetRangeId()] = holders[w]
			case connect.Code(r.GetError().GetCode()) == connect.CodeAborted && r.GetError().GetCurrentEpoch() == 1:
			default:
				t.Errorf("%s: range %s = %v, want epoch 1 or Aborted at current epoch 1", holders[w], r.GetRangeId(), r)
			}
		}
	}
	if len(won) != n {
		t.Errorf("%d of %d ranges granted, want every one exactly once", len(won), n)
	}
	for id, holder := range won {
		l, err := env.Client.GetLease(ctx, connect.NewRequest(&tenurev1.GetLeaseRequest{RangeId: id}))
		if err != nil || l.Msg.GetLease().GetEpoch() != 1 || l.Msg.GetLease().GetHolderId() != holder {
			t.Errorf("GetLease(%s) = %v, %v; want epoch 1 held by %s", id, l, err, holder)
		}
	}
}

// BindLeases moves only current epochs' leases, per range.
func TestBindLeasesRefusesPerRange(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, time.Minute)
	createRange(t, ctx, env.Client, "a")
	createRange(t, ctx, env.Client, "b")
	p := openSession(t, ctx, env.Client, "p1", 60_000)
	leader := openSession(t, ctx, env.Client, "r2", 60_000)
	grant(t, ctx, env.Client, "a", 0, "p1", p)
	grant(t, ctx, env.Client, "b", grant(t, ctx, env.Client, "b", 0, "p1", p), "p1", p) // b is at 2
	resp, err := env.Client.BindLeases(ctx, connect.NewRequest(&tenurev1.BindLeasesRequest{Binds: []*tenurev1.BindLeaseRequest{
		{RangeId: "a", Epoch: 1, HolderId: "r2"},
		{RangeId: "b", Epoch: 1, HolderId: "r2"}, // deposed epoch
	}}))
	if err != nil {
		t.Fatalf("BindLeases() = %v", err)
	}
	rs := resp.Msg.GetResults()
	if rs[0].GetError() != nil || rs[0].GetBind().GetLease().GetSessionId() != leader || rs[0].GetBind().GetLease().GetHolderId() != "r2" {
		t.Errorf("BindLeases(a at 1) = %v, want bound to r2's session %d", rs[0], leader)
	}
	if e := rs[1].GetError(); rs[1].GetBind() != nil || connect.Code(e.GetCode()) != connect.CodeFailedPrecondition || e.GetCurrentEpoch() != 2 {
		t.Errorf("BindLeases(b at 1) = %v, want FailedPrecondition naming current epoch 2", rs[1])
	}
	l, err := env.Client.GetLease(ctx, connect.NewRequest(&tenurev1.GetLeaseRequest{RangeId: "b"}))
	if err != nil || l.Msg.GetLease().GetHolderId() != "p1" {
		t.Errorf("GetLease(b) = %v, %v; want still held by p1", l, err)
	}
}

// A batch that is empty, too large, or names a range twice is malformed as
// a whole.
func TestBatchBounds(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, time.Minute)
	g := func(id string) *tenurev1.GrantEpochRequest {
		return &tenurev1.GrantEpochRequest{RangeId: id, HolderId: "p1"}
	}
	var tooMany []*tenurev1.GrantEpochRequest
	for i := range wire.MaxRangesPerBatch + 1 {
		tooMany = append(tooMany, g(fmt.Sprintf("r%d", i)))
	}
	for name, grants := range map[string][]*tenurev1.GrantEpochRequest{
		"empty":     nil,
		"too many":  tooMany,
		"duplicate": {g("a"), g("b"), g("a")},
	} {
		_, err := env.Client.GrantEpochs(ctx, connect.NewRequest(&tenurev1.GrantEpochsRequest{Grants: grants}))
		wantCode(t, "GrantEpochs("+name+")", err, connect.CodeInvalidArgument)
	}
	_, err := env.Client.BindLeases(ctx, connect.NewRequest(&tenurev1.BindLeasesRequest{}))
	wantCode(t, "BindLeases(empty)", err, connect.CodeInvalidArgument)
}

// GetRanges answers each range as GetRange would; an unknown or malformed
// range fails alone.
func TestGetRangesPerRange(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, time.Minute)
	createRange(t, ctx, env.Client, "a")
	createRange(t, ctx, env.Client, "b")
	sid := openSession(t, ctx, env.Client, "p1", 60_000)
	grant(t, ctx, env.Client, "b", 0, "p1", sid)
	resp, err := env.Client.GetRanges(ctx, connect.NewRequest(&tenurev1.GetRangesRequest{RangeIds: []string{"b", "missing", "a", "bad/id"}}))
	if err != nil {
		t.Fatalf("GetRanges() = %v", err)
	}
	rs := resp.Msg.GetResults()
	if len(rs) != 4 {
		t.Fatalf("GetRanges() answered %d results, want 4", len(rs))
	}
	for i, want := range []uint64{1, 0, 0, 0} {
		single, serr := env.Client.GetRange(ctx, connect.NewRequest(&tenurev1.GetRangeRequest{RangeId: rs[i].GetRangeId()}))
		switch {
		case serr != nil:
			if e := rs[i].GetError(); rs[i].GetRange() != nil || connect.Code(e.GetCode()) != connect.CodeOf(serr) {
				t.Errorf("GetRanges(%s) = %v, want the error GetRange answers: %v", rs[i].GetRangeId(), rs[i], serr)
			}
		case rs[i].GetError() != nil || rs[i].GetRange().GetEpoch() != want || len(rs[i].GetRange().GetReplicas()) != 3 ||
			rs[i].GetRange().GetMembershipRevision() != single.Msg.GetRange().GetMembershipRevision():
			t.Errorf("GetRanges(%s) = %v, want %v", rs[i].GetRangeId(), rs[i], single.Msg.GetRange())
		}
	}
}

// A full batch spans several etcd transactions, each range a nested
// transaction of one: a stale previous epoch still fails that range alone,
// every other range is granted exactly prev+1 and answered with the range
// as of its grant (its replica set, from the grant's own transaction, so a
// promoter can fence without a GetRange first), and the binds that follow
// move exactly the current epochs' leases, per range.
func TestGrantAndBindFullBatchPerRange(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, time.Minute)
	n := wire.MaxRangesPerBatch
	sid := openSession(t, ctx, env.Client, "p1", 60_000)
	created := map[string]*tenurev1.RangeInfo{}
	req := &tenurev1.GrantEpochsRequest{}
	for i := range n {
		id := fmt.Sprintf("m%03d", i)
		created[id] = createRange(t, ctx, env.Client, id)
		if i%10 == 3 {
			grant(t, ctx, env.Client, id, 0, "p1", sid) // stale below: it is at 1
		}
		req.Grants = append(req.Grants, &tenurev1.GrantEpochRequest{RangeId: id, PreviousEpoch: 0, HolderId: "p1", SessionId: sid})
	}
	resp, err := env.Client.GrantEpochs(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatalf("GrantEpochs() = %v", err)
	}
	rs := resp.Msg.GetResults()
	if len(rs) != n {
		t.Fatalf("GrantEpochs() answered %d results, want %d", len(rs), n)
	}
	binds := &tenurev1.BindLeasesRequest{}
	for i, r := range rs {
		id := fmt.Sprintf("m%03d", i)
		if r.GetRangeId() != id {
			t.Fatalf("result %d names %q, want %q", i, r.GetRangeId(), id)
		}
		if i%10 == 3 {
			if e := r.GetError(); r.GetGrant() != nil || connect.Code(e.GetCode()) != connect.CodeAborted || e.GetCurrentEpoch() != 1 {
				t.Errorf("%s (stale) = %v, want Aborted at current epoch 1", id, r)
			}
			// Bind a deposed epoch: refused for this range alone.
			binds.Binds = append(binds.Binds, &tenurev1.BindLeaseRequest{RangeId: id, Epoch: 2, HolderId: "r2"})
			continue
		}
		g, want := r.GetGrant(), created[id]
		if r.GetError() != nil || g.GetEpoch() != 1 || g.GetLease().GetSessionId() != sid {
			t.Errorf("%s = %v, want epoch 1 bound to session %d", id, r, sid)
			continue
		}
		if ri := g.GetRange(); ri.GetRangeId() != id || ri.GetEpoch() != 1 || ri.GetMembershipRevision() != want.GetMembershipRevision() ||
			len(ri.GetReplicas()) != len(want.GetReplicas()) || ri.GetReplicas()[1].GetAddress() != want.GetReplicas()[1].GetAddress() {
			t.Errorf("%s: grant's range = %v, want the created %v at epoch 1", id, ri, want)
		}
		binds.Binds = append(binds.Binds, &tenurev1.BindLeaseRequest{RangeId: id, Epoch: 1, HolderId: "r2"})
	}
	leader := openSession(t, ctx, env.Client, "r2", 60_000)
	bresp, err := env.Client.BindLeases(ctx, connect.NewRequest(binds))
	if err != nil {
		t.Fatalf("BindLeases() = %v", err)
	}
	for _, r := range bresp.Msg.GetResults() {
		var i int
		fmt.Sscanf(r.GetRangeId(), "m%03d", &i)
		if i%10 == 3 {
			if e := r.GetError(); r.GetBind() != nil || connect.Code(e.GetCode()) != connect.CodeFailedPrecondition || e.GetCurrentEpoch() != 1 {
				t.Errorf("bind %s at a deposed epoch = %v, want FailedPrecondition at current epoch 1", r.GetRangeId(), r)
			}
			continue
		}
		if r.GetError() != nil || r.GetBind().GetLease().GetSessionId() != leader || r.GetBind().GetLease().GetEpoch() != 1 {
			t.Errorf("bind %s = %v, want epoch 1 bound to r2's session %d", r.GetRangeId(), r, leader)
		}
	}
	// What the batches stored is what the single calls read.
	for i := range n {
		id := fmt.Sprintf("m%03d", i)
		l, err := env.Client.GetLease(ctx, connect.NewRequest(&tenurev1.GetLeaseRequest{RangeId: id}))
		want := "r2"
		if i%10 == 3 {
			want = "p1"
		}
		if err != nil || l.Msg.GetLease().GetEpoch() != 1 || l.Msg.GetLease().GetHolderId() != want {
			t.Errorf("GetLease(%s) = %v, %v; want epoch 1 held by %s", id, l, err, want)
		}
	}
}
