package telemetry_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/tenurelog/tenure/internal/testnet"
	"github.com/tenurelog/tenure/pkg/telemetry"
)

func TestExporterFromEnv(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		want    telemetry.Exporter
		wantErr string
	}{
		{name: "nothing set: no exporter", want: telemetry.Exporter{Kind: "none"}},
		{name: "endpoint: otlp over http",
			env:  map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4318"},
			want: telemetry.Exporter{Kind: "otlp", Protocol: "http/protobuf", Endpoint: "http://jaeger:4318"}},
		{name: "traces endpoint wins",
			env:  map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:4318/v1/traces"},
			want: telemetry.Exporter{Kind: "otlp", Protocol: "http/protobuf", Endpoint: "http://b:4318/v1/traces"}},
		{name: "grpc",
			env:  map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
			want: telemetry.Exporter{Kind: "otlp", Protocol: "grpc", Endpoint: "http://jaeger:4317"}},
		{name: "traces protocol wins",
			env:  map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"},
			want: telemetry.Exporter{Kind: "otlp", Protocol: "grpc", Endpoint: "http://jaeger:4317"}},
		{name: "explicit otlp without endpoint: the exporter's default",
			env:  map[string]string{"OTEL_TRACES_EXPORTER": "otlp"},
			want: telemetry.Exporter{Kind: "otlp", Protocol: "http/protobuf"}},
		{name: "none wins over an endpoint",
			env:  map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4318"},
			want: telemetry.Exporter{Kind: "none"}},
		{name: "unknown exporter is an error, not silence",
			env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, wantErr: `OTEL_TRACES_EXPORTER="zipkin"`},
		{name: "unknown protocol",
			env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, wantErr: `"http/json"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := telemetry.ExporterFromEnv(func(k string) string { return tt.env[k] })
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ExporterFromEnv() = %v, %v; want error containing %s", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ExporterFromEnv() = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

// collector is an OTLP/HTTP trace endpoint on loopback that keeps what it
// is sent.
type collector struct {
	mu   sync.Mutex
	reqs []*collectortrace.ExportTraceServiceRequest
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if r.URL.Path != "/v1/traces" || err != nil {
		http.Error(w, "unexpected", http.StatusNotFound)
		return
	}
	var req collectortrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	c.reqs = append(c.reqs, &req)
	c.mu.Unlock()
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

// With only OTEL_EXPORTER_OTLP_ENDPOINT set, Setup exports spans over
// OTLP/HTTP, with the service name and instance the process gave, and
// shutdown flushes them.
func TestSetupExportsToOTLPEndpoint(t *testing.T) {
	col := &collector{}
	srv := httptest.NewServer(col)
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_SERVICE_NAME", "")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "")
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	shutdown, err := telemetry.Setup(context.Background(), "tenure-test", semconv.ServiceInstanceID("r7"))
	if err != nil {
		t.Fatal(err)
	}
	_, span := otel.GetTracerProvider().Tracer("test").Start(context.Background(), "exported")
	span.SetAttributes(attribute.String("tenure.replica", "r7"))
	traceID := span.SpanContext().TraceID()
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}

	col.mu.Lock()
	defer col.mu.Unlock()
	var found bool
	for _, req := range col.reqs {
		for _, rs := range req.GetResourceSpans() {
			res := map[string]string{}
			for _, kv := range rs.GetResource().GetAttributes() {
				res[kv.GetKey()] = kv.GetValue().GetStringValue()
			}
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					if s.GetName() != "exported" {
						continue
					}
					found = true
					if string(s.GetTraceId()) != string(traceID[:]) {
						t.Errorf("exported trace id %x, want %s", s.GetTraceId(), traceID)
					}
					if res["service.name"] != "tenure-test" || res["service.instance.id"] != "r7" {
						t.Errorf("resource = %v, want service.name tenure-test, service.instance.id r7", res)
					}
				}
			}
		}
	}
	if !found {
		t.Fatalf("collector got %d requests and no span named \"exported\"", len(col.reqs))
	}
}

// With no exporter configured, spans still get real, sampled trace ids:
// the transition record and the logs print them.
func TestSetupWithoutExporterStillHasTraceIDs(t *testing.T) {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED", "OTEL_TRACES_SAMPLER"} {
		t.Setenv(k, "")
	}
	shutdown, err := telemetry.Setup(context.Background(), "tenure-test")
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(context.Background())
	_, span := otel.GetTracerProvider().Tracer("test").Start(context.Background(), "local")
	defer span.End()
	if sc := span.SpanContext(); !sc.HasTraceID() || !sc.IsSampled() {
		t.Fatalf("span context %+v: want a sampled trace id", sc)
	}
}

func TestSetupRejectsBadConfig(t *testing.T) {
	t.Setenv("OTEL_SDK_DISABLED", "")
	t.Setenv("OTEL_TRACES_EXPORTER", "jaeger")
	if _, err := telemetry.Setup(context.Background(), "tenure-test"); err == nil {
		t.Fatal("Setup with OTEL_TRACES_EXPORTER=jaeger succeeded, want an error")
	}
}

// Sampler keeps what a promotion is made of and drops the steady-state
// calls that would otherwise flood the trace store.
func TestSampler(t *testing.T) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(telemetry.Sampler()))
	tr := tp.Tracer("test")
	ctx := context.Background()
	sampledParent, parent := tr.Start(ctx, "promote")
	defer parent.End()
	unsampledParent, probe := tr.Start(ctx, "tenure.v1.ReplicaService/GetStatus", trace.WithSpanKind(trace.SpanKindClient))
	defer probe.End()
	remote := trace.ContextWithRemoteSpanContext(ctx, parent.SpanContext())

	tests := []struct {
		name   string
		ctx    context.Context
		span   string
		kind   trace.SpanKind
		wanted bool
	}{
		{"tenure's own root span", ctx, "promote", trace.SpanKindInternal, true},
		{"probe", ctx, "tenure.v1.ReplicaService/GetStatus", trace.SpanKindClient, false},
		{"follower fetch", ctx, "tenure.v1.ReplicaService/Fetch", trace.SpanKindClient, false},
		{"follower fetch stream", ctx, "tenure.v1.ReplicaService/FetchStream", trace.SpanKindClient, false},
		{"follower fetch session", ctx, "tenure.v1.ReplicaService/FetchSession", trace.SpanKindClient, false},
		{"a producer's append stream", ctx, "tenure.v1.LogService/AppendStream", trace.SpanKindServer, false},
		{"client append arriving untraced", ctx, "tenure.v1.LogService/Append", trace.SpanKindServer, false},
		{"lease keep-alive", ctx, "tenure.v1.LeaseService/KeepAlive", trace.SpanKindClient, false},
		{"operator's promote", ctx, "tenure.v1.PromoterService/Promote", trace.SpanKindServer, true},
		{"a promotion's fence call", sampledParent, "tenure.v1.ReplicaService/Fence", trace.SpanKindClient, true},
		{"the replica's side of it", remote, "tenure.v1.ReplicaService/Fence", trace.SpanKindServer, true},
		{"under a dropped probe", unsampledParent, "anything", trace.SpanKindInternal, false},
	}
	if probe.SpanContext().IsSampled() || !parent.SpanContext().IsSampled() {
		t.Fatalf("setup: probe sampled %v, promote sampled %v", probe.SpanContext().IsSampled(), parent.SpanContext().IsSampled())
	}
	for _, tt := range tests {
		_, s := tr.Start(tt.ctx, tt.span, trace.WithSpanKind(tt.kind))
		if got := s.SpanContext().IsSampled(); got != tt.wanted {
			t.Errorf("%s: %s (%s) sampled = %v, want %v", tt.name, tt.span, tt.kind, got, tt.wanted)
		}
		s.End()
	}
}

// setupOTLP runs Setup with OTLP/HTTP export to endpoint and returns a
// trace of one ended span.
func setupOTLP(t *testing.T, endpoint string) trace.TraceID {
	t.Helper()
	for k, v := range map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "",
		"OTEL_TRACES_EXPORTER": "", "OTEL_SDK_DISABLED": "", "OTEL_EXPORTER_OTLP_TIMEOUT": "5000"} {
		t.Setenv(k, v)
	}
	shutdown, err := telemetry.Setup(context.Background(), "tenure-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = shutdown(ctx)
	})
	_, span := otel.GetTracerProvider().Tracer("test").Start(context.Background(), "promote")
	span.End()
	return span.SpanContext().TraceID()
}

// Flush says a trace was exported only when the collector took it: with
// an endpoint that refuses connections, its spans are counted as failed
// with the exporter's error, never as exported.
func TestFlushReportsWhatTheExporterDid(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	t.Run("collector listening", func(t *testing.T) {
		srv := httptest.NewServer(&collector{})
		defer srv.Close()
		id := setupOTLP(t, srv.URL)
		got, err := telemetry.Flush(ctx, id)
		if err != nil || got.Exported != 1 || got.Failed != 0 {
			t.Fatalf("Flush() = %+v, %v; want 1 span exported, none failed", got, err)
		}
	})
	t.Run("connection refused", func(t *testing.T) {
		id := setupOTLP(t, "http://"+testnet.ClosedAddr(t))
		got, err := telemetry.Flush(ctx, id)
		if got.Exported != 0 || got.Failed != 1 || got.Err == nil || !strings.Contains(got.Err.Error(), "connection refused") {
			t.Fatalf("Flush() = %+v, %v; want the span failed with the refused connection, none exported", got, err)
		}
		if err == nil {
			t.Errorf("Flush() error is nil: the flush that failed must say so")
		}
	})
	t.Run("no exporter", func(t *testing.T) {
		id := setupOTLP(t, "")
		if got, err := telemetry.Flush(ctx, id); !errors.Is(err, telemetry.ErrNoExporter) {
			t.Fatalf("Flush() = %+v, %v; want ErrNoExporter", got, err)
		}
	})
}
