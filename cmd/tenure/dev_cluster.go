package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenurelog/tenure/internal/metrics"
	"github.com/tenurelog/tenure/pkg/embedetcd"
	"github.com/tenurelog/tenure/pkg/telemetry"
	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
	"github.com/tenurelog/tenure/services/lease"
	"github.com/tenurelog/tenure/services/promoter"
)

// devElectionTimeout bounds how long the dev promoter may take to win its
// (uncontested) election: one etcd session and one campaign round trip.
const devElectionTimeout = 15 * time.Second

// devReplicaIDs are the dev cluster's replicas.
var devReplicaIDs = []string{"r1", "r2", "r3"}

// devCluster is the embedded dev cluster: etcd, the lease service and a
// promoter in this process, three replicas as child processes. Every field
// is set by start in that order and torn down by close in reverse, so a
// start interrupted half way is cleaned up like a finished one.
type devCluster struct {
	// certs is the directory of the cluster's certificates ("" with
	// --insecure): every hop is mutual TLS.
	certs     string
	dir       string
	removeDir bool // the directory is ours (a temp dir): close removes it
	// dirLock is dir's lock (lockDataDir), released by close last.
	dirLock *os.File
	self    string
	log     *slog.Logger
	logFile *os.File
	// restoreLog puts back the default logger useDefaultLogger replaced.
	restoreLog func()
	ports      devPorts
	// stopTracing flushes buffered spans.
	stopTracing func()

	etcd        *embedetcd.Etcd
	etcdClient  *clientv3.Client
	leaseSvc    *lease.Service
	leaseSrv    *transport.Server
	replicas    []*devReplica
	promoter    *promoter.Promoter
	promoterSrv *transport.Server
	stopRun     context.CancelFunc
	runDone     chan struct{}
	// announce, when set (--json), receives a ready line for every process
	// as it comes up, replicas again after a restart.
	announce func(readyLine)
	// metrics serves the lease service's and the promoter's series (one
	// process, one registry); each replica serves its own.
	metrics *metrics.Server

	// Clients, built the way every tenure client is.
	http           *http.Client
	leaseClient    tenurev1connect.LeaseServiceClient
	promoterClient tenurev1connect.PromoterServiceClient
}

// ready announces a process that serves, if anyone listens (announce).
func (c *devCluster) ready(service, id, address string, pid int, metricsURL string) {
	if c.announce != nil {
		c.announce(readyLine{Ready: true, Service: service, ID: id, Address: address, PID: pid, Metrics: metricsURL})
	}
}

// readyReplica announces replica r's running process.
func (c *devCluster) readyReplica(r *devReplica) {
	c.ready("replica", r.id, r.url(), r.cmd.Process.Pid, r.metricsURL())
}

func (c *devCluster) leaseURL() string    { return c.leaseSrv.URL() }
func (c *devCluster) promoterURL() string { return c.promoterSrv.URL() }

func (c *devCluster) replica(id string) *devReplica {
	for _, r := range c.replicas {
		if r.id == id {
			return r
		}
	}
	return nil
}

// devPorts are the dev cluster's listeners and replica addresses.
type devPorts struct {
	lease, promoter net.Listener
	replicas        []string // host:port; the children bind them
	// metrics serves this process's metrics (the lease service's and the
	// promoter's); replicaMetrics are the replicas' metrics listeners
	// (host:port, bound by the children).
	metrics        net.Listener
	replicaMetrics []string
}

// reservePorts binds the lease and promoter listeners and picks the
// replicas' ports: base, base+200 and base+101.. (the services' own default
// ports for base 7000, so tenurectl's defaults reach them), and the metrics
// ports, base+250 for this process's and base+251.. for the replicas' (below
// base+300, which --base-port's bound keeps within 65535), or free ports
// when base is 0 or one of those is taken. A replica port is only checked
// free here and bound by the child moments later; another process taking it
// in between makes that child fail to start, which start reports.
func reservePorts(base int) (devPorts, string, error) {
	if base > 0 {
		p, err := bindPorts(func(i int) string {
			n := len(devReplicaIDs)
			switch {
			case i == 0:
				return fmt.Sprintf("127.0.0.1:%d", base)
			case i == 1:
				return fmt.Sprintf("127.0.0.1:%d", base+200)
			case i < 2+n:
				return fmt.Sprintf("127.0.0.1:%d", base+100+i-1)
			}
			return fmt.Sprintf("127.0.0.1:%d", base+250+i-(2+n))
		})
		if err == nil {
			return p, "", nil
		}
		note := fmt.Sprintf("%v; using free ports instead (tenurectl then needs the --lease and --promoter printed below)", err)
		p, err = bindPorts(func(int) string { return "127.0.0.1:0" })
		return p, note, err
	}
	p, err := bindPorts(func(int) string { return "127.0.0.1:0" })
	return p, "", err
}

// bindPorts binds 3+2*len(devReplicaIDs) listeners at addr(i), holding
// them all so free ports differ, then releases the replicas': lease,
// promoter, the replicas, this process's metrics, the replicas' metrics.
func bindPorts(addr func(i int) string) (devPorts, error) {
	var lns []net.Listener
	n := len(devReplicaIDs)
	for i := range 3 + 2*n {
		ln, err := net.Listen("tcp", addr(i))
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return devPorts{}, fmt.Errorf("port %s is taken", addr(i))
		}
		lns = append(lns, ln)
	}
	p := devPorts{lease: lns[0], promoter: lns[1], metrics: lns[2+n]}
	for _, ln := range lns[2 : 2+n] {
		p.replicas = append(p.replicas, ln.Addr().String())
		ln.Close()
	}
	for _, ln := range lns[3+n:] {
		p.replicaMetrics = append(p.replicaMetrics, ln.Addr().String())
		ln.Close()
	}
	return p, nil
}

// startDevCluster starts everything, printing each piece to out as it comes
// up. On error the caller still calls close.
func startDevCluster(ctx context.Context, c *devCluster, ports devPorts, out io.Writer) error {
	c.ports = ports // close releases whichever listener was not handed to a server
	var err error
	c.http = transport.NewHTTPClient()
	if c.self, err = os.Executable(); err != nil {
		return fmt.Errorf("find this binary to run the replicas: %w", err)
	}
	if c.logFile, err = os.OpenFile(filepath.Join(c.dir, "dev.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
		return fmt.Errorf("log file: %w", err)
	}
	c.log = slog.New(telemetry.LogHandler(slog.NewTextHandler(c.logFile, nil)))
	// The process's default logger too: the in-process lease service's
	// and promoter's servers log through it (auth refusals) and net/http
	// through the log package it redirects (a cleartext client at a TLS
	// port: "http: TLS handshake error"). Left as it was, those lines
	// landed in the story on stderr, bare and unstructured. close puts
	// the old one back (tests run more than one cluster in a process).
	c.restoreLog = useDefaultLogger(c.log)
	// One tracer for the lease service and the promoter in this process;
	// the replica processes set up their own from the same OTEL_*
	// environment, so a promotion is one trace across all of them.
	if c.stopTracing, err = startTracing(ctx, c.log, "tenure-dev"); err != nil {
		return err
	}

	started := time.Now()
	if c.etcd, err = embedetcd.Start(filepath.Join(c.dir, "etcd")); err != nil {
		return err
	}
	c.etcdClient, err = clientv3.New(clientv3.Config{Endpoints: c.etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: quietEtcdLogger()})
	if err != nil {
		return fmt.Errorf("etcd client: %w", err)
	}
	fmt.Fprintf(out, "  %-12s %-26s embedded, data in %s\n", "etcd", c.etcd.Endpoints()[0], c.etcd.Dir())
	c.ready("etcd", "", c.etcd.Endpoints()[0], os.Getpid(), "")

	reg := metrics.NewRegistry("dev")
	c.metrics, c.ports.metrics = metrics.ServeListener(ports.metrics, reg, c.log), nil
	lctx, cancel := context.WithTimeout(ctx, leaseStartTimeout)
	c.leaseSvc, err = lease.New(lctx, c.etcdClient, lease.WithLogger(c.log.With("service", "lease")), lease.WithMetrics(reg))
	cancel()
	if err != nil {
		return fmt.Errorf("lease service: %w", err)
	}
	c.leaseSrv, c.ports.lease = transport.ServeListener(ports.lease, c.leaseSvc.Registration()), nil
	c.leaseClient = tenurev1connect.NewLeaseServiceClient(c.http, c.leaseURL(), transport.ClientOptions()...)
	fmt.Fprintf(out, "  %-12s %-26s in this process, metrics %s\n", "lease", c.leaseURL(), c.metrics.URL())
	c.ready("lease", "", c.leaseURL(), os.Getpid(), c.metrics.URL())

	// The replicas start in parallel: each opens Badger, which is most of
	// the start-up time.
	for i, id := range devReplicaIDs {
		c.replicas = append(c.replicas, newDevReplica(id, ports.replicas[i], ports.replicaMetrics[i], c.dir, c.leaseURL(), c.certs))
	}
	errs := make([]error, len(c.replicas))
	var wg sync.WaitGroup
	for i, r := range c.replicas {
		wg.Go(func() { errs[i] = c.startReplica(ctx, r) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, r := range c.replicas {
		fmt.Fprintf(out, "  %-12s %-26s pid %d, log %s, metrics %s\n", "replica "+r.id, r.url(), r.cmd.Process.Pid, r.logPath, r.metricsURL())
		c.readyReplica(r)
	}

	c.promoter, err = promoter.New(promoter.Config{
		ID: "dev-promoter", Etcd: c.etcdClient, LeaseURL: c.leaseURL(), HTTPClient: c.http,
		Logger: c.log.With("service", "promoter"), RefreshInterval: 500 * time.Millisecond, Metrics: reg,
	})
	if err != nil {
		return err
	}
	c.promoterSrv, c.ports.promoter = transport.ServeListener(ports.promoter, c.promoter.Handlers()...), nil
	c.promoterClient = tenurev1connect.NewPromoterServiceClient(c.http, c.promoterURL(), transport.ClientOptions()...)
	runCtx, stop := context.WithCancel(context.Background())
	c.stopRun, c.runDone = stop, make(chan struct{})
	go func() {
		defer close(c.runDone)
		_ = c.promoter.Run(runCtx)
	}()
	if err := waitUntil(ctx, devElectionTimeout, "the promoter to win its election", c.promoter.Elected); err != nil {
		return err
	}
	fmt.Fprintf(out, "  %-12s %-26s in this process, elected, metrics %s\n", "promoter", c.promoterURL(), c.metrics.URL())
	c.ready("promoter", "dev-promoter", c.promoterURL(), os.Getpid(), c.metrics.URL())
	fmt.Fprintf(out, "  %-12s %s\n", "logs", filepath.Join(c.dir, "*.log"))
	fmt.Fprintf(out, "  up in %v\n", time.Since(started).Round(time.Millisecond))
	return nil
}

// devPortAttempts bounds the retries of a replica that lost its port.
const devPortAttempts = 5

// startReplica starts a replica child and waits for it to serve. A free
// port is only known free when it is picked; if another process took it
// before the child bound it, the child exits with "address already in use"
// and is started again on a new free port (before any range names it, so
// no membership goes stale).
func (c *devCluster) startReplica(ctx context.Context, r *devReplica) error {
	for attempt := 1; ; attempt++ {
		if err := r.start(c.self); err != nil {
			return err
		}
		err := r.waitReady(ctx, replicaClient(c.http, r.url()))
		if err == nil || attempt == devPortAttempts || !strings.Contains(err.Error(), "address already in use") {
			return err
		}
		r.cmd = nil // it exited and was reaped
		ln, lerr := net.Listen("tcp", "127.0.0.1:0")
		if lerr != nil {
			return errors.Join(err, lerr)
		}
		r.listen = ln.Addr().String()
		ln.Close()
		// The port lost may have been the metrics one: a new one too.
		mln, lerr := net.Listen("tcp", "127.0.0.1:0")
		if lerr != nil {
			return errors.Join(err, lerr)
		}
		r.metricsListen = mln.Addr().String()
		mln.Close()
		c.log.Info("replica lost its port to another process; retrying on a new one", "replica", r.id, "listen", r.listen)
	}
}

// close stops everything that started, in reverse order, each step bounded:
// the promoter first (so nothing is promoted while replicas stop), then the
// replicas (SIGTERM, then SIGKILL; always reaped), the lease service, etcd,
// and last the data directory if it is a temp dir.
func (c *devCluster) close() {
	for _, ln := range []net.Listener{c.ports.lease, c.ports.promoter, c.ports.metrics} {
		if ln != nil {
			ln.Close()
		}
	}
	if c.stopRun != nil {
		c.stopRun()
		select {
		case <-c.runDone:
		case <-time.After(10 * time.Second):
			c.log.Warn("promoter did not stop within 10s")
		}
	}
	if c.promoterSrv != nil {
		c.promoterSrv.Close()
	}
	var wg sync.WaitGroup
	for _, r := range c.replicas {
		wg.Go(r.stop)
	}
	wg.Wait()
	if c.leaseSvc != nil {
		c.leaseSvc.Close()
	}
	if c.leaseSrv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = c.leaseSrv.Shutdown(ctx)
		cancel()
	}
	if c.metrics != nil {
		c.metrics.Close()
	}
	if c.etcdClient != nil {
		c.etcdClient.Close()
	}
	if c.etcd != nil {
		c.etcd.Close()
	}
	if c.http != nil {
		c.http.CloseIdleConnections()
	}
	if c.stopTracing != nil {
		c.stopTracing()
	}
	if c.restoreLog != nil {
		c.restoreLog()
	}
	if c.logFile != nil {
		c.logFile.Close()
	}
	if c.removeDir {
		os.RemoveAll(c.dir)
	}
	if c.dirLock != nil {
		c.dirLock.Close()
	}
}

// waitUntil polls cond every 50ms until it holds, ctx ends, or within
// passes; the error names what was awaited.
func waitUntil(ctx context.Context, within time.Duration, what string, cond func() bool) error {
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("gave up waiting for %s after %v", what, within)
		case <-tick.C:
		}
	}
	return nil
}
