package telemetry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/tenurelog/tenure/pkg/telemetry"
)

func spanContext(t *testing.T) (context.Context, trace.SpanContext) {
	t.Helper()
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
	return trace.ContextWithSpanContext(context.Background(), sc), sc
}

func TestLogHandlerAddsTraceAndSpanID(t *testing.T) {
	ctx, _ := spanContext(t)
	var buf bytes.Buffer
	log := slog.New(telemetry.LogHandler(slog.NewJSONHandler(&buf, nil))).With("range", "orders")
	log.InfoContext(ctx, "promoted", "epoch", 4)
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("log line %q: %v", buf.String(), err)
	}
	want := map[string]any{"msg": "promoted", "range": "orders", "epoch": float64(4),
		"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7"}
	for k, v := range want {
		if rec[k] != v {
			t.Errorf("log record %s = %v, want %v (line %s)", k, rec[k], v, buf.String())
		}
	}
}

func TestLogHandlerText(t *testing.T) {
	ctx, _ := spanContext(t)
	var buf bytes.Buffer
	slog.New(telemetry.LogHandler(slog.NewTextHandler(&buf, nil))).WarnContext(ctx, "fence failed")
	if got := buf.String(); !strings.Contains(got, " trace_id=4bf92f3577b34da6a3ce929d0e0e4736 span_id=00f067aa0ba902b7") {
		t.Errorf("text log line %q has no trace_id and span_id", got)
	}
}

func TestLogHandlerWithoutSpanAddsNothing(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(telemetry.LogHandler(slog.NewTextHandler(&buf, nil)))
	log.Info("no context")
	log.InfoContext(context.Background(), "context without span")
	if strings.Contains(buf.String(), "trace_id") || strings.Contains(buf.String(), "span_id") {
		t.Errorf("logs without a span carry ids: %q", buf.String())
	}
}

// The wrapper survives WithGroup: the ids are still added (inside the group).
func TestLogHandlerWithGroup(t *testing.T) {
	ctx, _ := spanContext(t)
	var buf bytes.Buffer
	slog.New(telemetry.LogHandler(slog.NewTextHandler(&buf, nil))).WithGroup("promoter").InfoContext(ctx, "x")
	if got := buf.String(); !strings.Contains(got, "promoter.trace_id=4bf92f3577b34da6a3ce929d0e0e4736") {
		t.Errorf("grouped log line %q has no promoter.trace_id", got)
	}
}
