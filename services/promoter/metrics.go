package promoter

import (
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tenurelog/tenure/internal/metrics"
)

// promoterMetrics are a promoter's event series; the state series are read
// at scrape time (Collect).
type promoterMetrics struct {
	promotions *prometheus.CounterVec   // outcome, reason
	duration   *prometheus.HistogramVec // outcome
	steps      *prometheus.HistogramVec // step
	unsafe     prometheus.Counter
}

// Outcomes of a promotion (the outcome label).
const (
	outcomePromoted   = "promoted"   // a new leader was adopted
	outcomeSuperseded = "superseded" // the range moved on first (Aborted): nothing to do
	outcomeFailed     = "failed"     // anything else; it is retried at the next epoch
)

func newPromoterMetrics() *promoterMetrics {
	ns := metrics.Namespace
	m := &promoterMetrics{
		promotions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: "promoter", Name: "promotions_total",
			Help: "Promotions this promoter ran, by outcome (promoted, superseded, failed) and reason (what triggered it; see README). Kafka's LeaderElectionRateAndTimeMs count."},
			[]string{"outcome", "reason"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: "promoter", Name: "promotion_duration_seconds",
			Help: "Time from a promotion's start to its new leader and followers adopted (or its failure), by outcome.", Buckets: metrics.LatencyBuckets},
			[]string{"outcome"}),
		steps: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: "promoter", Name: "promotion_step_duration_seconds",
			Help: "Time each step of a promotion took: grant, fence, plan, truncate, adopt, bind, record (the transition record's step timings).", Buckets: metrics.LatencyBuckets},
			[]string{"step"}),
		unsafe: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: "promoter", Name: "unsafe_promotions_total",
			Help: "Unsafe promotions (--unsafe-accept-data-loss) that adopted a leader: acknowledged records may be lost. Only an operator asks for one, and only a range without a safe plan (no quorum fenced) gets one; 0 otherwise (Kafka's UncleanLeaderElectionsPerSec)."}),
	}
	// Every step's and outcome's series exist from the start, so a rate()
	// over them has a sample before the first promotion.
	for _, s := range []string{"grant", "fence", "plan", "truncate", "adopt", "bind", "record"} {
		m.steps.WithLabelValues(s)
	}
	for _, o := range []string{outcomePromoted, outcomeSuperseded, outcomeFailed} {
		m.duration.WithLabelValues(o)
	}
	return m
}

// step observes one promotion step's duration.
func (m *promoterMetrics) step(name string, d time.Duration) {
	m.steps.WithLabelValues(name).Observe(d.Seconds())
}

// promotion counts one promotion that ended with err, started at start.
func (m *promoterMetrics) promotion(opts promoteOpts, observedEpoch int64, err error, start time.Time) {
	outcome := outcomePromoted
	switch {
	case err == nil:
		if opts.unsafe {
			m.unsafe.Inc()
		}
	case connect.CodeOf(err) == connect.CodeAborted:
		outcome = outcomeSuperseded
	default:
		outcome = outcomeFailed
	}
	m.promotions.WithLabelValues(outcome, reasonLabel(opts, observedEpoch)).Inc()
	m.duration.WithLabelValues(outcome).Observe(time.Since(start).Seconds())
}

// reasonLabel is the bounded kind of a promotion's reason: the reason
// itself is free text (an operator's words, an error message), which as a
// label would make a series per failure. The kinds: operator (PromoteRange
// or Promote), unsafe (an operator's unsafe promotion), membership (a
// membership step), rebalance, leader_unreachable (probes), leader_not_serving
// (probes: a leader not serving at its epoch), lease_expired, lease_released
// (or another lease_<event>: lease events), initial_leader, orphaned_grant,
// other.
func reasonLabel(opts promoteOpts, observedEpoch int64) string {
	r := strings.TrimSuffix(opts.reason, retryReason(""))
	switch {
	case opts.step != "":
		return "membership"
	case opts.unsafe:
		return "unsafe"
	case strings.HasPrefix(r, "rebalanc"):
		return "rebalance"
	case observedEpoch < 0:
		return "operator"
	case strings.HasPrefix(r, "leader ") && strings.Contains(r, " unreachable"):
		return "leader_unreachable"
	case strings.HasPrefix(r, "leader ") && strings.Contains(r, " not serving"):
		return "leader_not_serving"
	case strings.HasPrefix(r, "lease "):
		switch ev := strings.TrimPrefix(r, "lease "); ev {
		case "expired", "released", "granted", "bound", "membership":
			return "lease_" + ev
		}
		return "lease_other"
	case strings.HasPrefix(r, "initial leader"):
		return "initial_leader"
	case strings.HasPrefix(r, "orphaned grant"):
		return "orphaned_grant"
	}
	return "other"
}

// The state series, read at scrape time.
var (
	descElected = prometheus.NewDesc("tenure_promoter_elected",
		"1 while this promoter holds the election (only the elected one acts), else 0 (etcd_server_is_leader).", nil, nil)
	descRanges = prometheus.NewDesc("tenure_promoter_ranges",
		"Ranges the elected promoter watches (0 on a standby).", nil, nil)
	descLeaderless = prometheus.NewDesc("tenure_promoter_ranges_without_leader",
		"Ranges the elected promoter knows no serving leader for at their current epoch: no appends are acknowledged there until a promotion succeeds (Kafka's OfflinePartitionsCount; etcd_server_has_leader's inverse). 0 on a standby.", nil, nil)
	descInflight = prometheus.NewDesc("tenure_promoter_promotions_in_flight",
		"Promotions and reconciles running now.", nil, nil)
	descRetrying = prometheus.NewDesc("tenure_promoter_ranges_retrying",
		"Ranges whose last promotion attempt failed and is being retried (tenurectl status lists them, with why).", nil, nil)
)

// collector reads the promoter's state at scrape time.
type collector struct{ p *Promoter }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descElected, descRanges, descLeaderless, descInflight, descRetrying} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	p := c.p
	p.mu.Lock()
	elected := p.elected
	var ranges, leaderless, retrying float64
	if elected {
		// A standby's view is stale: only the elected one's counts, so a
		// sum over promoters is the cluster's.
		for _, rs := range p.ranges {
			ranges++
			if rs.leaderID == "" {
				leaderless++
			}
			if rs.attempts > 0 {
				retrying++
			}
		}
	}
	inflight := float64(len(p.inflight))
	p.mu.Unlock()
	e := 0.0
	if elected {
		e = 1
	}
	ch <- prometheus.MustNewConstMetric(descElected, prometheus.GaugeValue, e)
	ch <- prometheus.MustNewConstMetric(descRanges, prometheus.GaugeValue, ranges)
	ch <- prometheus.MustNewConstMetric(descLeaderless, prometheus.GaugeValue, leaderless)
	ch <- prometheus.MustNewConstMetric(descInflight, prometheus.GaugeValue, inflight)
	ch <- prometheus.MustNewConstMetric(descRetrying, prometheus.GaugeValue, retrying)
}

// registerMetrics adds the promoter's series to reg.
func (p *Promoter) registerMetrics(reg prometheus.Registerer) error {
	m := p.metrics
	for _, c := range []prometheus.Collector{m.promotions, m.duration, m.steps, m.unsafe, collector{p}} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
