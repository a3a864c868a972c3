package main

import (
	"flag"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tenurelog/tenure/internal/metrics"
)

// metricsHelp is the servers' --help paragraph about the metrics listener.
const metricsHelp = `
Prometheus metrics are served at http://<--metrics-listen>/metrics, plaintext
and read-only, on a listener of their own (the RPC port is mutual TLS, and a
scraper has no client certificate). The default, 127.0.0.1:0, is a free
loopback port, named in the log and in the ready line's "metrics" field;
deployments set a fixed one (compose: 0.0.0.0:9090). README "Metrics" lists
every series.
`

// metricsListenFlag defines --metrics-listen on a server's flag set.
func metricsListenFlag(fs *flag.FlagSet) *string {
	return fs.String("metrics-listen", "127.0.0.1:0", "address to serve Prometheus metrics on, plaintext, at /metrics (port 0: a free port, named in the ready line; \"off\": none). A non-loopback address exposes read-only metrics to anyone who reaches it")
}

// serveMetrics serves reg on addr; nil, nil for "off" or "".
func serveMetrics(addr string, reg *prometheus.Registry, log *slog.Logger) (*metrics.Server, error) {
	if addr == "" || addr == "off" {
		return nil, nil
	}
	return metrics.Serve(addr, reg, log)
}

// metricsURL is srv's URL, "" without one.
func metricsURL(srv *metrics.Server) string {
	if srv == nil {
		return ""
	}
	return srv.URL()
}

// closeMetrics stops srv, if any.
func closeMetrics(srv *metrics.Server) {
	if srv != nil {
		_ = srv.Close()
	}
}
