// Package telemetry sets up tracing for a tenure process: an OpenTelemetry
// SDK TracerProvider, W3C trace context propagation, the otelconnect
// interceptor on every Connect handler and client (through
// transport.SetInterceptors), OTLP export when the standard OTEL_*
// environment variables ask for it, and a log/slog handler that stamps log
// records with the trace and span they were logged in.
//
// One promotion is one trace: the promoter's "promote" span, its children
// for the epoch grant, fences, candidate choice, truncations and adoptions,
// the otelconnect client span of each call, and the otelconnect server span
// on the replica or lease service that answered it, linked by the
// traceparent header.
//
// # Configuration
//
// Tracing is configured only by the standard OpenTelemetry environment
// variables, read by Setup and by the SDK and exporters themselves:
//
//   - OTEL_TRACES_EXPORTER: "otlp" or "none". Unset: "otlp" when an OTLP
//     endpoint is set (below), else "none".
//   - OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: where
//     the collector (Jaeger) listens, e.g. http://jaeger:4318 for
//     http/protobuf or http://jaeger:4317 for grpc.
//   - OTEL_EXPORTER_OTLP_PROTOCOL, OTEL_EXPORTER_OTLP_TRACES_PROTOCOL:
//     "http/protobuf" (the default) or "grpc".
//   - OTEL_EXPORTER_OTLP_HEADERS, OTEL_EXPORTER_OTLP_TIMEOUT and the other
//     exporter variables, as the OTLP exporters document them.
//   - OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES: override the service name
//     and attributes a process gives Setup.
//   - OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG: the sampler, replacing
//     tenure's default, Sampler (below).
//   - OTEL_BSP_*: the batch span processor's queue and delay.
//   - OTEL_SDK_DISABLED=true: no SDK at all; spans are no-ops and transition
//     records carry no trace id.
//
// # What is traced
//
// Sampler, the default, samples every span whose parent is sampled, and of
// spans that start a trace, those tenure's own code starts ("promote") and
// the calls an operator makes to the promoter (tenure.v1.PromoterService).
// It drops the other Connect calls that start a trace: the promoter's
// probes (ten a second per replica), followers' fetches, lease keep-alives
// and watches, and clients' appends and reads. Traced, those would be
// thousands of one-span traces a minute that evict the promotions from
// Jaeger's store and cost CPU on the data path. A client that wants its
// append traced sends a sampled traceparent, and the parent-based rule
// honours it.
//
// # Cost without an exporter
//
// With no exporter configured, Setup still installs an SDK TracerProvider
// with Sampler but no span processor. Sampled spans are then recorded in
// memory and dropped when they end: no queue, no network. This is
// deliberate: the transition record and the logs carry a trace id, and an
// id is only worth printing if it is real, that is, shared by every process
// a promotion touched, which takes a sampled span context propagated over
// every call. A promotion records a few dozen spans; the steady-state calls
// (probes, fetches, appends) are not sampled, and an unsampled span costs
// an id and a context, not a recording. OTEL_SDK_DISABLED=true removes even
// that.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"connectrpc.com/otelconnect"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/tenurelog/tenure/pkg/transport"
)

// Exporter is the trace exporter the environment selects.
type Exporter struct {
	// Kind is "otlp" or "none".
	Kind string
	// Protocol is the OTLP protocol, "http/protobuf" or "grpc"; empty for
	// "none".
	Protocol string
	// Endpoint is the OTLP endpoint as configured, for logging; empty means
	// the exporter's default (localhost).
	Endpoint string
}

func (e Exporter) String() string {
	if e.Kind != "otlp" {
		return e.Kind
	}
	endpoint := e.Endpoint
	if endpoint == "" {
		endpoint = "default endpoint"
	}
	return fmt.Sprintf("otlp %s to %s", e.Protocol, endpoint)
}

// ExporterFromEnv decides, from the OTEL_* variables getenv returns, which
// exporter Setup uses. An unset OTEL_TRACES_EXPORTER means OTLP only when an
// endpoint is set: the OpenTelemetry default ("otlp" to localhost) would
// make every process without a collector retry a dead port forever.
func ExporterFromEnv(getenv func(string) string) (Exporter, error) {
	endpoint := firstNonEmpty(getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), getenv("OTEL_EXPORTER_OTLP_ENDPOINT"))
	kind := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER"))
	switch kind {
	case "":
		if endpoint == "" {
			return Exporter{Kind: "none"}, nil
		}
		kind = "otlp"
	case "otlp", "none":
	default:
		// Lists ("otlp,console") and other exporters are not supported;
		// a typo must not silently turn tracing off.
		return Exporter{}, fmt.Errorf("telemetry: OTEL_TRACES_EXPORTER=%q: want otlp or none", kind)
	}
	if kind == "none" {
		return Exporter{Kind: "none"}, nil
	}
	protocol := firstNonEmpty(getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), getenv("OTEL_EXPORTER_OTLP_PROTOCOL"), "http/protobuf")
	if protocol != "http/protobuf" && protocol != "grpc" {
		return Exporter{}, fmt.Errorf("telemetry: OTLP protocol %q: want http/protobuf or grpc", protocol)
	}
	return Exporter{Kind: "otlp", Protocol: protocol, Endpoint: endpoint}, nil
}

func firstNonEmpty(values ...string) string {
	for _, v := range values {
		if v = strings.TrimSpace(v); v != "" {
			return v
		}
	}
	return ""
}

// Disabled reports whether OTEL_SDK_DISABLED=true turns the SDK off.
func Disabled(getenv func(string) string) bool {
	return strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true")
}

// Setup configures tracing for this process from the environment (see the
// package documentation) and installs it: the global TracerProvider and
// propagator, and the otelconnect interceptor on every tenure handler and
// client. serviceName (e.g. "tenure-replica") and attrs (e.g. the
// service.instance.id) describe the process; OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES override them.
//
// Call it once, early in main. Handlers and clients built before it are
// traced too (transport looks interceptors up per call), and tracers taken
// from otel.Tracer before it delegate to it; only spans started before it
// are lost.
//
// shutdown flushes buffered spans (bounded by its context) and stops the
// exporter; call it when the process stops. ExporterFromEnv tells what
// Setup configured, for the start-up log line; Flush tells whether a
// trace's spans actually reached the collector.
func Setup(ctx context.Context, serviceName string, attrs ...attribute.KeyValue) (shutdown func(context.Context) error, err error) {
	noop := func(context.Context) error { return nil }
	current.Store(nil) // until this Setup installs an exporter, Flush has none
	if Disabled(os.Getenv) {
		return noop, nil
	}
	exporter, err := ExporterFromEnv(os.Getenv)
	if err != nil {
		return noop, err
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(append([]attribute.KeyValue{semconv.ServiceName(serviceName)}, attrs...)...),
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		resource.WithFromEnv(), // last: the environment overrides
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return noop, fmt.Errorf("telemetry: resource: %w", err)
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER")) == "" {
		// Set, the SDK reads it itself.
		opts = append(opts, sdktrace.WithSampler(Sampler()))
	}
	var tracked *trackedExporter
	if exporter.Kind == "otlp" {
		var exp sdktrace.SpanExporter
		// The exporters read their endpoint, headers, timeout and TLS
		// settings from the same OTEL_EXPORTER_OTLP_* variables, and
		// connect lazily: a collector that is down costs dropped spans,
		// never a failed start.
		if exporter.Protocol == "grpc" {
			exp, err = otlptracegrpc.New(ctx)
		} else {
			exp, err = otlptracehttp.New(ctx)
		}
		if err != nil {
			return noop, fmt.Errorf("telemetry: %s exporter: %w", exporter, err)
		}
		// Tracked, so Flush can say whether a trace reached the collector.
		tracked = newTrackedExporter(exp)
		opts = append(opts, sdktrace.WithBatcher(tracked))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	if err := Install(tp); err != nil {
		_ = tp.Shutdown(ctx)
		return noop, err
	}
	current.Store(&installed{tp: tp, exp: tracked})
	return tp.Shutdown, nil
}

// Sampler is the sampler tenure processes use unless OTEL_TRACES_SAMPLER
// says otherwise: a span with a parent follows its parent's decision; a span
// that starts a trace is sampled unless it is a Connect call (client or
// server span, named for its procedure) outside tenure.v1.PromoterService.
// See the package documentation for why.
func Sampler() sdktrace.Sampler {
	return sdktrace.ParentBased(rootSampler{})
}

// operatorServicePrefix names the procedures whose calls start a trace
// worth keeping: an operator's planned promotion arrives as
// tenure.v1.PromoterService/Promote, and the promotion's spans are its
// children.
const operatorServicePrefix = "tenure.v1.PromoterService/"

type rootSampler struct{}

func (rootSampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	decision := sdktrace.RecordAndSample
	if (p.Kind == trace.SpanKindClient || p.Kind == trace.SpanKindServer) && !strings.HasPrefix(p.Name, operatorServicePrefix) {
		decision = sdktrace.Drop
	}
	return sdktrace.SamplingResult{Decision: decision, Tracestate: trace.SpanContextFromContext(p.ParentContext).TraceState()}
}

func (rootSampler) Description() string { return "TenureRoots" }

// Propagator is the propagator every tenure process uses: W3C trace context
// (the traceparent header) and baggage.
var Propagator propagation.TextMapPropagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Install makes tp the process's TracerProvider and Propagator its
// propagator, and installs the otelconnect interceptor built on them on
// every tenure handler and client. Setup calls it; tests call it with a
// TracerProvider that records to memory.
//
// The OpenTelemetry globals delegate to the first TracerProvider installed:
// tracers taken from otel.Tracer before any Install keep using that first
// one. A test process should therefore Install once.
func Install(tp trace.TracerProvider) error {
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(Propagator)
	ic, err := otelconnect.NewInterceptor(
		otelconnect.WithTracerProvider(tp),
		otelconnect.WithPropagator(Propagator),
		// Server spans are children of the caller's client span. By
		// default otelconnect starts a new trace per incoming call and only
		// links the caller's, which would cut a promotion into one trace
		// per hop. Every caller of a tenure service is part of the
		// cluster (or an operator's tenurectl): the remote span is trusted.
		otelconnect.WithTrustRemote(),
		// Traces only; metrics are not exported by tenure yet, and
		// recording RPC histograms into a no-op meter on every fetch and
		// append would be pure overhead.
		otelconnect.WithoutMetrics(),
	)
	if err != nil {
		return fmt.Errorf("telemetry: otelconnect interceptor: %w", err)
	}
	transport.SetInterceptors(ic)
	return nil
}
