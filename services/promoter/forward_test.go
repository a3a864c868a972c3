package promoter

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/trace"

	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// servedPromoter runs a promoter that serves PromoterService on 127.0.0.1
// and publishes that URL with the election, as `tenure promoter` does.
func (c *cluster) servedPromoter(id string, tune ...func(*Config)) (*Promoter, string) {
	c.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	url := transport.Scheme() + "://" + ln.Addr().String()
	p := c.newPromoter(id, true, append([]func(*Config){func(cfg *Config) { cfg.URL = url }}, tune...)...)
	srv := transport.ServeListener(ln, p.Handlers()...)
	c.t.Cleanup(func() { srv.Close() })
	return p, url
}

// twoPromoters runs pa, elected, then pb, a standby that has seen pa
// elected; it returns pb's URL.
func (c *cluster) twoPromoters(tuneB ...func(*Config)) string {
	c.t.Helper()
	a, _ := c.servedPromoter("pa")
	waitFor(c.t, "pa to be elected", 10*time.Second, a.Elected)
	b, bURL := c.servedPromoter("pb", tuneB...)
	waitFor(c.t, "pb to see pa elected, with its URL", 10*time.Second, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.leaderID == "pa" && b.leaderURL != ""
	})
	if b.Elected() {
		c.t.Fatal("both promoters are elected")
	}
	return bURL
}

// promoteCaller is what Promote is called on: a PromoterService client,
// or the elected promoter's own handler.
type promoteCaller interface {
	Promote(context.Context, *connect.Request[tenurev1.PromoteRequest]) (*connect.Response[tenurev1.PromoteResponse], error)
}

// promoteRetrying calls Promote until it is not refused for a promotion
// already running (the loop's own first promotion), bounded.
func promoteRetrying(ctx context.Context, t *testing.T, cl promoteCaller, req *tenurev1.PromoteRequest) (*tenurev1.PromoteResponse, error) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		resp, err := cl.Promote(ctx, connect.NewRequest(req))
		if connect.CodeOf(err) != connect.CodeUnavailable || attempt == 50 {
			if err != nil {
				return nil, err
			}
			return resp.Msg, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// An operator who asks the standby promoter (compose's `make ctl` names
// promoter-1 whichever is elected) is answered by the elected one: Promote
// and DeleteRange run there, GetStatus is the elected one's, in the
// operator's trace. A request forwarded once is never forwarded again.
func TestStandbyForwardsToTheElectedPromoter(t *testing.T) {
	recordSpans(t)
	c := newCluster(t, 3)
	c.createRange("r", "r1")
	bURL := c.twoPromoters()
	_, e1 := c.leader("r", 1, 20*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	standby := tenurev1connect.NewPromoterServiceClient(c.http, bURL, transport.ClientOptions()...)

	resp, err := promoteRetrying(ctx, t, standby, &tenurev1.PromoteRequest{RangeId: "r", PreferredReplicaId: "r2", Reason: "planned"})
	if err != nil {
		t.Fatalf("Promote through the standby: %v", err)
	}
	if tr := resp.GetTransition(); tr.GetPromoterId() != "pa" || tr.GetLeaderId() != "r2" || tr.GetEpoch() <= e1 {
		t.Fatalf("Promote through the standby = promoter %s, leader %s at %d; want pa's promotion of r2 above epoch %d", tr.GetPromoterId(), tr.GetLeaderId(), tr.GetEpoch(), e1)
	}
	if leader, _ := c.leader("r", resp.GetTransition().GetEpoch(), 10*time.Second); leader != "r2" {
		t.Fatalf("after the forwarded promotion %s leads, want r2", leader)
	}

	// The operator's trace holds both hops and the promotion.
	traceID, err := trace.TraceIDFromHex(resp.GetTransition().GetTraceId())
	if err != nil {
		t.Fatalf("transition trace_id %q: %v", resp.GetTransition().GetTraceId(), err)
	}
	var st *spanTree
	waitFor(t, "both hops' Promote spans", 5*time.Second, func() bool {
		st = traceOf(traceID)
		return len(st.named("tenure.v1.PromoterService/Promote")) == 4 && len(st.named("promote")) == 1
	})
	if len(st.roots) != 1 || st.spans[st.roots[0]].Name != "tenure.v1.PromoterService/Promote" {
		t.Fatalf("trace %s:\n%s\nwant one root, the operator's Promote", traceID, st.render())
	}

	status, err := standby.GetStatus(ctx, connect.NewRequest(&tenurev1.PromoterServiceGetStatusRequest{}))
	if err != nil {
		t.Fatalf("GetStatus through the standby: %v", err)
	}
	if m := status.Msg; m.GetPromoterId() != "pa" || !m.GetElected() || len(m.GetRanges()) != 1 {
		t.Fatalf("GetStatus through the standby = %v; want pa's, elected, with range r", m)
	}
	del, err := standby.DeleteRange(ctx, connect.NewRequest(&tenurev1.PromoterServiceDeleteRangeRequest{RangeId: "never-created"}))
	if err != nil || del.Msg.GetExisted() {
		t.Fatalf("DeleteRange(never-created) through the standby = %v, %v; want existed false", del, err)
	}

	// ChangeReplicas streams the elected one's answer back: here its
	// refusal of a replica that is no member.
	err = serverStreamErr(standby.ChangeReplicas(ctx, connect.NewRequest(&tenurev1.ChangeReplicasRequest{RangeId: "r", RemoveReplicaId: "r9"})))
	if err == nil || connect.CodeOf(err) == connect.CodeFailedPrecondition && strings.Contains(err.Error(), "not elected") ||
		!strings.Contains(err.Error(), "forwarded to the elected promoter pa") {
		t.Fatalf("ChangeReplicas(remove r9) through the standby = %v; want pa's refusal", err)
	}

	// One hop: a request already forwarded is answered, not forwarded.
	req := connect.NewRequest(&tenurev1.PromoteRequest{RangeId: "r"})
	req.Header().Set(ForwardedHeader, "pc")
	_, err = standby.Promote(ctx, req)
	if code := connect.CodeOf(err); code != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "pa") {
		t.Fatalf("a forwarded Promote to the standby = %v, want FailedPrecondition naming pa", err)
	}
}

// Under mutual TLS the standby forwards with its own certificate, which
// carries only the promoter role, after its own server admitted the
// operator's; a caller the table refuses at the standby is refused there
// and never forwarded.
func TestStandbyForwardsUnderMutualTLS(t *testing.T) {
	dir, _, load := testCerts(t)
	transport.SetTLS(load(dir, "cluster"))
	t.Cleanup(func() { transport.SetTLS(nil) })
	c := newCluster(t, 3)
	c.createRange("r", "r1")
	bURL := c.twoPromoters(func(cfg *Config) { cfg.HTTPClient = tlsHTTPClient(load(dir, "as-promoter").ClientConfig()) })
	_, e1 := c.leader("r", 1, 20*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	consumer := tenurev1connect.NewPromoterServiceClient(tlsHTTPClient(load(dir, "as-consumer").ClientConfig()), bURL, transport.ClientOptions()...)
	if _, err := consumer.Promote(ctx, connect.NewRequest(&tenurev1.PromoteRequest{RangeId: "r"})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("Promote through the standby as a consumer = %v, want permission denied", err)
	}
	operator := tenurev1connect.NewPromoterServiceClient(tlsHTTPClient(load(dir, "as-operator").ClientConfig()), bURL, transport.ClientOptions()...)
	resp, err := promoteRetrying(ctx, t, operator, &tenurev1.PromoteRequest{RangeId: "r", PreferredReplicaId: "r3"})
	if err != nil {
		t.Fatalf("Promote through the standby as an operator: %v", err)
	}
	if tr := resp.GetTransition(); tr.GetPromoterId() != "pa" || tr.GetLeaderId() != "r3" || tr.GetEpoch() <= e1 {
		t.Fatalf("Promote through the standby = promoter %s, leader %s at %d; want pa's promotion of r3 above epoch %d", tr.GetPromoterId(), tr.GetLeaderId(), tr.GetEpoch(), e1)
	}
	// The consumer's refusal promoted nothing: one promotion since e1.
	if got := resp.GetTransition().GetPreviousEpoch(); got != e1 {
		t.Fatalf("the operator's promotion started from epoch %d, want %d", got, e1)
	}
}

// A standby whose elected promoter cannot be reached answers GetStatus for
// itself (not elected, naming the elected one) rather than failing.
func TestStandbyStatusWhenTheElectedIsUnreachable(t *testing.T) {
	c := newCluster(t, 3)
	c.createRange("r", "r1")
	a, _ := c.servedPromoter("pa", func(cfg *Config) { cfg.URL = "http://127.0.0.1:1" }) // nothing listens there
	waitFor(t, "pa to be elected", 10*time.Second, a.Elected)
	b, bURL := c.servedPromoter("pb")
	waitFor(t, "pb to see pa elected", 10*time.Second, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.leaderID == "pa" && b.leaderURL != ""
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	standby := tenurev1connect.NewPromoterServiceClient(c.http, bURL, transport.ClientOptions()...)
	resp, err := standby.GetStatus(ctx, connect.NewRequest(&tenurev1.PromoterServiceGetStatusRequest{}))
	if err != nil {
		t.Fatalf("GetStatus of the standby, its elected promoter unreachable: %v", err)
	}
	if m := resp.Msg; m.GetPromoterId() != "pb" || m.GetElected() || m.GetLeaderPromoterId() != "pa" {
		t.Fatalf("GetStatus of the standby = %v; want pb, not elected, naming pa", m)
	}
	// A Promote says where it could not go.
	_, err = standby.Promote(ctx, connect.NewRequest(&tenurev1.PromoteRequest{RangeId: "r"}))
	if code := connect.CodeOf(err); code != connect.CodeUnavailable || !strings.Contains(err.Error(), "forwarded to the elected promoter pa") {
		t.Fatalf("Promote through the standby, pa unreachable = %v; want unavailable saying it was forwarded to pa", err)
	}
}
