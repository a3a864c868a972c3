package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/tenurelog/tenure/internal/flagusage"
	"github.com/tenurelog/tenure/internal/metrics"
	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/services/promoter"
)

func init() {
	commands["promoter"] = command{summary: "run a promoter: failure detection and safe promotion (etcd-elected)", run: runPromoter}
}

func runPromoter(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("promoter", flag.ContinueOnError)
	host, _ := os.Hostname()
	id := fs.String("id", "promoter-"+host, "promoter id, unique among promoters (shown in transition records and the election)")
	etcd := fs.String("etcd", "127.0.0.1:2379", "comma-separated etcd endpoints (the election and transition records live there)")
	leaseURL := fs.String("lease", "http://127.0.0.1:7000", leaseFlagHelp)
	listen := fs.String("listen", "127.0.0.1:7200", "address to serve PromoterService on")
	advertise := fs.String("advertise", "", "base URL the other promoters reach this one at: while this one is elected, they forward operators' requests there (default <scheme>://<listen>, an unspecified host such as 0.0.0.0 replaced by this host's name)")
	prefix := fs.String("prefix", "/tenure/", "etcd key prefix; must match the lease service's")
	probe := fs.Duration("probe-interval", 100*time.Millisecond, "how often each replica is probed; a leader that refuses connections (or whose name no longer resolves) is promoted away at once, before its lease expires")
	misses := fs.Int("probe-misses", 3, "consecutive missed probes (timeouts, lost requests) that make a leader suspect; a suspect is promoted away once the lease service no longer sees its lease live")
	status := fs.Duration("status-interval", time.Second, "how often a probe reads a replica's full status (every range it hosts) instead of only checking that it answers; the full status finds leaders that no longer lead at their epoch and members to reconcile")
	fenceTimeout := fs.Duration("fence-timeout", time.Second, "how long a promotion waits for fence answers; replicas not answering by then do not count")
	parallel := fs.Int("max-parallel", 1024, "at most this many promotions run at once; their calls to each replica and the lease service are batched, at most 2 batches in flight per replica and kind, 8 to the lease service")
	keepTransitions := fs.Int("keep-transitions", 100, "transition records kept per range in etcd, the newest (those of the newest N epochs; at least 20, which unsafe promotions read)")
	catchUp := fs.Duration("handover-catch-up", 5*time.Second, "how long a planned handover (tenurectl promote --to) waits, before fencing anything, for its target to hold every committed record; then it is refused and nothing changes")
	rebalance := fs.Bool("rebalance", true, "move leadership back to each range's preferred replica once it is healthy and caught up after a failover (planned handovers, a few per interval; like Kafka's auto.leader.rebalance.enable); --rebalance=false turns it off")
	rebalanceInterval := fs.Duration("rebalance-interval", 30*time.Second, "how often the elected promoter looks for ranges led elsewhere than their preferred replica; a range whose leader changed within the last interval is left alone")
	rebalanceMax := fs.Int("rebalance-max", 8, "at most this many ranges are moved back per rebalance interval, one after the other")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	readyFile := readyFileFlag(fs)
	metricsListen := metricsListenFlag(fs)
	tlsf := addTLSFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: tenure promoter [flags]\n\nRuns a promoter. Promoters campaign in an etcd election; only the elected one\nwatches leases, probes replicas and promotes.\n%s%s%s\nFlags (env TENURE_<FLAG> as fallback):\n", readyHelp, metricsHelp, tlsHelp)
		flagusage.Print(fs.Output(), fs)
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *id == "" {
		return usagef("--id must not be empty (see --help)")
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
	stopTracing, err := startTracing(ctx, log, "tenure-promoter", semconv.ServiceInstanceID(*id))
	if err != nil {
		return err
	}
	defer stopTracing()
	lURLs, err := serviceURLs("lease", *leaseURL)
	if err != nil {
		return err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(*etcd, ","), DialTimeout: 5 * time.Second, Logger: quietEtcdLogger(), TLS: etcdTLS(*etcd)})
	if err != nil {
		return fmt.Errorf("etcd client for %s: %w", *etcd, err)
	}
	defer cli.Close()
	// Listen first: the advertised URL names the port bound (--listen :0).
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("promoter: listen on %s: %w", *listen, err)
	}
	url := *advertise
	if url == "" {
		url = promoterURL(ln.Addr().String(), host)
	} else if url, err = serviceURL("advertise", url); err != nil {
		ln.Close()
		return err
	}
	reg := metrics.NewRegistry("promoter")
	p, err := promoter.New(promoter.Config{
		ID: *id, URL: url, Etcd: cli, Prefix: *prefix, LeaseURL: lURLs[0], LeaseURLs: lURLs[1:], Logger: log, Metrics: reg,
		ProbeInterval: *probe, ProbeMisses: *misses, StatusInterval: *status, FenceTimeout: *fenceTimeout, MaxParallel: *parallel,
		KeepTransitions: *keepTransitions,
		HandoverCatchUp: *catchUp, NoRebalance: !*rebalance, RebalanceInterval: *rebalanceInterval, RebalanceMax: *rebalanceMax,
	})
	if err != nil {
		_ = ln.Close()
		return err
	}
	msrv, err := serveMetrics(*metricsListen, reg, log)
	if err != nil {
		_ = ln.Close()
		return err
	}
	defer closeMetrics(msrv)
	srv := transport.ServeListener(ln, p.Handlers()...)
	log.Info("promoter serving", "id", *id, "addr", srv.URL(), "advertise", url, "etcd", *etcd, "lease", *leaseURL, "metrics", metricsURL(msrv))
	if err := announceReady(os.Stdout, *readyFile, readyLine{Ready: true, Service: "promoter", ID: *id, Address: srv.URL(), PID: os.Getpid(), Metrics: metricsURL(msrv)}); err != nil {
		_ = srv.Close()
		return err
	}
	defer removeReadyFile(*readyFile)
	stopping("stopping the election and the promoter's loops")
	runErr := p.Run(ctx)
	stopping("draining requests")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(sctx)
	return runErr
}

// promoterURL is the URL a promoter bound to addr is reached at by the
// other promoters: a wildcard host (compose's 0.0.0.0) is no address to
// dial, so it names this host (compose's hostname: promoter-1).
func promoterURL(addr, hostname string) string {
	h, port, err := net.SplitHostPort(addr)
	if err == nil && hostname != "" {
		if ip := net.ParseIP(h); h == "" || (ip != nil && ip.IsUnspecified()) {
			addr = net.JoinHostPort(hostname, port)
		}
	}
	return transport.Scheme() + "://" + addr
}
