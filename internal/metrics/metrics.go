// Package metrics serves a process's Prometheus metrics on a listener of
// its own, and reads them back (Scrape) for tests and the compose smoke.
//
// The series are made with prometheus/client_golang, not the OTel metrics
// SDK: operators alert on exact names (Kafka's UnderReplicatedPartitions
// becomes tenure_replica_under_replicated_ranges), and client_golang
// exports a name exactly as written, where the OTel exporter adds unit and
// _total suffixes of its own. Each service registers its series on the
// Registerer it is given (services/*/metrics.go); the gauges that describe
// state (roles, lag, HWM) are read at scrape time by a Collector, so the
// hot paths pay only for the counters and histograms, which are atomic
// adds without allocation.
//
// The listener is separate from the service's RPC port, like etcd's
// --listen-metrics-urls: the RPC ports are mutual TLS, and a Prometheus
// scraper usually has no client certificate. It is plaintext and
// read-only: /metrics and nothing else.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tenurelog/tenure/internal/version"
)

// Namespace prefixes every tenure series.
const Namespace = "tenure"

// RangeSeriesMax bounds the ranges a process exports per-range series for
// (the first ones by range id). Beyond it only the aggregates are exported:
// a replica hosting 10,000 ranges would otherwise export ~50,000 series
// per scrape, more than a Prometheus server should be asked to keep per
// target. 128 covers a small cluster's every range; a large one alerts on
// the aggregates and reads one range with tenurectl status.
const RangeSeriesMax = 128

// LatencyBuckets are the histogram buckets of every duration series, in
// seconds: etcd's WAL fsync buckets (1ms doubling to 4.096s) with 100µs,
// 250µs and 500µs below them, where a local fsync or an append on a fast
// disk lands.
var LatencyBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096}

// NewRegistry returns a registry holding the Go runtime's and the process's
// series (go_*, process_*) and tenure_build_info{service,version}.
func NewRegistry(service string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "build_info",
		Help:        "Always 1; its labels name the service and the build.",
		ConstLabels: prometheus.Labels{"service": service, "version": version.String()},
	})
	build.Set(1)
	reg.MustRegister(build)
	return reg
}

// Server is a running metrics listener.
type Server struct {
	srv *http.Server
	ln  net.Listener
}

// Serve serves reg's metrics at http://addr/metrics until Close. addr may
// name port 0; URL says which port was bound.
func Serve(addr string, reg *prometheus.Registry, log *slog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %s: %w", addr, err)
	}
	return ServeListener(ln, reg, log), nil
}

// ServeListener serves reg's metrics at /metrics on ln until Close.
func ServeListener(ln net.Listener, reg *prometheus.Registry, log *slog.Logger) *Server {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		// A collector that fails (a store closing under the scrape) costs
		// its own series, not the whole scrape.
		ErrorHandling: promhttp.ContinueOnError,
		// Bounds a scrape's work: a scrape is cheap, and more than a few
		// at once is a misconfigured scraper.
		MaxRequestsInFlight: 4,
		Timeout:             10 * time.Second,
	}))
	s := &Server{ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics: serve", "addr", ln.Addr().String(), "err", err)
		}
	}()
	return s
}

// URL is the metrics URL: http://host:port/metrics, a wildcard host shown
// as 127.0.0.1.
func (s *Server) URL() string {
	host, port, _ := net.SplitHostPort(s.ln.Addr().String())
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/metrics"
}

// Close stops serving; a scrape in progress gets a second to end.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return s.srv.Shutdown(ctx)
}
