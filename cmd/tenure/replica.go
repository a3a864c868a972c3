package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/tenurelog/tenure/internal/bytesize"
	"github.com/tenurelog/tenure/internal/flagusage"
	"github.com/tenurelog/tenure/internal/metrics"
	"github.com/tenurelog/tenure/pkg/leaseclient"
	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/pkg/wire"
	"github.com/tenurelog/tenure/services/lease"
	"github.com/tenurelog/tenure/services/replica"
)

func init() {
	commands["replica"] = command{summary: "run a replica: range logs in Badger, replicated by fetch, committed by quorum, fenced by epoch", run: runReplica}
}

// --segment-bytes: the default is logstore's (64 MiB). A file smaller than
// 64 KiB would hold a few batches each (a batch over the size gets a file
// of its own anyway); one over 1 GiB would give space back in steps of a
// GiB.
const (
	defaultSegmentBytes = 64 << 20
	minSegmentBytes     = 64 << 10
	maxSegmentBytes     = 1 << 30
)

// replicaShutdownTimeout bounds the graceful stop: in-flight appends and
// fetch long polls (at most a follower's fetch wait) get this long to end.
const replicaShutdownTimeout = 5 * time.Second

func runReplica(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("replica", flag.ContinueOnError)
	id := fs.String("id", "", "replica id, unique in the cluster: 1-128 of letters, digits, '.', '_', '-' (required)")
	listen := fs.String("listen", "127.0.0.1:7101", "address to serve LogService and ReplicaService on (HTTP/2, TLS with --tls-*: Connect, gRPC and gRPC-Web clients)")
	advertise := fs.String("advertise", "", "base URL that followers, clients and the promoter reach this replica at (default http://<listen>, https://<listen> with --tls-*)")
	dataDir := fs.String("data-dir", "", "directory for the Badger log, the epoch journals and each range's state (default ./data/<id>); one replica per directory")
	leaseURL := fs.String("lease", "", "lease service base URL, or several instances of it (over one etcd) separated by commas: a renewal an instance does not answer goes to the next, under the same session; when set, a leader keeps its lease alive there and stops acknowledging appends and serving reads when it cannot renew. Empty: no lease service, a leader's lease is always valid (fencing alone keeps it safe)")
	leaseTTL := fs.Duration("lease-ttl", 0, "TTL of this replica's lease session, whole seconds (0: the lease service's default); only with --lease")
	fetchWait := fs.Duration("fetch-wait", time.Second, fmt.Sprintf("how long a follower lets its leader hold a fetch with nothing new (at most %dms)", wire.MaxFetchWaitMillis))
	retentionInterval := fs.Duration("retention-interval", replica.DefaultRetentionInterval, "how often the leader of each range applies its retention policy (removes committed records outside it) and re-reads the policies of the ranges it leads from --lease, so 'tenurectl range set' takes effect within one interval; 0: never remove anything")
	diskReserve := sizeFlag(defaultDiskReserve)
	fs.Var(&diskReserve, "disk-reserve", "free space to keep on the data directory's filesystem: below it the replica refuses appends (ResourceExhausted; a follower stops taking records and lags) while fences, reads, truncations and retention go on, and it resumes by itself once space is back (README \"A full disk\"); bytes or KiB/MiB/GiB; 0: no preventive check, only a write failing with ENOSPC stops appends")
	segmentBytes := sizeFlag(defaultSegmentBytes)
	fs.Var(&segmentBytes, "segment-bytes", fmt.Sprintf("size at which a segment file (stored batches, shared by every range) is full, %s to %s; space goes back a whole file at a time, so the disk holds up to about a file more than the ranges keep: lower it (e.g. 1MiB) where retention keeps only a few MiB, at the cost of more files (each stays open once read); bytes or KiB/MiB/GiB", bytesize.Format(minSegmentBytes), bytesize.Format(maxSegmentBytes)))
	logFormat := fs.String("log-format", "text", "log format: text or json")
	readyFile := readyFileFlag(fs)
	metricsListen := metricsListenFlag(fs)
	tlsf := addTLSFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: tenure replica --id ID [flags]\n\nRuns a replica. It hosts a range from the first Fence that names it (the\npromoter brings replicas into ranges), stores the range's log in Badger, and\nleads or follows it as Adopt says: a leader assigns offsets and acknowledges\nappends once a quorum holds them durably; a follower fetches from its leader.\nA restarted replica reloads every range; a follower resumes fetching, a leader\nwaits to be fenced and adopted again.\nThe leader of each range removes committed records outside the range's\nretention policy every --retention-interval (README \"Retention\").\n%s%s%s\nFlags (env TENURE_<FLAG> as fallback):\n", readyHelp, metricsHelp, tlsHelp)
		flagusage.Print(fs.Output(), fs)
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *id == "" {
		return usagef("--id is required (see --help)")
	}
	if err := checkReplicaID(*id); err != nil {
		return err
	}
	if *dataDir == "" {
		*dataDir = filepath.Join("data", *id)
	}
	if segmentBytes < minSegmentBytes || segmentBytes > maxSegmentBytes {
		return usagef("--segment-bytes %d: want %d to %d (%s to %s)", segmentBytes, minSegmentBytes, maxSegmentBytes, bytesize.Format(minSegmentBytes), bytesize.Format(maxSegmentBytes))
	}
	log, err := newLogger(*logFormat)
	if err != nil {
		return err
	}
	if err := clearReadyFile(*readyFile); err != nil {
		return err
	}
	if err := tlsf.setup(log, *listen); err != nil {
		return err
	}
	stopTracing, err := startTracing(ctx, log, "tenure-replica", semconv.ServiceInstanceID(*id))
	if err != nil {
		return err
	}
	defer stopTracing()

	if *advertise != "" {
		if *advertise, err = serviceURL("advertise", *advertise); err != nil {
			return err
		}
	}
	reg := metrics.NewRegistry("replica")
	if *retentionInterval < 0 {
		return usagef("--retention-interval %v: want a positive duration, or 0 to never remove anything", *retentionInterval)
	}
	cfg := replica.Config{ID: *id, Address: *advertise, DataDir: *dataDir, Logger: log, FetchWait: *fetchWait, Metrics: reg, RetentionInterval: *retentionInterval}
	cfg.StoreOptions.SegmentBytes = int64(segmentBytes)
	if *retentionInterval == 0 {
		cfg.RetentionInterval = -1 // replica.Config: negative is never
	}
	cfg.StoreOptions.DiskReserveBytes = uint64(diskReserve)
	var keeper *lease.Keeper
	if *leaseURL != "" {
		lURLs, err := serviceURLs("lease", *leaseURL)
		if err != nil {
			return err
		}
		// One session, renewed through whichever instance answers
		// (pkg/leaseclient): losing an instance loses no leadership.
		lc, err := leaseclient.New(transport.NewHTTPClient(), lURLs)
		if err != nil {
			// leaseclient.New and NewKeeper do no IO: their errors are
			// the flags'.
			return usageError{fmt.Errorf("--lease: %w", err)}
		}
		// The Keeper opens its session in the background and retries, so a
		// replica can start before the lease service does.
		keeper, err = lease.NewKeeper(lc, *id, advertiseURL(*advertise, *listen), lease.WithSessionTTL(*leaseTTL), lease.WithKeeperLogger(log))
		if err != nil {
			return usageError{fmt.Errorf("lease keeper for %s: %w", *leaseURL, err)}
		}
		cfg.Lease = keeper
		// The lease service's word on a range, before a fence hosts one or
		// jumps far above the current fence (defence in depth).
		cfg.Ranges = keeper
		// Where leaders re-read their ranges' retention policies.
		cfg.Policies = keeper
	}
	r, srv, err := replica.Start(cfg, *listen)
	if err != nil {
		return err
	}
	msrv, err := serveMetrics(*metricsListen, reg, log)
	if err != nil {
		_ = srv.Close()
		if cerr := r.Close(); cerr != nil {
			log.Error("replica: close", "err", cerr)
		}
		return err
	}
	defer closeMetrics(msrv)
	log.Info("replica serving", "id", *id, "addr", srv.URL(), "advertise", r.Address(), "data_dir", *dataDir, "lease", *leaseURL, "metrics", metricsURL(msrv))
	if err := announceReady(os.Stdout, *readyFile, readyLine{Ready: true, Service: "replica", ID: *id, Address: srv.URL(), PID: os.Getpid(), Metrics: metricsURL(msrv)}); err != nil {
		_ = srv.Close()
		if cerr := r.Close(); cerr != nil {
			log.Error("replica: close", "err", cerr)
		}
		return err
	}
	defer removeReadyFile(*readyFile)

	<-ctx.Done()
	// Stop taking requests and let in-flight ones end (bounded), then stop
	// the ranges (waiting appends fail, loops stop, the store closes), then
	// close the lease session so the promoter need not wait out its TTL.
	sctx, cancel := context.WithTimeout(context.Background(), replicaShutdownTimeout)
	defer cancel()
	stopping("draining requests")
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("replica: shutdown not graceful", "err", err)
	}
	stopping("closing the ranges and the store (Badger) in " + *dataDir)
	if err := r.Close(); err != nil {
		log.Error("replica: close", "err", err)
	}
	stopping("closing the lease session")
	if keeper != nil {
		if err := keeper.Close(sctx); err != nil {
			log.Warn("replica: close lease session", "err", err)
		}
	}
	log.Info("replica stopped")
	return nil
}

// checkReplicaID checks --id: a flag's value, not a request, so its error
// goes without ErrInvalid's "invalid request: ".
func checkReplicaID(id string) error {
	err := wire.ValidateReplicaID(id)
	if err == nil {
		return nil
	}
	return usagef("--id: %s", strings.TrimPrefix(err.Error(), wire.ErrInvalid.Error()+": "))
}

// defaultDiskReserve is --disk-reserve's default: room for Badger's
// memtable and its flush, a WAL switch and a few index commits, written
// after appends stop (fences, HWMs, retention, the indexing of what was
// accepted), and about half a second of appends at this box's disk speed,
// the time between two readings of the free space.
const defaultDiskReserve = 256 << 20

// sizeFlag is a byte count flag: plain bytes or a unit (internal/bytesize).
type sizeFlag uint64

func (f *sizeFlag) String() string { return bytesize.Format(uint64(*f)) }

func (f *sizeFlag) Set(s string) error {
	n, err := bytesize.Parse(s)
	if err != nil {
		return err
	}
	*f = sizeFlag(n)
	return nil
}

// advertiseURL is the URL the replica is reached at: --advertise, or the
// listen address. (With --listen on port 0 and no --advertise, Start
// advertises the port it bound; the lease holder address names the flag's.)
func advertiseURL(advertise, listen string) string {
	if advertise != "" {
		return advertise
	}
	return transport.Scheme() + "://" + listen
}
