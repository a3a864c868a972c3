package promoter

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tenurelog/tenure/pkg/telemetry"
	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// These tests check docs/design.md's "Observability" promise on a real cluster:
// one promotion is one trace across promoter, lease service and replicas,
// with a span per step and the attributes an operator needs to see why
// the candidate won.

var (
	spanTP       *sdktrace.TracerProvider
	spanRecorder = tracetest.NewInMemoryExporter()
	spanTPOnce   sync.Once
	// recording gates spanRecorder: the TracerProvider stays installed
	// after a trace test (the OpenTelemetry globals delegate to the first
	// provider for good), but other tests' spans must not pile up in memory.
	recording atomic.Bool
)

type gatedProcessor struct{ sdktrace.SpanProcessor }

func (g gatedProcessor) OnEnd(s sdktrace.ReadOnlySpan) {
	if recording.Load() {
		g.SpanProcessor.OnEnd(s)
	}
}

// recordSpans installs tracing as telemetry.Setup would, recording to
// memory, until the test ends. Call it before building the cluster, as a
// process calls telemetry.Setup first (transport would in fact trace
// handlers and clients built earlier too; TestSetInterceptors* in
// pkg/transport covers that).
func recordSpans(t *testing.T) {
	t.Helper()
	spanTPOnce.Do(func() {
		spanTP = sdktrace.NewTracerProvider(
			sdktrace.WithSampler(telemetry.Sampler()), // as telemetry.Setup
			sdktrace.WithSpanProcessor(gatedProcessor{sdktrace.NewSimpleSpanProcessor(spanRecorder)}))
	})
	if err := telemetry.Install(spanTP); err != nil {
		t.Fatal(err)
	}
	spanRecorder.Reset()
	recording.Store(true)
	t.Cleanup(func() {
		recording.Store(false)
		transport.SetInterceptors()
		spanRecorder.Reset()
	})
}

// spanTree is one trace's spans.
type spanTree struct {
	spans    []tracetest.SpanStub
	children map[trace.SpanID][]int
	roots    []int
}

func traceOf(id trace.TraceID) *spanTree {
	st := &spanTree{children: map[trace.SpanID][]int{}}
	for _, s := range spanRecorder.GetSpans() {
		if s.SpanContext.TraceID() == id {
			st.spans = append(st.spans, s)
		}
	}
	sort.SliceStable(st.spans, func(i, j int) bool { return st.spans[i].StartTime.Before(st.spans[j].StartTime) })
	ids := map[trace.SpanID]bool{}
	for _, s := range st.spans {
		ids[s.SpanContext.SpanID()] = true
	}
	for i, s := range st.spans {
		if p := s.Parent.SpanID(); s.Parent.IsValid() && ids[p] {
			st.children[p] = append(st.children[p], i)
		} else {
			st.roots = append(st.roots, i)
		}
	}
	return st
}

func (st *spanTree) kids(parent *tracetest.SpanStub, name string) []*tracetest.SpanStub {
	var out []*tracetest.SpanStub
	for _, i := range st.children[parent.SpanContext.SpanID()] {
		if name == "" || st.spans[i].Name == name {
			out = append(out, &st.spans[i])
		}
	}
	return out
}

func (st *spanTree) named(name string) []*tracetest.SpanStub {
	var out []*tracetest.SpanStub
	for i := range st.spans {
		if st.spans[i].Name == name {
			out = append(out, &st.spans[i])
		}
	}
	return out
}

func (st *spanTree) parent(s *tracetest.SpanStub) *tracetest.SpanStub {
	for i := range st.spans {
		if st.spans[i].SpanContext.SpanID() == s.Parent.SpanID() {
			return &st.spans[i]
		}
	}
	return nil
}

func attrOf(s *tracetest.SpanStub, key string) (attribute.Value, bool) {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

func attrString(s *tracetest.SpanStub, key string) string {
	v, _ := attrOf(s, key)
	return v.Emit()
}

// render draws the tree, one span a line, indented by depth, with its
// tenure.* attributes and, for RPC spans, the kind and the server port.
func (st *spanTree) render() string {
	var b strings.Builder
	var walk func(i, depth int)
	walk = func(i, depth int) {
		s := &st.spans[i]
		fmt.Fprintf(&b, "%s%s", strings.Repeat("  ", depth), s.Name)
		if s.SpanKind == trace.SpanKindClient || s.SpanKind == trace.SpanKindServer {
			fmt.Fprintf(&b, " [%s]", s.SpanKind)
		}
		for _, kv := range s.Attributes {
			if strings.HasPrefix(string(kv.Key), "tenure.") || kv.Key == "server.port" {
				fmt.Fprintf(&b, " %s=%s", kv.Key, kv.Value.Emit())
			}
		}
		b.WriteString("\n")
		for _, c := range st.children[s.SpanContext.SpanID()] {
			walk(c, depth+1)
		}
	}
	for _, r := range st.roots {
		walk(r, 0)
	}
	return b.String()
}

// rpcUnder finds, under the promoter span s, the otelconnect client span of
// procedure and the server span the peer made for it, as its child.
func (st *spanTree) rpcUnder(t *testing.T, s *tracetest.SpanStub, procedure string) (client, server *tracetest.SpanStub) {
	t.Helper()
	clients := st.kids(s, procedure)
	if len(clients) != 1 || clients[0].SpanKind != trace.SpanKindClient {
		t.Errorf("%s span (%s) has %d %s client spans, want 1", s.Name, attrString(s, "tenure.replica"), len(clients), procedure)
		return nil, nil
	}
	servers := st.kids(clients[0], procedure)
	if len(servers) != 1 || servers[0].SpanKind != trace.SpanKindServer {
		t.Errorf("%s client span under %s (%s) has %d server spans as children, want 1: the callee's span is not in the caller's trace",
			procedure, s.Name, attrString(s, "tenure.replica"), len(servers))
		return clients[0], nil
	}
	return clients[0], servers[0]
}

func (c *cluster) port(id string) int64 {
	_, p, _ := net.SplitHostPort(c.byID[id].listen)
	var n int64
	fmt.Sscan(p, &n)
	return n
}

// waitForEveryFence makes a promotion wait for every live replica's fence
// answer, not just a quorum's plus 20ms: on a loaded machine a straggler
// would otherwise miss the promotion, go unadopted (no reconcile loop runs
// here) and change the tree under test.
func waitForEveryFence(cfg *Config) {
	cfg.FenceTimeout = 10 * time.Second
	cfg.FenceGrace = 10 * time.Second
}

// A first promotion of a fresh range, traced: one trace, rooted at the
// promote span, with a span per step, the replicas' server spans as
// children of the promoter's calls, and its id in the transition record.
func TestPromotionIsOneTrace(t *testing.T) {
	recordSpans(t)
	c := newCluster(t, 3)
	c.createRange("orders", "r2")
	p := c.newPromoter("p1", false, waitForEveryFence)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr, err := p.promote(ctx, "orders", 0, "", "initial")
	if err != nil {
		t.Fatalf("promote: %v", err)
	}
	traceID, err := trace.TraceIDFromHex(tr.GetTraceId())
	if err != nil {
		t.Fatalf("transition trace_id %q: %v", tr.GetTraceId(), err)
	}

	// Server spans end before their response is written, so they are all
	// recorded once promote returns; wait a little anyway rather than
	// depend on that.
	var st *spanTree
	deadline := time.Now().Add(5 * time.Second)
	for st = traceOf(traceID); time.Now().Before(deadline); st = traceOf(traceID) {
		if len(st.named("promote")) == 1 && len(st.named("tenure.v1.ReplicaService/Adopt")) == 6 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("trace %s:\n%s", traceID, st.render())

	// One trace: every step span of this promotion is in it, and it has one
	// root, the promote span.
	if len(st.roots) != 1 || st.spans[st.roots[0]].Name != "promote" {
		var names []string
		for _, r := range st.roots {
			names = append(names, st.spans[r].Name)
		}
		t.Fatalf("trace %s roots = %q, want just [promote]", traceID, names)
	}
	promote := &st.spans[st.roots[0]]
	if got := attrString(promote, "tenure.range"); got != "orders" {
		t.Errorf("promote tenure.range = %q, want orders", got)
	}
	if v, _ := attrOf(promote, "tenure.epoch"); v.AsInt64() != int64(tr.GetEpoch()) {
		t.Errorf("promote tenure.epoch = %v, want %d", v.Emit(), tr.GetEpoch())
	}
	// And nothing else was traced: the keepers' sessions, the followers'
	// fetches and the test's own status polls start no trace (Sampler).
	others := map[string]int{}
	for _, s := range spanRecorder.GetSpans() {
		if s.SpanContext.TraceID() != traceID {
			others[s.Name]++
		}
	}
	if len(others) > 0 {
		t.Errorf("spans outside the promotion's trace (name: count): %v", others)
	}

	// The epoch grant, and the lease service's side of it.
	grants := st.kids(promote, "grant-epoch")
	if len(grants) != 1 {
		t.Fatalf("promote has %d grant-epoch children, want 1", len(grants))
	}
	st.rpcUnder(t, grants[0], "tenure.v1.LeaseService/GrantEpoch")

	// A fence per replica, under fence-all (which holds the quorum wait),
	// each with the replica's answer and the replica's own server span.
	fenceAll := st.kids(promote, "fence-all")
	if len(fenceAll) != 1 {
		t.Fatalf("promote has %d fence-all children, want 1", len(fenceAll))
	}
	fences := st.kids(fenceAll[0], "fence")
	var fenced []string
	for _, f := range fences {
		id := attrString(f, "tenure.replica")
		fenced = append(fenced, id)
		for _, k := range []string{"tenure.epoch", "tenure.log_end", "tenure.hwm", "tenure.last_epoch"} {
			if _, ok := attrOf(f, k); !ok {
				t.Errorf("fence span of %s has no %s", id, k)
			}
		}
		client, _ := st.rpcUnder(t, f, "tenure.v1.ReplicaService/Fence")
		if client != nil {
			if v, _ := attrOf(client, "server.port"); v.AsInt64() != c.port(id) {
				t.Errorf("fence span of %s called port %d, want %s's %d", id, v.AsInt64(), id, c.port(id))
			}
		}
	}
	slices.Sort(fenced)
	if want := []string{"r1", "r2", "r3"}; !slices.Equal(fenced, want) {
		t.Errorf("fence spans for replicas %q, want one per replica %q", fenced, want)
	}

	// The candidate choice, with every replica's answer, the committed
	// bound and the candidate.
	choose := st.kids(promote, "choose-candidate")
	if len(choose) != 1 {
		t.Fatalf("promote has %d choose-candidate children, want 1", len(choose))
	}
	for _, id := range []string{"r1", "r2", "r3"} {
		for _, k := range []string{"log_end", "hwm", "last_epoch"} {
			if _, ok := attrOf(choose[0], "tenure."+id+"."+k); !ok {
				t.Errorf("choose-candidate has no tenure.%s.%s", id, k)
			}
		}
	}
	// r2 is preferred, but under load its fence answer may miss the
	// quorum's grace: the candidate is whoever the record names.
	leader := tr.GetLeaderId()
	if got := attrString(choose[0], "tenure.candidate"); got != leader || leader == "" {
		t.Errorf("choose-candidate tenure.candidate = %q, want the transition's leader %q", got, leader)
	}
	if v, ok := attrOf(choose[0], "tenure.committed_bound"); !ok || v.AsInt64() != int64(tr.GetCommittedBound()) {
		t.Errorf("choose-candidate tenure.committed_bound = %v (set %v), want %d", v.Emit(), ok, tr.GetCommittedBound())
	}

	// Nothing diverged in a fresh range: no truncation.
	if got := st.kids(promote, "truncate"); len(got) != 0 {
		t.Errorf("promote has %d truncate children in a fresh range, want 0", len(got))
	}

	// An adoption per replica, the leader's first, each with the replica's
	// server span.
	adopts := st.kids(promote, "adopt")
	roles := map[string]string{}
	for _, a := range adopts {
		roles[attrString(a, "tenure.replica")] = attrString(a, "tenure.role")
		client, _ := st.rpcUnder(t, a, "tenure.v1.ReplicaService/Adopt")
		if client != nil {
			if id := attrString(a, "tenure.replica"); attrString(client, "server.port") != fmt.Sprint(c.port(id)) {
				t.Errorf("adopt span of %s called port %s, want %d", id, attrString(client, "server.port"), c.port(id))
			}
		}
	}
	want := map[string]string{"r1": "follower", "r2": "follower", "r3": "follower"}
	want[leader] = "leader"
	if fmt.Sprint(roles) != fmt.Sprint(want) {
		t.Errorf("adopt spans (replica: role) = %v, want %v", roles, want)
	}
	if len(adopts) == 3 && attrString(adopts[0], "tenure.role") != "leader" {
		t.Errorf("first adopt span is %s's (%s), want the leader's first", attrString(adopts[0], "tenure.replica"), attrString(adopts[0], "tenure.role"))
	}
	if got := st.kids(promote, "bind-lease"); len(got) != 1 || attrString(got[0], "tenure.replica") != leader {
		t.Errorf("promote has %d bind-lease children, want 1 binding %s", len(got), leader)
	}
	if got := st.kids(promote, "record-transition"); len(got) != 1 {
		t.Errorf("promote has %d record-transition children, want 1", len(got))
	}

	// Every replica server span of the promotion is in this trace.
	for _, proc := range []string{"tenure.v1.ReplicaService/Fence", "tenure.v1.ReplicaService/Adopt"} {
		servers := 0
		for _, s := range st.named(proc) {
			if s.SpanKind == trace.SpanKindServer {
				servers++
				if p := st.parent(s); p == nil || p.Name != proc || p.SpanKind != trace.SpanKindClient {
					t.Errorf("%s server span's parent is not the promoter's client span", proc)
				}
			}
		}
		if servers != 3 {
			t.Errorf("trace has %d %s server spans, want 3", servers, proc)
		}
	}
}

// traceLogEnd is a replica's log end for rangeID (0 if it does not answer).
func (c *cluster) traceLogEnd(id, rangeID string) uint64 {
	tr := c.byID[id]
	if tr.srv == nil {
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := c.replicaClient(tr.srv.URL()).GetStatus(ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: rangeID}))
	if err != nil || len(resp.Msg.GetRanges()) != 1 {
		return 0
	}
	return resp.Msg.GetRanges()[0].GetLogEnd()
}

// A promotion that truncates: the old leader wrote a tail no follower got,
// was down while another replica was promoted at epoch 2, and is back. The
// traced promotion at epoch 3 must show a truncate span for it with the
// records it removed, and its own Truncate server span under it.
func TestPromotionTraceShowsTruncation(t *testing.T) {
	recordSpans(t)
	c := newCluster(t, 3)
	c.createRange("div", "r1")
	p := c.newPromoter("p1", false, waitForEveryFence)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := p.promote(ctx, "div", 0, "", "initial"); err != nil {
		t.Fatalf("promote at epoch 1: %v", err)
	}
	// r1 is preferred, but under load its fence answer may miss the
	// quorum's grace and another replica lead: the story works from any.
	old, _ := c.leader("div", 1, 10*time.Second)
	var followers []string
	for _, id := range []string{"r1", "r2", "r3"} {
		if id != old {
			followers = append(followers, id)
		}
	}
	var last acked
	for i := range 3 {
		a, err := c.appendOne("div", fmt.Sprintf("committed-%d", i), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		last = a
	}
	committedEnd := last.offset + 1
	waitFor(t, "followers to hold the committed records", 10*time.Second, func() bool {
		return c.traceLogEnd(followers[0], "div") >= committedEnd && c.traceLogEnd(followers[1], "div") >= committedEnd
	})

	// A tail only the old leader holds: both followers partitioned, so it
	// cannot commit.
	for _, id := range followers {
		c.byID[id].gate.Close()
	}
	time.Sleep(3 * c.fetchWait) // let fetches sent before the gate closed end
	actx, acancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := c.log_(c.byID[old].srv.URL()).Append(actx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: "div", Records: [][]byte{[]byte("tail-0"), []byte("tail-1"), []byte("tail-2")}}))
	acancel()
	if err == nil {
		t.Fatal("an append with both followers partitioned was acknowledged")
	}
	tailEnd := c.traceLogEnd(old, "div")
	if tailEnd <= committedEnd {
		t.Fatalf("%s log end %d: the tail was not written (committed end %d)", old, tailEnd, committedEnd)
	}

	// The old leader down, epoch 2 goes to a follower; then it comes back.
	c.stop(c.byID[old])
	for _, id := range followers {
		c.byID[id].gate.Open()
	}
	if _, err := p.promote(ctx, "div", 1, "", old+" down"); err != nil {
		t.Fatalf("promote at epoch 2: %v", err)
	}
	c.start(c.byID[old])

	tr, err := p.promote(ctx, "div", 2, "", old+" back")
	if err != nil {
		t.Fatalf("promote at epoch 3: %v", err)
	}
	traceID, err := trace.TraceIDFromHex(tr.GetTraceId())
	if err != nil {
		t.Fatalf("transition trace_id %q: %v", tr.GetTraceId(), err)
	}
	var st *spanTree
	waitFor(t, "the Truncate server span", 5*time.Second, func() bool {
		st = traceOf(traceID)
		return len(st.named("tenure.v1.ReplicaService/Truncate")) == 2
	})
	t.Logf("trace %s:\n%s", traceID, st.render())

	if len(st.roots) != 1 || st.spans[st.roots[0]].Name != "promote" {
		t.Fatalf("trace %s has %d roots, want just promote", traceID, len(st.roots))
	}
	promote := &st.spans[st.roots[0]]
	truncs := st.kids(promote, "truncate")
	if len(truncs) != 1 {
		t.Fatalf("promote has %d truncate children, want 1 (%s's tail)", len(truncs), old)
	}
	tspan := truncs[0]
	if got := attrString(tspan, "tenure.replica"); got != old {
		t.Errorf("truncate span's replica = %s, want the old leader %s", got, old)
	}
	want := map[string]int64{"tenure.from": int64(tailEnd), "tenure.to": int64(committedEnd), "tenure.records_removed": int64(tailEnd - committedEnd)}
	for k, v := range want {
		if got, ok := attrOf(tspan, k); !ok || got.AsInt64() != v {
			t.Errorf("truncate span %s = %s (set %v), want %d", k, got.Emit(), ok, v)
		}
	}
	if _, server := st.rpcUnder(t, tspan, "tenure.v1.ReplicaService/Truncate"); server == nil {
		t.Errorf("%s's Truncate server span is not under the truncate span", old)
	}
	// The record agrees with the trace.
	if n := len(tr.GetTruncations()); n != 1 || tr.GetTruncations()[0].GetReplicaId() != old {
		t.Errorf("transition truncations = %v, want %s's", tr.GetTruncations(), old)
	}
	// Truncation comes before any adoption: a replica agrees with the
	// candidate before it follows it.
	for _, a := range st.kids(promote, "adopt") {
		if a.StartTime.Before(tspan.EndTime) {
			t.Errorf("adopt of %s started before the truncation ended", attrString(a, "tenure.replica"))
		}
	}
	if got := len(st.kids(promote, "adopt")); got != 3 {
		t.Errorf("promote has %d adopt children, want 3", got)
	}
}

// An operator's promotion ('tenurectl promote') arrives as a
// PromoterService/Promote call: the promote span is a child of that call's
// server span, in the caller's trace, so the operator's own tooling can
// follow it, and the transition's trace id is that trace's.
func TestOperatorPromoteJoinsTheCallersTrace(t *testing.T) {
	recordSpans(t)
	c := newCluster(t, 3)
	c.createRange("ops", "r1")
	// Promote is served by the elected promoter only: run the loop, let it
	// promote the first leader, then ask for a planned promotion.
	p := c.newPromoter("p1", true, waitForEveryFence)
	c.leader("ops", 1, 20*time.Second)
	srv, err := transport.Serve("127.0.0.1:0", p.Handlers()...)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	client := tenurev1connect.NewPromoterServiceClient(c.http, srv.URL(), transport.ClientOptions()...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The loop's own promotion may still be finishing (it answers
	// Unavailable then): retry, bounded.
	var resp *connect.Response[tenurev1.PromoteResponse]
	for attempt := 0; ; attempt++ {
		resp, err = client.Promote(ctx, connect.NewRequest(&tenurev1.PromoteRequest{RangeId: "ops", Reason: "planned"}))
		if connect.CodeOf(err) != connect.CodeUnavailable || attempt == 50 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("Promote: %v", err)
	}
	traceID, err := trace.TraceIDFromHex(resp.Msg.GetTransition().GetTraceId())
	if err != nil {
		t.Fatalf("transition trace_id %q: %v", resp.Msg.GetTransition().GetTraceId(), err)
	}
	var st *spanTree
	waitFor(t, "the operator's Promote spans", 5*time.Second, func() bool {
		st = traceOf(traceID)
		return len(st.named("tenure.v1.PromoterService/Promote")) == 2 && len(st.named("promote")) == 1
	})
	t.Logf("trace %s:\n%s", traceID, st.render())
	if len(st.roots) != 1 || st.spans[st.roots[0]].Name != "tenure.v1.PromoterService/Promote" || st.spans[st.roots[0]].SpanKind != trace.SpanKindClient {
		t.Fatalf("trace %s: want one root, the operator's Promote client span", traceID)
	}
	servers := st.kids(&st.spans[st.roots[0]], "tenure.v1.PromoterService/Promote")
	if len(servers) != 1 || servers[0].SpanKind != trace.SpanKindServer {
		t.Fatalf("the operator's Promote client span has %d Promote children, want 1, the promoter's server span", len(servers))
	}
	promotes := st.kids(servers[0], "promote")
	if len(promotes) != 1 {
		t.Fatalf("the Promote server span has %d promote children, want 1", len(promotes))
	}
	if got := len(st.kids(promotes[0], "adopt")); got != 3 {
		t.Errorf("promote has %d adopt children, want 3", got)
	}
}
