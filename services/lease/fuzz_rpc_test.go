package lease_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/tenurelog/tenure/internal/rpcfuzz"
	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
	"github.com/tenurelog/tenure/services/lease/leasetest"
)

// FuzzLeaseRPC sends arbitrary bytes, as the body of every LeaseService
// procedure, to a real lease service on embedded etcd. After each input the
// service must still answer, no range's epoch may have gone down (invariant
// 7), and no range's lease may be for an epoch above the range's.
func FuzzLeaseRPC(f *testing.F) {
	env := leasetest.Start(f)
	procs := rpcfuzz.Procedures(tenurev1.File_tenure_v1_lease_proto.Services().ByName("LeaseService"))
	seed := func(path string, m proto.Message) { rpcfuzz.Seed(f, procs, path, m) }
	seed(tenurev1connect.LeaseServiceCreateRangeProcedure, &tenurev1.CreateRangeRequest{RangeId: "r", Replicas: replicas("r1", "r2", "r3")})
	seed(tenurev1connect.LeaseServiceOpenSessionProcedure, &tenurev1.OpenSessionRequest{HolderId: "p", TtlMs: 60_000})
	seed(tenurev1connect.LeaseServiceGrantEpochProcedure, &tenurev1.GrantEpochRequest{RangeId: "r", HolderId: "p"})
	seed(tenurev1connect.LeaseServiceChangeMembershipProcedure, &tenurev1.ChangeMembershipRequest{RangeId: "r", ExpectedRevision: 1,
		Step: tenurev1.MembershipStep_MEMBERSHIP_STEP_ADD_LEARNER, Replica: &tenurev1.Replica{Id: "r4", Address: "http://r4"}})
	seed(tenurev1connect.LeaseServiceSetRetentionProcedure, &tenurev1.SetRetentionRequest{RangeId: "r", Retention: &tenurev1.RetentionPolicy{MaxBytes: 1 << 20, MaxAgeMs: 60_000}})
	seed(tenurev1connect.LeaseServiceDeleteRangeProcedure, &tenurev1.DeleteRangeRequest{RangeId: "r"})
	seed(tenurev1connect.LeaseServiceWatchLeasesProcedure, &tenurev1.WatchLeasesRequest{})

	hc := transport.NewHTTPClient()
	highest := map[string]uint64{}
	f.Fuzz(func(t *testing.T, which byte, body []byte) {
		_, _ = rpcfuzz.Send(hc, env.Server.URL(), rpcfuzz.Pick(procs, which), body)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := env.Client.ListRanges(ctx, connect.NewRequest(&tenurev1.ListRangesRequest{Limit: 1000}))
		if err != nil {
			t.Fatalf("lease service stopped answering after %s with %d bytes: %v", rpcfuzz.Pick(procs, which).Path, len(body), err)
		}
		for _, r := range resp.Msg.GetRanges() {
			if r.GetEpoch() < highest[r.GetRangeId()] {
				t.Fatalf("range %q at epoch %d, after %d: epochs went down", r.GetRangeId(), r.GetEpoch(), highest[r.GetRangeId()])
			}
			highest[r.GetRangeId()] = r.GetEpoch()
			if l := r.GetLease(); l != nil && l.GetEpoch() > r.GetEpoch() {
				t.Fatalf("range %q at epoch %d has a lease for epoch %d", r.GetRangeId(), r.GetEpoch(), l.GetEpoch())
			}
		}
	})
}
