package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenurelog/tenure/internal/flagusage"
	"github.com/tenurelog/tenure/internal/metrics"
	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/services/lease"
)

func init() {
	commands["lease"] = command{summary: "run the lease service: epochs, leases and membership per range, on etcd", run: runLease}
}

// leaseStartTimeout bounds how long the lease service waits for etcd at
// start (--etcd-wait's default); under compose etcd may come up a little
// after it. Past it the process exits 1, for its supervisor to restart or
// report, rather than wait unseen.
const leaseStartTimeout = 30 * time.Second

func runLease(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("lease", flag.ContinueOnError)
	etcd := fs.String("etcd", "127.0.0.1:2379", "comma-separated etcd endpoints; all state lives there, so any number of lease services can share one etcd")
	listen := fs.String("listen", "127.0.0.1:7000", "address to serve LeaseService on (HTTP/2, TLS with --tls-*: Connect, gRPC and gRPC-Web clients)")
	defaultTTL := fs.Duration("default-ttl", lease.DefaultSessionTTL, "TTL of sessions opened with ttl_ms 0; whole seconds, at least etcd's minimum lease TTL (1.5 election timeouts rounded up: 2s for etcd's defaults)")
	prefix := fs.String("prefix", lease.DefaultPrefix, "etcd key prefix for ranges, epochs, leases and sessions; lease services and promoters of one cluster must agree on it")
	requestTimeout := fs.Duration("request-timeout", lease.DefaultRequestTimeout, "bound on the etcd work of one request; an etcd slower than this answers Unavailable")
	compaction := fs.Duration("etcd-compaction-interval", lease.DefaultCompactionInterval, "how often to compact etcd's revision history, keeping one interval of it (kube-apiserver's --etcd-compaction-interval); without compaction etcd keeps every revision until its 2 GiB quota is full and then refuses every write. Compaction is keyspace-wide: 0 turns it off, for an etcd shared with applications that need a longer history (compact it there, e.g. etcd's --auto-compaction-retention)")
	etcdWait := fs.Duration("etcd-wait", leaseStartTimeout, fmt.Sprintf("how long to wait at start for etcd to answer; meanwhile a warning says it cannot be reached (after the first one-second try, then every %v), and past it the process exits 1. It serves (and prints its ready line) only once etcd answers", etcdWarnEvery))
	logFormat := fs.String("log-format", "text", "log format: text or json")
	readyFile := readyFileFlag(fs)
	metricsListen := metricsListenFlag(fs)
	tlsf := addTLSFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: tenure lease [flags]\n\nRuns the lease service. Per range it keeps in etcd the current epoch (granted\nby compare-and-swap, strictly increasing), the lease of that epoch (bound to a\nholder session with a TTL) and the membership, and streams lease events.\n%s%s%s\nFlags (env TENURE_<FLAG> as fallback):\n", readyHelp, metricsHelp, tlsHelp)
		flagusage.Print(fs.Output(), fs)
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	// lease.New checks these too; here they are the invocation's mistakes,
	// said before anything is started (exit status 2).
	if *defaultTTL%time.Second != 0 || *defaultTTL < time.Second || *defaultTTL > lease.MaxSessionTTL {
		return usagef("--default-ttl %v: want whole seconds, 1s to %v (etcd counts lease TTLs in seconds)", *defaultTTL, lease.MaxSessionTTL)
	}
	if *requestTimeout <= 0 {
		return usagef("--request-timeout %v: want a positive duration", *requestTimeout)
	}
	if *compaction < 0 {
		return usagef("--etcd-compaction-interval %v: want a duration, 0 for none", *compaction)
	}
	if *etcdWait <= 0 {
		return usagef("--etcd-wait %v: want a positive duration", *etcdWait)
	}
	if *prefix == "" || *prefix == "/" {
		return usagef("--prefix %q: want a non-empty key prefix such as %s", *prefix, lease.DefaultPrefix)
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
	stopTracing, err := startTracing(ctx, log, "tenure-lease")
	if err != nil {
		return err
	}
	defer stopTracing()
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(*etcd, ","), DialTimeout: 5 * time.Second, Logger: quietEtcdLogger(), TLS: etcdTLS(*etcd)})
	if err != nil {
		return fmt.Errorf("etcd client for %s: %w", *etcd, err)
	}
	defer cli.Close()

	sctx, cancel := context.WithTimeout(ctx, *etcdWait)
	err = waitForEtcd(sctx, cli, *etcd, *prefix, log)
	var svc *lease.Service
	reg := metrics.NewRegistry("lease")
	if err == nil {
		svc, err = lease.New(sctx, cli,
			lease.WithPrefix(*prefix), lease.WithDefaultTTL(*defaultTTL),
			lease.WithRequestTimeout(*requestTimeout), lease.WithLogger(log), lease.WithMetrics(reg),
			lease.WithCompaction(*compaction))
	}
	cancel()
	if err != nil && ctx.Err() != nil {
		// Stopped before it served: not a failure.
		log.Info("lease service stopped before it served", "err", err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("start against etcd %s (--etcd-wait %v): %w", *etcd, *etcdWait, err)
	}
	msrv, err := serveMetrics(*metricsListen, reg, log)
	if err != nil {
		svc.Close()
		return err
	}
	defer closeMetrics(msrv)
	srv, err := transport.Serve(*listen, svc.Registration())
	if err != nil {
		svc.Close()
		return err
	}
	log.Info("lease service serving", "addr", srv.URL(), "etcd", *etcd, "prefix", *prefix, "default_ttl", *defaultTTL, "metrics", metricsURL(msrv))
	if err := announceReady(os.Stdout, *readyFile, readyLine{Ready: true, Service: "lease", Address: srv.URL(), PID: os.Getpid(), Metrics: metricsURL(msrv)}); err != nil {
		svc.Close()
		_ = srv.Close()
		return err
	}
	defer removeReadyFile(*readyFile)

	<-ctx.Done()
	// Watch streams end first (Unavailable: their clients resume elsewhere
	// with after_revision); then in-flight unary calls finish, bounded.
	stopping("ending watch streams")
	svc.Close()
	stopping("draining requests")
	dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer dcancel()
	if err := srv.Shutdown(dctx); err != nil {
		log.Warn("lease service: shutdown not graceful", "err", err)
	}
	log.Info("lease service stopped")
	return nil
}
