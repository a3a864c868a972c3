package telemetry

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// ErrNoExporter is Flush's answer in a process whose Setup configured no
// exporter: its spans go nowhere.
var ErrNoExporter = errors.New("telemetry: no trace exporter configured")

// TraceExport is what this process's exporter did with one trace's spans.
type TraceExport struct {
	// Exported is how many spans the collector accepted.
	Exported int
	// Failed is how many spans the exporter could not deliver, and Err
	// the last reason (nil when none failed).
	Failed int
	Err    error
}

// maxTrackedTraces bounds the traces an exporter remembers: the oldest is
// forgotten first. A process asks about a trace moments after it ended.
const maxTrackedTraces = 1024

// trackedExporter remembers, per trace, what its exporter did. An OTLP
// exporter configured for an endpoint nobody listens on drops every span,
// and the SDK reports that only to its global error handler: without this,
// "an exporter is configured" is all a process could say, and it used to
// say "exported" on that alone.
type trackedExporter struct {
	sdktrace.SpanExporter

	mu     sync.Mutex
	traces map[trace.TraceID]*TraceExport
	order  []trace.TraceID // oldest first; at most maxTrackedTraces
}

func newTrackedExporter(exp sdktrace.SpanExporter) *trackedExporter {
	return &trackedExporter{SpanExporter: exp, traces: map[trace.TraceID]*TraceExport{}}
}

func (e *trackedExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := e.SpanExporter.ExportSpans(ctx, spans)
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range spans {
		id := s.SpanContext().TraceID()
		te := e.traces[id]
		if te == nil {
			if len(e.order) == maxTrackedTraces {
				delete(e.traces, e.order[0])
				e.order = e.order[1:]
			}
			te = &TraceExport{}
			e.traces[id] = te
			e.order = append(e.order, id)
		}
		if err != nil {
			te.Failed++
			te.Err = err
		} else {
			te.Exported++
		}
	}
	return err
}

func (e *trackedExporter) trace(id trace.TraceID) TraceExport {
	e.mu.Lock()
	defer e.mu.Unlock()
	if te := e.traces[id]; te != nil {
		return *te
	}
	return TraceExport{}
}

// installed is what the last Setup configured, for Flush.
type installed struct {
	tp  *sdktrace.TracerProvider
	exp *trackedExporter // nil: no exporter
}

var current atomic.Pointer[installed]

// Flush hands every span this process has ended to the exporter, waits
// for it (bounded by ctx), and reports what the exporter did with the
// spans of traceID that this process recorded. A zero TraceExport means
// none of them has ended here yet. The error is ErrNoExporter when Setup
// configured none, or the flush's own failure (ctx ended, the exporter
// failed on this batch); a trace is exported only if Exported > 0,
// Failed == 0 and the error is nil.
func Flush(ctx context.Context, traceID trace.TraceID) (TraceExport, error) {
	in := current.Load()
	if in == nil || in.exp == nil {
		return TraceExport{}, ErrNoExporter
	}
	err := in.tp.ForceFlush(ctx)
	return in.exp.trace(traceID), err
}
