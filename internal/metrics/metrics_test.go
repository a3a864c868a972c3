package metrics_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tenurelog/tenure/internal/metrics"
)

// A registry served on a real listener reads back through Scrape: the
// process's own series, a labelled counter as it moves, a histogram's
// count and sum, and the RPC interceptor's series for a call that failed.
func TestServeAndScrape(t *testing.T) {
	reg := metrics.NewRegistry("test")
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tenure_test_events_total", Help: "x"}, []string{"kind", "b"})
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tenure_test_duration_seconds", Help: "x", Buckets: metrics.LatencyBuckets})
	reg.MustRegister(c, h)
	rpc, err := metrics.NewRPC(reg)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := metrics.Serve("127.0.0.1:0", reg, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()

	scrape := func() metrics.Samples {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := metrics.Scrape(ctx, http.DefaultClient, srv.URL())
		if err != nil {
			t.Fatalf("Scrape(%s) = %v", srv.URL(), err)
		}
		return s
	}
	s := scrape()
	if v, ok := s.Get("tenure_build_info"); ok {
		t.Errorf("tenure_build_info exported without labels: %v", v)
	}
	if n := s.Sum("tenure_build_info"); n != 1 {
		t.Errorf("Sum(tenure_build_info) = %v, want 1", n)
	}
	if _, ok := s.Get("process_open_fds"); !ok {
		t.Errorf("no process series")
	}

	c.WithLabelValues("x", "y").Add(3)
	h.Observe(0.003)
	h.Observe(0.5)
	unary := rpc.WrapUnary(func(context.Context, connect.AnyRequest) (connect.AnyResponse, error) {
		return nil, connect.NewError(connect.CodeFailedPrecondition, nil)
	})
	req := connect.NewRequest(&struct{}{})
	_, _ = unary(context.Background(), req)

	s = scrape()
	for series, want := range map[string]float64{
		// Labels come sorted by name, whatever the declared order.
		`tenure_test_events_total{b="y",kind="x"}`:                                 3,
		`tenure_test_duration_seconds_count`:                                       2,
		`tenure_test_duration_seconds_bucket{le="0.004"}`:                          1,
		`tenure_test_duration_seconds_bucket{le="+Inf"}`:                           2,
		`tenure_rpc_server_handled_total{code="failed_precondition",procedure=""}`: 1,
	} {
		if got, ok := s.Get(series); !ok || got != want {
			t.Errorf("%s = %v (exported %v), want %v", series, got, ok, want)
		}
	}
	if got := s.Sum("tenure_test_duration_seconds_sum"); got < 0.5 || got > 0.51 {
		t.Errorf("histogram sum = %v, want 0.503", got)
	}
}

// Parse reads the text format and refuses a line without a value.
func TestParse(t *testing.T) {
	s, err := metrics.Parse(stringsReader("# HELP a x\n# TYPE a gauge\na 1.5\nb{x=\"1 2\"} 2\n\n"))
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := s.Get("a"); v != 1.5 {
		t.Errorf("a = %v, want 1.5", v)
	}
	if v, _ := s.Get(`b{x="1 2"}`); v != 2 {
		t.Errorf(`b{x="1 2"} = %v, want 2 (a label value with a space)`, v)
	}
	if _, err := metrics.Parse(stringsReader("novalue\n")); err == nil {
		t.Errorf("Parse(a line without a value) = nil error")
	}
}

func stringsReader(s string) *strings.Reader { return strings.NewReader(s) }
