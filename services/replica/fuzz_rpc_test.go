package replica_test

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
	"github.com/tenurelog/tenure/services/replica"
)

// FuzzReplicaRPC sends arbitrary bytes, as the body of every LogService and
// ReplicaService procedure, to a real replica on 127.0.0.1. After each
// input the replica must still answer, and every range it hosts must keep
// its own invariants: log start <= HWM <= log end, the epoch it acts under
// at most its fenced epoch, and no halt (a halt is a safety stop: arbitrary
// input must never reach one).
func FuzzReplicaRPC(f *testing.F) {
	r, srv, err := replica.Start(replica.Config{ID: "r1", DataDir: f.TempDir()}, "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		srv.Close()
		r.Close()
	})
	var procs []rpcfuzz.Procedure
	procs = append(procs, rpcfuzz.Procedures(tenurev1.File_tenure_v1_replica_proto.Services().ByName("ReplicaService"))...)
	procs = append(procs, rpcfuzz.Procedures(tenurev1.File_tenure_v1_log_proto.Services().ByName("LogService"))...)
	seed := func(path string, m proto.Message) { rpcfuzz.Seed(f, procs, path, m) }
	// Seeds: the commands a promoter sends, in the order it sends them,
	// then the data path.
	seed(tenurev1connect.ReplicaServiceFenceProcedure, &tenurev1.FenceRequest{RangeId: "r", Epoch: 1})
	seed(tenurev1connect.ReplicaServiceTruncateProcedure, &tenurev1.TruncateRequest{RangeId: "r", Epoch: 1, TargetOffset: 0})
	seed(tenurev1connect.ReplicaServiceAdoptProcedure, &tenurev1.AdoptRequest{RangeId: "r", Epoch: 1, Role: tenurev1.Role_ROLE_LEADER, LeaderId: "r1",
		Replicas: []*tenurev1.Replica{{Id: "r1", Address: srv.URL()}}})
	seed(tenurev1connect.LogServiceAppendProcedure, &tenurev1.AppendRequest{RangeId: "r", Records: [][]byte{[]byte("x")}})
	seed(tenurev1connect.LogServiceReadProcedure, &tenurev1.ReadRequest{RangeId: "r"})
	seed(tenurev1connect.ReplicaServiceFetchProcedure, &tenurev1.FetchRequest{RangeId: "r", Epoch: 1, ReplicaId: "r2"})
	seed(tenurev1connect.ReplicaServiceFenceProcedure, &tenurev1.FenceRequest{RangeId: "r", Epoch: ^uint64(0)})
	seed(tenurev1connect.ReplicaServiceDropRangeProcedure, &tenurev1.DropRangeRequest{RangeId: "r", Epoch: 2})

	hc := transport.NewHTTPClient()
	status := tenurev1connect.NewReplicaServiceClient(hc, srv.URL(), transport.ClientOptions()...)
	f.Fuzz(func(t *testing.T, which byte, body []byte) {
		_, _ = rpcfuzz.Send(hc, srv.URL(), rpcfuzz.Pick(procs, which), body)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := status.GetStatus(ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{}))
		if err != nil {
			t.Fatalf("replica stopped answering after %s with %d bytes: %v", rpcfuzz.Pick(procs, which).Path, len(body), err)
		}
		for _, rs := range resp.Msg.GetRanges() {
			if !(rs.GetLogStart() <= rs.GetHighWaterMark() && rs.GetHighWaterMark() <= rs.GetLogEnd()) {
				t.Fatalf("range %q: log start %d, HWM %d, log end %d out of order", rs.GetRangeId(), rs.GetLogStart(), rs.GetHighWaterMark(), rs.GetLogEnd())
			}
			if rs.GetEpoch() > rs.GetFencedEpoch() {
				t.Fatalf("range %q acts under epoch %d above its fence %d", rs.GetRangeId(), rs.GetEpoch(), rs.GetFencedEpoch())
			}
			if rs.GetHalted() != "" {
				t.Fatalf("range %q halted: %s", rs.GetRangeId(), rs.GetHalted())
			}
		}
	})
}
