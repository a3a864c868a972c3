package promoter

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/internal/metrics"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// scrape reads url's metrics over HTTP, failing the test on error.
func scrape(t *testing.T, url string) metrics.Samples {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := metrics.Scrape(ctx, http.DefaultClient, url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	return s
}

// want fails unless series has value v in s.
func want(t *testing.T, who string, s metrics.Samples, series string, v float64) {
	t.Helper()
	got, ok := s.Get(series)
	if !ok || got != v {
		t.Errorf("%s: %s = %v (exported %v), want %v", who, series, got, ok, v)
	}
}

// atLeast fails unless series is at least v in s: counts a loaded machine
// may raise with a retry (a promotion's second attempt, an append sent again).
func atLeast(t *testing.T, who string, s metrics.Samples, series string, v float64) {
	t.Helper()
	if got, ok := s.Get(series); !ok || got < v {
		t.Errorf("%s: %s = %v (exported %v), want at least %v", who, series, got, ok, v)
	}
}

// waitSeries scrapes url until series has value v (bounded).
func waitSeries(t *testing.T, who, url, series string, v float64, within time.Duration) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%s: %s to be %v", who, series, v), within, func() bool {
		got, ok := scrape(t, url).Get(series)
		return ok && got == v
	})
}

// A failover as the metrics show it, every series read over HTTP from the
// servers' own listeners: roles, HWM and log end, lag and under-replication
// on the leader, promotions by outcome and reason with their step
// histograms on the promoter, a stale fence refused, and under-replication
// rising when the leader dies (its successor's follower is gone) and
// falling once it is back and caught up.
func TestMetricsFollowAFailover(t *testing.T) {
	c := startCluster(t, &cluster{fetchWait: 200 * time.Millisecond, metrics: true}, 3)
	c.createRange("orders", "r1")
	preg := metrics.NewRegistry("promoter")
	c.newPromoter("p1", true, func(cfg *Config) { cfg.Metrics = preg })
	psrv, err := metrics.Serve("127.0.0.1:0", preg, c.log)
	if err != nil {
		t.Fatal(err)
	}
	defer psrv.Close()
	first, e1 := c.leader("orders", 1, 20*time.Second)
	var last acked
	for i := range 5 {
		if last, err = c.appendOne("orders", fmt.Sprintf("v%d", i), 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	url := func(id string) string { return c.byID[id].metrics.URL() }

	// The leader's view once both followers hold every record: nothing
	// lags, nothing is under-replicated.
	waitSeries(t, first, url(first), `tenure_replica_follower_lag_records_max`, 0, 10*time.Second)
	// Long enough after the leadership began that a lag in seconds counted
	// from it, not from the followers' last catch-up (a 200ms long poll
	// apart), would show.
	time.Sleep(1500 * time.Millisecond)
	s := scrape(t, url(first))
	want(t, first, s, `tenure_replica_ranges{role="leader"}`, 1)
	want(t, first, s, `tenure_replica_ranges{role="follower"}`, 0)
	want(t, first, s, `tenure_replica_under_replicated_ranges`, 0)
	want(t, first, s, `tenure_replica_under_quorum_ranges`, 0)
	want(t, first, s, `tenure_replica_range_leader{range="orders"}`, 1)
	want(t, first, s, `tenure_replica_range_log_end_offset{range="orders"}`, float64(last.offset+1))
	// Nothing of orders is outside its (default, 7-day) retention.
	want(t, first, s, `tenure_replica_range_log_start_offset{range="orders"}`, 0)
	want(t, first, s, `tenure_replica_range_high_water_mark{range="orders"}`, float64(last.offset+1))
	want(t, first, s, `tenure_replica_range_fenced_epoch{range="orders"}`, float64(e1))
	atLeast(t, first, s, `tenure_replica_append_commit_duration_seconds_count`, 5)
	if n, _ := s.Get(`tenure_replica_wal_fsync_duration_seconds_count`); n < 1 {
		t.Errorf("%s: no WAL fsync observed (count %v)", first, n)
	}
	if n, _ := s.Get(`tenure_replica_range_log_bytes{range="orders"}`); n <= 0 {
		// The indexer may not have moved the records to segments yet; the
		// data directory holds them anyway.
		if d, _ := s.Get(`tenure_replica_data_dir_bytes`); d <= 0 {
			t.Errorf("%s: no bytes on disk reported (range %v, data dir %v)", first, n, d)
		}
	}
	// The append queue: its bounds, and what it holds (nothing waited:
	// five appends are far below either bound).
	want(t, first, s, `tenure_replica_append_queue_limit_bytes`, 64<<20)
	want(t, first, s, `tenure_replica_append_queue_limit_records`, 64<<10)
	want(t, first, s, `tenure_replica_append_queue_waits_total`, 0)
	for series, bound := range map[string]float64{`tenure_replica_append_queue_bytes`: 64 << 20, `tenure_replica_append_queue_records`: 64 << 10} {
		if n, ok := s.Get(series); !ok || n < 0 || n > bound {
			t.Errorf("%s: %s = %v (present %v), want a held amount within its bound %v", first, series, n, ok, bound)
		}
	}
	for _, r := range c.replicas {
		if r.id == first {
			continue
		}
		want(t, first, s, fmt.Sprintf(`tenure_replica_follower_lag_records{follower=%q,range="orders"}`, r.id), 0)
		if lag, _ := s.Get(fmt.Sprintf(`tenure_replica_follower_lag_seconds{follower=%q,range="orders"}`, r.id)); lag >= 1 {
			t.Errorf("%s: lag of %s, which is in sync, = %vs, want under 1s", first, r.id, lag)
		}
		fs := scrape(t, url(r.id))
		want(t, r.id, fs, `tenure_replica_ranges{role="follower"}`, 1)
		want(t, r.id, fs, `tenure_replica_range_leader{range="orders"}`, 0)
		want(t, r.id, fs, `tenure_replica_leader_changes_seen_total`, 1)
	}
	ps := scrape(t, psrv.URL())
	want(t, "promoter", ps, `tenure_promoter_elected`, 1)
	want(t, "promoter", ps, `tenure_promoter_ranges`, 1)
	want(t, "promoter", ps, `tenure_promoter_ranges_without_leader`, 0)
	want(t, "promoter", ps, `tenure_promoter_unsafe_promotions_total`, 0)
	want(t, "promoter", ps, `tenure_promoter_promotions_total{outcome="promoted",reason="initial_leader"}`, 1)
	for _, step := range []string{"grant", "fence", "plan", "truncate", "adopt"} {
		atLeast(t, "promoter", ps, fmt.Sprintf(`tenure_promoter_promotion_step_duration_seconds_count{step=%q}`, step), 1)
	}

	// The leader dies: its successor leads with one follower gone, which
	// it waits for in vain: the range is under-replicated (not under its
	// quorum: two of three are in sync).
	c.stop(c.byID[first])
	next, e2 := c.leader("orders", e1+1, 20*time.Second)
	// Within 8s, below the 10s lag bound: a dead follower is found by its
	// silence (3s), not only once it is 10s behind.
	waitSeries(t, next, url(next), `tenure_replica_under_replicated_ranges`, 1, 8*time.Second)
	s = scrape(t, url(next))
	want(t, next, s, `tenure_replica_ranges{role="leader"}`, 1)
	want(t, next, s, `tenure_replica_under_quorum_ranges`, 0)
	if lag, _ := s.Get(fmt.Sprintf(`tenure_replica_follower_lag_seconds{follower=%q,range="orders"}`, first)); lag < 3 {
		t.Errorf("%s: lag of the dead %s = %vs, want at least the 3s it has not fetched", next, first, lag)
	}
	ps = scrape(t, psrv.URL())
	// The probes find the dead leader refusing connections at once; on a
	// loaded machine its lease may expire first.
	unreachable, _ := ps.Get(`tenure_promoter_promotions_total{outcome="promoted",reason="leader_unreachable"}`)
	expired, _ := ps.Get(`tenure_promoter_promotions_total{outcome="promoted",reason="lease_expired"}`)
	if unreachable+expired != 1 {
		t.Errorf("promoter: promotions after the kill: %v for leader_unreachable, %v for lease_expired; want 1 in all", unreachable, expired)
	}
	want(t, "promoter", ps, `tenure_promoter_promotion_duration_seconds_count{outcome="promoted"}`, 2)

	// A fence at the superseded epoch is refused, and counted.
	other := ""
	for _, r := range c.replicas {
		if r.id != first && r.id != next {
			other = r.id
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = c.replicaClient(c.byID[other].srv.URL()).Fence(ctx, connect.NewRequest(&tenurev1.FenceRequest{RangeId: "orders", Epoch: e1, FencerId: "test"}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("fence at superseded epoch %d: %v, want FailedPrecondition", e1, err)
	}
	want(t, other, scrape(t, url(other)), `tenure_replica_fence_refusals_total`, 1)

	// The old leader is back and follows: under-replication ends.
	c.start(c.byID[first])
	waitSeries(t, next, url(next), `tenure_replica_under_replicated_ranges`, 0, 20*time.Second)
	waitSeries(t, first, url(first), `tenure_replica_ranges{role="follower"}`, 1, 20*time.Second)

	// Both followers die: the leader is left without a quorum in sync, so
	// appends wait (Kafka's UnderMinIsr).
	want(t, next, scrape(t, url(next)), `tenure_replica_under_quorum_ranges`, 0)
	c.stop(c.byID[first])
	c.stop(c.byID[other])
	waitSeries(t, next, url(next), `tenure_replica_under_quorum_ranges`, 1, 8*time.Second)
	t.Logf("leader %s at epoch %d, then %s at epoch %d; under-replication rose and fell, then under-quorum rose", first, e1, next, e2)
}
