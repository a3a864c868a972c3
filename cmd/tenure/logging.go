package main

import (
	"fmt"
	"log/slog"
	"os"

	"go.uber.org/zap"
)

// newLogger builds the process logger (log/slog), text or JSON on stderr.
func newLogger(format string) (*slog.Logger, error) {
	var h slog.Handler
	switch format {
	case "text", "":
		h = slog.NewTextHandler(os.Stderr, nil)
	case "json":
		h = slog.NewJSONHandler(os.Stderr, nil)
	default:
		return nil, fmt.Errorf("--log-format %q: want text or json", format)
	}
	l := slog.New(h)
	slog.SetDefault(l)
	return l, nil
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
