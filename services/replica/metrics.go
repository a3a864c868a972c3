package replica

import (
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tenurelog/tenure/internal/metrics"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// Out-of-sync bounds: a voter follower counts as out of sync (its range
// under-replicated) when it has not caught up for outOfSyncLag (Kafka's
// replica.lag.time.max.ms, 30s there; a follower here fetches again at
// once, so it is far behind after 10s), or when its leader has waited
// outOfSyncIdle for its next fetch (it cannot reach the leader, or it is
// dead: tenurectl status's "not fetching" bound).
const (
	outOfSyncLag  = 10 * time.Second
	outOfSyncIdle = 3 * time.Second
)

// logBytesRefresh is how often a range's stored bytes are re-read
// (logstore.LogBytes reads every log key of the range).
const logBytesRefresh = 30 * time.Second

// replicaMetrics are a replica's event series; the state series are read
// at scrape time (collector).
type replicaMetrics struct {
	walSync       prometheus.Histogram
	appendCommit  prometheus.Histogram
	fenceRefusals prometheus.Counter
	leaderChanges prometheus.Counter
	// fetchSent and fetchReceived count the messages this replica's
	// fetching sends to and receives from its leaders: every message
	// between replicas on the data path, each counted once, by its
	// follower.
	fetchSent, fetchReceived prometheus.Counter
	sessionsOpened           prometheus.Counter
}

func newReplicaMetrics() *replicaMetrics {
	ns := metrics.Namespace
	return &replicaMetrics{
		walSync: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: "replica", Name: "wal_fsync_duration_seconds",
			Help: "Time one sync of the write-ahead log took (its fdatasyncs), once per group commit (etcd_disk_wal_fsync_duration_seconds), as the group commit waited for it: in a process whose cores are all busy this includes the wait for the syncing goroutine to run again (up to 10 ms on io_uring), so read it beside the process's CPU.", Buckets: metrics.LatencyBuckets}),
		appendCommit: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: "replica", Name: "append_commit_duration_seconds",
			Help: "Time from an append reaching the leader to its acknowledgement (a quorum holds it durably), for acknowledged appends.", Buckets: metrics.LatencyBuckets}),
		fenceRefusals: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: "replica", Name: "fence_refusals_total",
			Help: "Fences refused because the range is already fenced at a higher epoch: a promotion at a superseded epoch, which must be abandoned."}),
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: "replica", Name: "leader_changes_seen_total",
			Help: "Adopts that gave a hosted range a new epoch's leader, this replica or another (etcd_server_leader_changes_seen_total)."}),
		fetchSent: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: "replica", Name: "fetch_messages_sent_total",
			Help: "Messages this replica sent its ranges' leaders as a follower: fetch session messages (each carrying any number of ranges' pulls), per-range FetchStream pulls and unary Fetch requests."}),
		fetchReceived: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: "replica", Name: "fetch_messages_received_total",
			Help: "Messages this replica received from its ranges' leaders as a follower: fetch session messages (answers for any number of ranges, or a heartbeat), per-range FetchStream answers and unary Fetch responses."}),
		sessionsOpened: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: "replica", Name: "fetch_sessions_opened_total",
			Help: "Fetch session streams this replica opened to leader replicas: one per leader while it follows ranges there, another after each failure."}),
	}
}

// register adds the replica's series to reg.
func (s *Replica) registerMetrics(reg prometheus.Registerer) error {
	m := s.metrics
	for _, c := range []prometheus.Collector{m.walSync, m.appendCommit, m.fenceRefusals, m.leaderChanges, m.fetchSent, m.fetchReceived, m.sessionsOpened, &collector{s: s, bytes: map[string]logBytes{}}} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// The state series, read at scrape time.
var (
	descRanges = prometheus.NewDesc("tenure_replica_ranges",
		"Hosted ranges by what this replica does for them: leader (leads and serves), follower, fenced (fenced, no leader known yet, or a leader not serving since a restart), halted (stopped serving after a safety violation or a store failure, only a restart clears it; or quarantined, at startup or when a read found its stored data damaged, which a rebuild clears).", []string{"role"}, nil)
	descQuarantined = prometheus.NewDesc("tenure_replica_quarantined_ranges",
		"Hosted ranges quarantined: their stored data failed its checks at startup (state, HWM, markers, the record below the synced marker, or the journal against the log) or when a read reached it. Each is halted, answers no fence and serves nothing until rebuilt from its peers (tenurectl range rebuild); the replica's other ranges serve. Counted among the halted ranges too.", nil, nil)
	descUnderReplicated = prometheus.NewDesc("tenure_replica_under_replicated_ranges",
		"Ranges this replica leads with at least one voter out of sync: not caught up for 10s, or not fetching for 3s (Kafka's UnderReplicatedPartitions).", nil, nil)
	descUnderQuorum = prometheus.NewDesc("tenure_replica_under_quorum_ranges",
		"Ranges this replica leads whose in-sync voters, itself included, are fewer than a quorum: appends are not being acknowledged (Kafka's UnderMinIsrPartitionCount).", nil, nil)
	descLagRecordsMax = prometheus.NewDesc("tenure_replica_follower_lag_records_max",
		"Over every range this replica leads, the largest follower lag in records (leader log end minus the follower's fetch offset).", nil, nil)
	descLagSecondsMax = prometheus.NewDesc("tenure_replica_follower_lag_seconds_max",
		"Over every range this replica leads, the longest time a follower has not caught up (reached the log end the leader had at its previous fetch).", nil, nil)
	descRangesExported = prometheus.NewDesc("tenure_replica_ranges_exported",
		"Ranges with per-range series (at most 128, the first by range id); the rest appear only in the aggregates.", nil, nil)
	descHWM = prometheus.NewDesc("tenure_replica_range_high_water_mark",
		"The range's high-water mark on this replica: offsets below it are committed.", []string{"range"}, nil)
	descLogEnd = prometheus.NewDesc("tenure_replica_range_log_end_offset",
		"The range's log end on this replica: the offset its next record takes.", []string{"range"}, nil)
	descEpoch = prometheus.NewDesc("tenure_replica_range_fenced_epoch",
		"The highest epoch this replica is fenced at for the range.", []string{"range"}, nil)
	descLeader = prometheus.NewDesc("tenure_replica_range_leader",
		"1 while this replica leads and serves the range, else 0.", []string{"range"}, nil)
	descLogStart = prometheus.NewDesc("tenure_replica_range_log_start_offset",
		"The range's log start on this replica: the lowest offset it holds (retention removed everything below it).", []string{"range"}, nil)
	descStoredBytes = prometheus.NewDesc("tenure_replica_range_stored_bytes",
		"Bytes of the range's stored batches from its log start to its log end on this replica: what retention's max_bytes is measured against.", []string{"range"}, nil)
	descLogBytes = prometheus.NewDesc("tenure_replica_range_log_bytes",
		"Bytes the range's stored batches take on disk (segment files and Badger), re-read every 30s; the last moments' records are counted once indexed.", []string{"range"}, nil)
	descLagRecords = prometheus.NewDesc("tenure_replica_follower_lag_records",
		"On the leader: the follower's lag in records (log end minus its fetch offset).", []string{"range", "follower"}, nil)
	descLagSeconds = prometheus.NewDesc("tenure_replica_follower_lag_seconds",
		"On the leader: how long since the follower last caught up (reached the log end the leader had at its previous fetch); near 0 for a follower in sync.", []string{"range", "follower"}, nil)
	descDataDirBytes = prometheus.NewDesc("tenure_replica_data_dir_bytes",
		"Bytes of every file in the replica's data directory (Badger, segments, WAL, journals).", nil, nil)
	descDiskFull = prometheus.NewDesc("tenure_replica_disk_full",
		"1 while the replica's disk is full (free space below --disk-reserve, or a write failed for want of space) and appends are refused; 0 otherwise.", nil, nil)
	descDiskFree = prometheus.NewDesc("tenure_replica_disk_free_bytes",
		"Free bytes of the filesystem the replica's data directory is on, at the store's last reading (every 500 ms).", nil, nil)
	descDiskUsed = prometheus.NewDesc("tenure_replica_disk_used_bytes",
		"Bytes allocated to the store's files (segments, WAL, Badger, journals).", nil, nil)
	descDiskRefused = prometheus.NewDesc("tenure_replica_appends_refused_disk_full_total",
		"Appends (leader's and follower's) the store refused because the disk was full.", nil, nil)
	descQueueBytes = prometheus.NewDesc("tenure_replica_append_queue_bytes",
		"Value bytes of writes (appends and follower writes) the store admitted and has not yet indexed: they wait for their group commit or for the index. Writes wait for room once this would pass tenure_replica_append_queue_limit_bytes, which a stalled index (Badger throttling its writes, a slow disk) reaches.", nil, nil)
	descQueueLimitBytes = prometheus.NewDesc("tenure_replica_append_queue_limit_bytes",
		"The bound on tenure_replica_append_queue_bytes.", nil, nil)
	descQueueRecords = prometheus.NewDesc("tenure_replica_append_queue_records",
		"Records of writes the store admitted and has not yet committed (written to its WAL). Writes wait for room once this would pass tenure_replica_append_queue_limit_records.", nil, nil)
	descQueueLimitRecords = prometheus.NewDesc("tenure_replica_append_queue_limit_records",
		"The bound on tenure_replica_append_queue_records.", nil, nil)
	descQueueWaits = prometheus.NewDesc("tenure_replica_append_queue_waits_total",
		"Writes (appends and follower writes) that waited for room in the store's queue: backpressure from the WAL or the index. Counts from the store's open.", nil, nil)
)

// collector reads the replica's state at scrape time, so the data path
// pays nothing for the gauges.
type collector struct {
	s *Replica

	mu    sync.Mutex // one scrape at a time refreshes bytes
	bytes map[string]logBytes
}

type logBytes struct {
	n  uint64
	at time.Time
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRanges, descUnderReplicated, descUnderQuorum, descLagRecordsMax, descLagSecondsMax,
		descRangesExported, descHWM, descLogEnd, descEpoch, descLeader, descLogStart, descStoredBytes, descLogBytes, descLagRecords, descLagSeconds, descDataDirBytes, descQuarantined,
		descDiskFull, descDiskFree, descDiskUsed, descDiskRefused,
		descQueueBytes, descQueueLimitBytes, descQueueRecords, descQueueLimitRecords, descQueueWaits} {
		ch <- d
	}
}

// followerLag is one follower's progress as the metrics see it.
type followerLag struct {
	id        string
	learner   bool
	records   uint64
	behind    time.Duration // since it last caught up
	idle      time.Duration // since its leader last answered it, 0 while a fetch is in hand
	outOfSync bool
}

// lags reports each other member's lag at now. logEnd is the leader's.
func (l *leader) lags(logEnd uint64, now time.Time) []followerLag {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]followerLag, 0, len(l.progress))
	for _, r := range l.replicas {
		p := l.progress[r.GetId()]
		if p == nil {
			continue
		}
		f := followerLag{id: r.GetId(), learner: p.learner, records: logEnd - min(p.offset, logEnd), behind: now.Sub(p.caughtUp)}
		if p.inHand > 0 && p.checked && p.offset >= logEnd {
			// Its pull is held at the log end: caught up now. A fetch
			// session holds an idle range's pull without asking again,
			// so the time of its last fetch ages while it holds
			// everything.
			f.behind = 0
		}
		if p.inHand == 0 {
			f.idle = now.Sub(p.answered)
		}
		// Out of sync: behind for outOfSyncLag with records to fetch, or
		// silent for outOfSyncIdle (a dead follower never fetches, so
		// the second arm finds it even on an idle range).
		f.outOfSync = (f.records > 0 && f.behind >= outOfSyncLag) || f.idle >= outOfSyncIdle
		out = append(out, f)
	}
	return out
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	hs, err := s.hostedRanges()
	if err != nil {
		// Closed: no range series; the process's own ones still go out.
		return
	}
	now := time.Now()
	roles := map[string]float64{"leader": 0, "follower": 0, "fenced": 0, "halted": 0}
	var under, underQuorum, exported, quarantined float64
	var lagMax uint64
	var behindMax time.Duration
	for i, h := range hs {
		h.mu.RLock()
		role, halted := h.role(), h.halted != nil
		if h.quarantinedLocked() {
			quarantined++
		}
		fenced := h.st.FencedEpoch
		logEnd, hwm := h.r.LogEnd(), h.r.HWM()
		logStart, stored := h.r.LogStart(), h.r.StoredBytes()
		var lags []followerLag
		voters := 0
		l := h.acting()
		if l != nil {
			lags = l.lags(logEnd, now)
			voters = l.voters
		}
		h.mu.RUnlock()
		switch {
		case halted:
			roles["halted"]++
		case role == tenurev1.Role_ROLE_LEADER && l != nil:
			roles["leader"]++
		case role == tenurev1.Role_ROLE_FOLLOWER:
			roles["follower"]++
		default:
			roles["fenced"]++
		}
		if l != nil {
			inSync, out := 1, false // the leader itself is in sync
			for _, f := range lags {
				lagMax, behindMax = max(lagMax, f.records), max(behindMax, f.behind)
				if f.learner {
					continue // never counts toward the commit, nor here
				}
				if f.outOfSync {
					out = true
				} else {
					inSync++
				}
			}
			if out {
				under++
			}
			// The commit needs a quorum of voters, the leader among them.
			if inSync < wire.Quorum(voters) {
				underQuorum++
			}
		}
		// Per-range series for the first RangeSeriesMax ranges by id: the
		// bound keeps a replica of 10,000 ranges from exporting 50,000
		// series per scrape.
		if i >= metrics.RangeSeriesMax {
			continue
		}
		exported++
		ch <- prometheus.MustNewConstMetric(descHWM, prometheus.GaugeValue, float64(hwm), h.id)
		ch <- prometheus.MustNewConstMetric(descLogEnd, prometheus.GaugeValue, float64(logEnd), h.id)
		ch <- prometheus.MustNewConstMetric(descLogStart, prometheus.GaugeValue, float64(logStart), h.id)
		ch <- prometheus.MustNewConstMetric(descStoredBytes, prometheus.GaugeValue, float64(stored), h.id)
		ch <- prometheus.MustNewConstMetric(descEpoch, prometheus.GaugeValue, float64(fenced), h.id)
		leading := 0.0
		if l != nil && !halted {
			leading = 1
		}
		ch <- prometheus.MustNewConstMetric(descLeader, prometheus.GaugeValue, leading, h.id)
		if n, ok := c.logBytes(h.id, now); ok {
			ch <- prometheus.MustNewConstMetric(descLogBytes, prometheus.GaugeValue, float64(n), h.id)
		}
		// At most wire's replica-set bound of followers per range.
		for _, f := range lags {
			ch <- prometheus.MustNewConstMetric(descLagRecords, prometheus.GaugeValue, float64(f.records), h.id, f.id)
			ch <- prometheus.MustNewConstMetric(descLagSeconds, prometheus.GaugeValue, f.behind.Seconds(), h.id, f.id)
		}
	}
	for role, n := range roles {
		ch <- prometheus.MustNewConstMetric(descRanges, prometheus.GaugeValue, n, role)
	}
	ch <- prometheus.MustNewConstMetric(descQuarantined, prometheus.GaugeValue, quarantined)
	ch <- prometheus.MustNewConstMetric(descUnderReplicated, prometheus.GaugeValue, under)
	ch <- prometheus.MustNewConstMetric(descUnderQuorum, prometheus.GaugeValue, underQuorum)
	ch <- prometheus.MustNewConstMetric(descLagRecordsMax, prometheus.GaugeValue, float64(lagMax))
	ch <- prometheus.MustNewConstMetric(descLagSecondsMax, prometheus.GaugeValue, behindMax.Seconds())
	ch <- prometheus.MustNewConstMetric(descRangesExported, prometheus.GaugeValue, exported)
	ch <- prometheus.MustNewConstMetric(descDataDirBytes, prometheus.GaugeValue, float64(dirBytes(s.cfg.DataDir)))
	disk := s.diskStatus()
	full := 0.0
	if disk.Full {
		full = 1
	}
	ch <- prometheus.MustNewConstMetric(descDiskFull, prometheus.GaugeValue, full)
	ch <- prometheus.MustNewConstMetric(descDiskFree, prometheus.GaugeValue, float64(disk.FreeBytes))
	ch <- prometheus.MustNewConstMetric(descDiskUsed, prometheus.GaugeValue, float64(disk.UsedBytes))
	ch <- prometheus.MustNewConstMetric(descDiskRefused, prometheus.CounterValue, float64(disk.RefusedAppends))
	q := s.currentStore().QueueStatus()
	ch <- prometheus.MustNewConstMetric(descQueueBytes, prometheus.GaugeValue, float64(q.Bytes))
	ch <- prometheus.MustNewConstMetric(descQueueLimitBytes, prometheus.GaugeValue, float64(q.MaxBytes))
	ch <- prometheus.MustNewConstMetric(descQueueRecords, prometheus.GaugeValue, float64(q.Records))
	ch <- prometheus.MustNewConstMetric(descQueueLimitRecords, prometheus.GaugeValue, float64(q.MaxRecords))
	ch <- prometheus.MustNewConstMetric(descQueueWaits, prometheus.CounterValue, float64(q.Waits))
}

// logBytes returns range id's stored bytes, re-read when older than
// logBytesRefresh; ok is false when it cannot be read (store closing).
func (c *collector) logBytes(id string, now time.Time) (uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b, ok := c.bytes[id]; ok && now.Sub(b.at) < logBytesRefresh {
		return b.n, true
	}
	n, err := c.s.currentStore().LogBytes(id)
	if err != nil {
		return 0, false
	}
	if len(c.bytes) >= 2*metrics.RangeSeriesMax {
		clear(c.bytes) // ranges dropped since: bound the cache
	}
	c.bytes[id] = logBytes{n: n, at: now}
	return n, true
}

// dirBytes is the size of every regular file under dir (0 on error: the
// directory is the replica's own, and a file removed mid-walk is fine).
func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
