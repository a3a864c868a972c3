package main

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"

	"github.com/tenurelog/tenure/pkg/telemetry"
)

// The story calls a promotion's trace exported only when this process's
// exporter delivered it: with an OTLP endpoint that refuses connections
// it says NOT exported, and why, where it used to say "exported" because
// an endpoint was configured.
func TestTraceNoteSaysWhetherExported(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + ln.Addr().String()
	ln.Close()
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer collector.Close()

	for _, tt := range []struct {
		name, endpoint string
		want           []string
		notWant        string
	}{
		{name: "refused", endpoint: refused, want: []string{"NOT exported", refused, "connection refused"}, notWant: "exported to"},
		{name: "collector listening", endpoint: collector.URL, want: []string{"exported to " + collector.URL, "tenurectl trace"}, notWant: "NOT"},
		{name: "no endpoint", endpoint: "", want: []string{"not exported: set OTEL_EXPORTER_OTLP_ENDPOINT"}, notWant: "exported to"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": tt.endpoint, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "",
				"OTEL_TRACES_EXPORTER": "", "OTEL_SDK_DISABLED": "", "OTEL_EXPORTER_OTLP_TIMEOUT": "5000"} {
				t.Setenv(k, v)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			shutdown, err := telemetry.Setup(ctx, "tenure-dev-test")
			if err != nil {
				t.Fatal(err)
			}
			defer shutdown(ctx)
			_, span := otel.GetTracerProvider().Tracer("test").Start(ctx, "promote")
			span.End()
			id := span.SpanContext().TraceID().String()
			note := traceNote(ctx, id)
			if !strings.HasPrefix(note, id+" (") || strings.Contains(note, tt.notWant) {
				t.Errorf("traceNote() = %q: want the id, then no %q", note, tt.notWant)
			}
			for _, w := range tt.want {
				if !strings.Contains(note, w) {
					t.Errorf("traceNote() = %q: want %q in it", note, w)
				}
			}
		})
	}
}

// The whole demo with an OTLP endpoint that refuses connections: step 6
// must say the promotion's trace was NOT exported, and why.
func TestDevStoryTraceNotExportedWhenRefused(t *testing.T) {
	bin := buildTenure(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + ln.Addr().String()
	ln.Close()
	// startDev passes this process's environment on to tenure dev, and
	// tenure dev to its replicas.
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", refused)
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_SDK_DISABLED", "")
	d := startDev(t, bin, "--records", "1")
	if err := d.wait(t, 90*time.Second); err != nil {
		t.Fatalf("tenure dev: %v\n%s", err, d.output())
	}
	out := d.output()
	line := regexp.MustCompile(`trace id: [0-9a-f]{32} .*`).FindString(out)
	t.Logf("step 6 says: %s", line)
	if !strings.Contains(line, "NOT exported") || !strings.Contains(line, "connection refused") || strings.Contains(line, "exported to") {
		t.Errorf("trace line = %q, want NOT exported with the refused connection\n%s", line, out)
	}
	d.checkCleanedUp(t)
}
