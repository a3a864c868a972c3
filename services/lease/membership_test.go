package lease_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

const (
	addLearner     = tenurev1.MembershipStep_MEMBERSHIP_STEP_ADD_LEARNER
	promoteLearner = tenurev1.MembershipStep_MEMBERSHIP_STEP_PROMOTE_LEARNER
	removeMember   = tenurev1.MembershipStep_MEMBERSHIP_STEP_REMOVE
	setIncarnation = tenurev1.MembershipStep_MEMBERSHIP_STEP_SET_INCARNATION
)

func change(ctx context.Context, c tenurev1connect.LeaseServiceClient, info *tenurev1.RangeInfo, step tenurev1.MembershipStep, r *tenurev1.Replica) (*tenurev1.RangeInfo, error) {
	resp, err := c.ChangeMembership(ctx, connect.NewRequest(&tenurev1.ChangeMembershipRequest{
		RangeId: info.GetRangeId(), ExpectedRevision: info.GetMembershipRevision(), Step: step, Replica: r,
	}))
	if err != nil {
		return nil, err
	}
	return resp.Msg.GetRange(), nil
}

func complete(ctx context.Context, c tenurev1connect.LeaseServiceClient, info *tenurev1.RangeInfo) (*tenurev1.RangeInfo, error) {
	resp, err := c.CompleteMembershipChange(ctx, connect.NewRequest(&tenurev1.CompleteMembershipChangeRequest{
		RangeId: info.GetRangeId(), ExpectedRevision: info.GetMembershipRevision(),
	}))
	if err != nil {
		return nil, err
	}
	return resp.Msg.GetRange(), nil
}

func ids(rs []*tenurev1.Replica) string {
	var out []string
	for _, r := range rs {
		s := r.GetId()
		if r.GetLearner() {
			s += "(learner)"
		}
		out = append(out, s)
	}
	return strings.Join(out, ",")
}

func getRange(t *testing.T, ctx context.Context, c tenurev1connect.LeaseServiceClient, id string) *tenurev1.RangeInfo {
	t.Helper()
	resp, err := c.GetRange(ctx, connect.NewRequest(&tenurev1.GetRangeRequest{RangeId: id}))
	if err != nil {
		t.Fatalf("GetRange(%q) = %v", id, err)
	}
	return resp.Msg.GetRange()
}

// Issue 24's second hole: SetReplicas {r1,r2,r3} -> {r1,r2,r4} was accepted
// in one step, so a later promotion could fence {r2, r4}, which meets no
// quorum of {r1, r2, r3} that committed a record. Now it is refused and the
// set is unchanged; an address change alone is still accepted.
func TestSetReplicasRefusesAnythingButAddresses(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, time.Minute)
	info := createRange(t, ctx, env.Client, "r")
	for _, tc := range []struct {
		name string
		set  []*tenurev1.Replica
	}{
		{"replace r3 with r4", replicas("r1", "r2", "r4")},
		{"replace every member", replicas("r7", "r8", "r9")},
		{"add r4", replicas("r1", "r2", "r3", "r4")},
		{"remove r3", replicas("r1", "r2")},
	} {
		_, err := env.Client.SetReplicas(ctx, connect.NewRequest(&tenurev1.SetReplicasRequest{RangeId: "r", Replicas: tc.set, ExpectedRevision: info.GetMembershipRevision()}))
		wantCode(t, "SetReplicas("+tc.name+")", err, connect.CodeFailedPrecondition)
		if got := getRange(t, ctx, env.Client, "r"); ids(got.GetReplicas()) != "r1,r2,r3" || got.GetMembershipRevision() != info.GetMembershipRevision() {
			t.Fatalf("after a refused SetReplicas(%s): members %s at revision %d, want r1,r2,r3 at %d", tc.name, ids(got.GetReplicas()), got.GetMembershipRevision(), info.GetMembershipRevision())
		}
	}
	moved := replicas("r1", "r2", "r3")
	moved[2].Address = "http://127.0.0.1:9999"
	resp, err := env.Client.SetReplicas(ctx, connect.NewRequest(&tenurev1.SetReplicasRequest{RangeId: "r", Replicas: moved, ExpectedRevision: info.GetMembershipRevision()}))
	if err != nil {
		t.Fatalf("SetReplicas(new address of r3) = %v", err)
	}
	if got := resp.Msg.GetRange().GetReplicas()[2].GetAddress(); got != "http://127.0.0.1:9999" {
		t.Fatalf("r3's address = %q after SetReplicas, want the new one", got)
	}
}

// A replace is add-learner, promote-learner, remove, each in flight until
// completed at a later epoch; one step at a time.
func TestMembershipStepsOneAtATime(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, time.Minute)
	info := createRange(t, ctx, env.Client, "r")
	promoter := openSession(t, ctx, env.Client, "promoter", 60_000)
	epoch := grant(t, ctx, env.Client, "r", 0, "promoter", promoter)

	info, err := change(ctx, env.Client, info, addLearner, &tenurev1.Replica{Id: "r4", Address: "http://r4"})
	if err != nil {
		t.Fatalf("add-learner r4 = %v", err)
	}
	if got := ids(info.GetReplicas()); got != "r1,r2,r3,r4(learner)" {
		t.Fatalf("members after add-learner = %s", got)
	}
	ch := info.GetChange()
	if ch == nil || ch.GetStep() != addLearner || ch.GetReplicaId() != "r4" || ids(ch.GetOldReplicas()) != "r1,r2,r3" || ch.GetEpoch() != epoch {
		t.Fatalf("change in flight = %v, want add-learner r4 from r1,r2,r3 at epoch %d", ch, epoch)
	}
	// A second change while one is in flight.
	_, err = change(ctx, env.Client, info, removeMember, &tenurev1.Replica{Id: "r3"})
	wantCode(t, "remove r3 while add-learner r4 is in flight", err, connect.CodeFailedPrecondition)
	// Completing before a promotion under the new set.
	_, err = complete(ctx, env.Client, info)
	wantCode(t, "complete at the epoch of the change", err, connect.CodeFailedPrecondition)

	epoch = grant(t, ctx, env.Client, "r", epoch, "promoter", promoter)
	if info, err = complete(ctx, env.Client, info); err != nil {
		t.Fatalf("complete after epoch %d = %v", epoch, err)
	}
	if info.GetChange() != nil {
		t.Fatalf("change after complete = %v, want none", info.GetChange())
	}
	_, err = complete(ctx, env.Client, info)
	wantCode(t, "complete with nothing in flight", err, connect.CodeFailedPrecondition)

	if info, err = change(ctx, env.Client, info, promoteLearner, &tenurev1.Replica{Id: "r4"}); err != nil {
		t.Fatalf("promote-learner r4 = %v", err)
	}
	if got := ids(info.GetChange().GetOldReplicas()); got != "r1,r2,r3,r4(learner)" {
		t.Fatalf("old replicas of promote-learner = %s", got)
	}
	epoch = grant(t, ctx, env.Client, "r", epoch, "promoter", promoter)
	if info, err = complete(ctx, env.Client, info); err != nil {
		t.Fatal(err)
	}
	if info, err = change(ctx, env.Client, info, removeMember, &tenurev1.Replica{Id: "r3"}); err != nil {
		t.Fatalf("remove r3 = %v", err)
	}
	grant(t, ctx, env.Client, "r", epoch, "promoter", promoter)
	if info, err = complete(ctx, env.Client, info); err != nil {
		t.Fatal(err)
	}
	if got := ids(info.GetReplicas()); got != "r1,r2,r4" {
		t.Fatalf("members after the replace = %s, want r1,r2,r4", got)
	}
	// Steps that do not apply.
	for _, tc := range []struct {
		name string
		step tenurev1.MembershipStep
		r    *tenurev1.Replica
	}{
		{"add a member again", addLearner, &tenurev1.Replica{Id: "r1", Address: "http://r1"}},
		{"promote a voter", promoteLearner, &tenurev1.Replica{Id: "r1"}},
		{"remove a non-member", removeMember, &tenurev1.Replica{Id: "r9"}},
	} {
		_, err := change(ctx, env.Client, info, tc.step, tc.r)
		wantCode(t, tc.name, err, connect.CodeFailedPrecondition)
	}
	// A stale revision.
	_, err = change(ctx, env.Client, &tenurev1.RangeInfo{RangeId: "r", MembershipRevision: info.GetMembershipRevision() - 1}, removeMember, &tenurev1.Replica{Id: "r4"})
	wantCode(t, "a step at a stale revision", err, connect.CodeAborted)
}

// An incarnation is recorded once and never replaced: a member whose disk
// was replaced is not the member.
func TestIncarnationRecordedOnce(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, time.Minute)
	info := createRange(t, ctx, env.Client, "r")
	inc := strings.Repeat("ab", 16)
	info, err := change(ctx, env.Client, info, setIncarnation, &tenurev1.Replica{Id: "r2", Incarnation: inc})
	if err != nil {
		t.Fatalf("set-incarnation r2 = %v", err)
	}
	if got := info.GetReplicas()[1].GetIncarnation(); got != inc || info.GetChange() != nil {
		t.Fatalf("r2 incarnation = %q, change %v; want %q and no change in flight", got, info.GetChange(), inc)
	}
	if info, err = change(ctx, env.Client, info, setIncarnation, &tenurev1.Replica{Id: "r2", Incarnation: inc}); err != nil {
		t.Fatalf("set-incarnation r2 again (a retry) = %v", err)
	}
	_, err = change(ctx, env.Client, info, setIncarnation, &tenurev1.Replica{Id: "r2", Incarnation: strings.Repeat("cd", 16)})
	wantCode(t, "set-incarnation over a recorded one", err, connect.CodeFailedPrecondition)
	_, err = change(ctx, env.Client, info, setIncarnation, &tenurev1.Replica{Id: "r2", Incarnation: "not hex"})
	wantCode(t, "set-incarnation with a malformed one", err, connect.CodeInvalidArgument)
}

// DeleteRange is idempotent; a deleted range takes no grant; created again,
// its epochs continue above the old ones and its generation is higher.
func TestDeleteRangeKeepsEpochsApart(t *testing.T) {
	env := newEnv(t)
	ctx := testCtx(t, time.Minute)
	first := createRange(t, ctx, env.Client, "r")
	promoter := openSession(t, ctx, env.Client, "promoter", 60_000)
	e := grant(t, ctx, env.Client, "r", 0, "promoter", promoter)
	e = grant(t, ctx, env.Client, "r", e, "promoter", promoter)

	for i, want := range []bool{true, false} {
		resp, err := env.Client.DeleteRange(ctx, connect.NewRequest(&tenurev1.DeleteRangeRequest{RangeId: "r"}))
		if err != nil || resp.Msg.GetExisted() != want {
			t.Fatalf("DeleteRange #%d = %v, %v; want existed=%v", i+1, resp, err, want)
		}
	}
	_, err := env.Client.GetRange(ctx, connect.NewRequest(&tenurev1.GetRangeRequest{RangeId: "r"}))
	wantCode(t, "GetRange of a deleted range", err, connect.CodeNotFound)
	_, err = env.Client.GrantEpoch(ctx, connect.NewRequest(&tenurev1.GrantEpochRequest{RangeId: "r", PreviousEpoch: e, HolderId: "promoter", SessionId: promoter}))
	wantCode(t, "GrantEpoch of a deleted range", err, connect.CodeNotFound)

	again := createRange(t, ctx, env.Client, "r")
	if again.GetEpoch() != e {
		t.Fatalf("re-created range at epoch %d, want it to continue from %d", again.GetEpoch(), e)
	}
	if again.GetGeneration() <= first.GetGeneration() {
		t.Fatalf("re-created range generation %d, want above the deleted one's %d", again.GetGeneration(), first.GetGeneration())
	}
	if got := getRange(t, ctx, env.Client, "r").GetGeneration(); got != again.GetGeneration() {
		t.Fatalf("GetRange generation = %d, CreateRange said %d", got, again.GetGeneration())
	}
	if next := grant(t, ctx, env.Client, "r", e, "promoter", promoter); next != e+1 {
		t.Fatalf("first grant of the re-created range = %d, want %d", next, e+1)
	}
}
