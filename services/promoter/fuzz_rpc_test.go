package promoter_test

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
	"github.com/tenurelog/tenure/services/promoter"
)

// FuzzPromoterRPC sends arbitrary bytes, as the body of every
// PromoterService procedure, to a real, elected promoter whose range's
// replicas are all down (their promotions fail, as they must). After each
// input the promoter must still answer, and the range's epoch must never
// have gone down. Its fence and RPC bounds are short: every fence goes to
// a dead address, and an input that promotes waits them out.
func FuzzPromoterRPC(f *testing.F) {
	env := leasetest.Start(f)
	ctx := context.Background()
	dead := []*tenurev1.Replica{{Id: "r1", Address: "http://127.0.0.1:1"}, {Id: "r2", Address: "http://127.0.0.1:1"}, {Id: "r3", Address: "http://127.0.0.1:1"}}
	if _, err := env.Client.CreateRange(ctx, connect.NewRequest(&tenurev1.CreateRangeRequest{RangeId: "r", Replicas: dead})); err != nil {
		f.Fatal(err)
	}
	p, err := promoter.New(promoter.Config{ID: "p1", Etcd: env.EtcdClient, LeaseURL: env.Server.URL(), FenceTimeout: 20 * time.Millisecond, RPCTimeout: 50 * time.Millisecond})
	if err != nil {
		f.Fatal(err)
	}
	srv, err := transport.Serve("127.0.0.1:0", p.Handlers()...)
	if err != nil {
		f.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	f.Cleanup(func() {
		cancel()
		<-done
		srv.Close()
	})
	client := tenurev1connect.NewPromoterServiceClient(transport.NewHTTPClient(), srv.URL(), transport.ClientOptions()...)
	// Wait, bounded, for the election.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st, err := client.GetStatus(ctx, connect.NewRequest(&tenurev1.PromoterServiceGetStatusRequest{}))
		if err == nil && st.Msg.GetElected() {
			break
		}
		if time.Now().After(deadline) {
			f.Fatalf("promoter not elected: %v", err)
		}
	}

	procs := rpcfuzz.Procedures(tenurev1.File_tenure_v1_promoter_proto.Services().ByName("PromoterService"))
	for path, m := range map[string]proto.Message{
		tenurev1connect.PromoterServicePromoteProcedure:         &tenurev1.PromoteRequest{RangeId: "r", UnsafeAcceptDataLoss: true},
		tenurev1connect.PromoterServiceListTransitionsProcedure: &tenurev1.ListTransitionsRequest{RangeId: "r"},
		tenurev1connect.PromoterServiceGetStatusProcedure:       &tenurev1.PromoterServiceGetStatusRequest{},
		tenurev1connect.PromoterServiceChangeReplicasProcedure:  &tenurev1.ChangeReplicasRequest{RangeId: "r", RemoveReplicaId: "r3"},
		tenurev1connect.PromoterServiceDeleteRangeProcedure:     &tenurev1.PromoterServiceDeleteRangeRequest{RangeId: "nope"},
	} {
		rpcfuzz.Seed(f, procs, path, m)
	}
	hc := transport.NewHTTPClient()
	var highest uint64
	f.Fuzz(func(t *testing.T, which byte, body []byte) {
		_, _ = rpcfuzz.Send(hc, srv.URL(), rpcfuzz.Pick(procs, which), body)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := client.GetStatus(ctx, connect.NewRequest(&tenurev1.PromoterServiceGetStatusRequest{})); err != nil {
			t.Fatalf("promoter stopped answering after %s with %d bytes: %v", rpcfuzz.Pick(procs, which).Path, len(body), err)
		}
		r, err := env.Client.GetRange(ctx, connect.NewRequest(&tenurev1.GetRangeRequest{RangeId: "r"}))
		if err != nil {
			return // deleted by an input: nothing to check
		}
		if e := r.Msg.GetRange().GetEpoch(); e < highest {
			t.Fatalf("range epoch %d after %d", e, highest)
		} else {
			highest = e
		}
	})
}
