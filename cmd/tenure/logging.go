package main

import (
	"context"
	"log"
	"log/slog"
	"os"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.uber.org/zap"

	"github.com/tenurelog/tenure/pkg/telemetry"
)

// newLogger builds the process logger (log/slog), text or JSON on stderr.
// Records logged with a context inside a span (log.InfoContext(ctx, ...))
// carry trace_id and span_id.
func newLogger(format string) (*slog.Logger, error) {
	var h slog.Handler
	switch format {
	case "text", "":
		h = slog.NewTextHandler(os.Stderr, nil)
	case "json":
		h = slog.NewJSONHandler(os.Stderr, nil)
	default:
		return nil, usagef("--log-format %q: want text or json", format)
	}
	l := slog.New(telemetry.LogHandler(h))
	slog.SetDefault(l)
	return l, nil
}

// useDefaultLogger makes l the process's default slog logger, which also
// takes the log package's output (slog.SetDefault), and returns what puts
// both back as they were.
func useDefaultLogger(l *slog.Logger) (restore func()) {
	prev, out, flags := slog.Default(), log.Writer(), log.Flags()
	slog.SetDefault(l)
	return func() {
		slog.SetDefault(prev)
		// SetDefault of a logger on the log package's own handler leaves
		// the log package's output alone: set it back by hand.
		log.SetOutput(out)
		log.SetFlags(flags)
	}
}

// tracingFlushTimeout bounds how long a stopping process waits to hand its
// last spans to the collector; a collector that is down must not hold up
// a shutdown.
const tracingFlushTimeout = 3 * time.Second

// startTracing sets up tracing for this process (telemetry.Setup: the
// OTEL_* environment variables choose the exporter; with none set, spans
// get real trace ids but are not exported) and logs what it configured.
// service names the process kind ("tenure-replica"); attrs identify the
// instance (semconv.ServiceInstanceID). Every server command calls it
// once, right after newLogger; a command running several services in one
// process (dev) calls it once for all of them. stop flushes buffered spans,
// bounded by tracingFlushTimeout: defer it.
func startTracing(ctx context.Context, log *slog.Logger, service string, attrs ...attribute.KeyValue) (stop func(), err error) {
	exporter, err := telemetry.ExporterFromEnv(os.Getenv)
	if err != nil {
		return nil, err
	}
	shutdown, err := telemetry.Setup(ctx, service, attrs...)
	if err != nil {
		return nil, err
	}
	if telemetry.Disabled(os.Getenv) {
		log.Info("tracing disabled (OTEL_SDK_DISABLED)")
	} else {
		if v := os.Getenv("OTEL_SERVICE_NAME"); v != "" {
			service = v // what Setup's resource says too
		}
		log.Info("tracing", "service", service, "exporter", exporter.String())
	}
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tracingFlushTimeout)
		defer cancel()
		if err := shutdown(sctx); err != nil {
			log.Warn("tracing: spans not flushed", "err", err)
		}
	}, nil
}

// quietEtcdLogger keeps the etcd client's own zap logging to errors only.
func quietEtcdLogger() *zap.Logger {
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(zap.ErrorLevel)
	l, err := cfg.Build()
	if err != nil {
		return zap.NewNop()
	}
	return l
}
