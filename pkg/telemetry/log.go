package telemetry

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/trace"
)

// Log attribute keys for the trace a record was logged in: the same ids
// Jaeger, the transition record and tenurectl show, in the same hex.
const (
	TraceIDKey = "trace_id"
	SpanIDKey  = "span_id"
)

// LogHandler wraps h so that a record logged with a context that holds a
// valid span (log.InfoContext(ctx, ...)) carries trace_id and span_id: from
// a log line one finds the promotion's trace, and from a span its logs.
// Records logged without such a context pass through unchanged, at the cost
// of one context lookup.
//
// The ids are added like any attribute of the record, so under a
// logger.WithGroup they land inside that group.
func LogHandler(h slog.Handler) slog.Handler {
	return logHandler{h}
}

type logHandler struct {
	slog.Handler
}

func (l logHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		// Clone: the record's attribute storage may be shared with the
		// caller's copy, and adding to it must not show up there.
		r = r.Clone()
		r.AddAttrs(slog.String(TraceIDKey, sc.TraceID().String()), slog.String(SpanIDKey, sc.SpanID().String()))
	}
	return l.Handler.Handle(ctx, r)
}

func (l logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return logHandler{l.Handler.WithAttrs(attrs)}
}

func (l logHandler) WithGroup(name string) slog.Handler {
	return logHandler{l.Handler.WithGroup(name)}
}
