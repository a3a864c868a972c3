package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/tenurelog/tenure/internal/flagusage"
	"github.com/tenurelog/tenure/pkg/auth"
	"github.com/tenurelog/tenure/pkg/transport"
)

func init() {
	commands["dev"] = command{summary: "run the embedded dev cluster (etcd, lease, 3 replica processes, promoter) and a scripted failover", run: runDev,
		// It stops its replica processes first, each bounded on its own.
		stopWithin: devReplicaStopTimeout + stopWithin}
}

const devHelp = `Usage: tenure dev [flags]

Runs a whole tenure cluster on loopback: an embedded etcd, the lease service
and a promoter in this process, and three replicas (r1, r2, r3) as separate
processes of this same binary, so a leader can really be killed. Then it
tells a short story, printing each step: create a range, wait for its first
leader, append records; pause the followers (SIGSTOP) and append one more
record, which the leader writes but cannot commit; SIGKILL the leader's
process and resume the followers; watch the promotion (epoch, new leader,
committed bound, truncations, timings, trace id); append and read again;
compare every replica's epoch history and divergence point; restart the old
leader and watch it rejoin as a follower, its uncommitted record cut.

Tracing follows the OTEL_* environment (see pkg/telemetry): with
OTEL_EXPORTER_OTLP_ENDPOINT set, every process exports its spans there and
the promotion's trace id can be looked up in Jaeger. The Jaeger of 'make
up' listens on https://127.0.0.1:4318 with mutual TLS: also set
OTEL_EXPORTER_OTLP_CERTIFICATE, OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and
OTEL_EXPORTER_OTLP_CLIENT_KEY to bin/compose-certs' ca.pem, operator.pem
and operator-key.pem (README, "Compose quickstart"). The story says
"exported" only once this process's exporter delivered the trace's spans,
and NOT exported, with the exporter's error, when the endpoint refused
them.

Without --keep it stops everything when the story ends. With --keep the
cluster keeps running for tenurectl until Ctrl-C. Ctrl-C stops everything
at any point: replica processes are stopped and reaped, etcd is stopped, and
the data directory is removed unless --data-dir named it.

Run again on a kept --data-dir (also one an older tenure wrote: an upgrade
in place), it brings that cluster back as it was, every range and record,
and skips the story, whose range already exists (--range NAME tells it on a
new one). Use the same --base-port and --insecure as the first run: the
ranges record their replicas' addresses, and a replica that moved is named
with the command that records its new address.

With --json, stdout carries only machine-readable lines and the story goes
to stderr: one JSON object per process as it comes up, the same ready line
the servers print (see 'tenure replica --help'), e.g.
  {"ready":true,"service":"replica","id":"r1","address":"http://127.0.0.1:7101","pid":4242}
with service etcd, lease, replica (one per replica) or promoter; etcd, the
lease service and the promoter run in this process, so their pid is this
one's. A replica restarted by the story prints a new line with its new pid:
the last line for an id is the current process.

Ports: with --base-port 7000 (the default) the lease service listens on
7000, the replicas on 7101-7103 and the promoter on 7200, the services'
own defaults, so tenurectl needs no flags. Prometheus metrics are served
at http://127.0.0.1:7250/metrics (the lease service and the promoter, which
run in this process) and 7251-7253 (the replicas): each process's line and
ready line ("metrics") name its URL. If one is taken, free ports are used
and printed. --base-port 0 always picks free ports.

Flags (env TENURE_<FLAG> as fallback):
`

// devStartTimeout bounds bringing the whole cluster up.
const devStartTimeout = 60 * time.Second

func runDev(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "", "directory for etcd, the replicas' data and every log; kept on exit (default: a temp dir, removed on exit). One tenure dev at a time: it locks <dir>/"+devLockFile+", and a second one on the same directory fails at once")
	keep := fs.Bool("keep", false, "keep the cluster running after the story, for tenurectl, until Ctrl-C")
	basePort := fs.Int("base-port", 7000, "lease port; replicas on base+101.., promoter on base+200, metrics on base+250.. (0: free ports)")
	rangeID := fs.String("range", "demo", "id of the range the story creates")
	records := fs.Int("records", 5, "records appended before and again after the failover (1-1000)")
	asJSON := fs.Bool("json", false, "print one JSON ready line per process on stdout (see above); the story goes to stderr")
	insecure := fs.Bool("insecure", false, "run every hop in cleartext, without certificates (by default the dev cluster makes its own CA and certificates in <data-dir>/certs and runs mutual TLS)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), devHelp)
		flagusage.Print(fs.Output(), fs)
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *records < 1 || *records > 1000 {
		return usagef("--records %d: want 1 to 1000", *records)
	}
	if *basePort < 0 || *basePort > 65535-300 {
		return usagef("--base-port %d: want 0 (free ports) or a port up to %d", *basePort, 65535-300)
	}
	out := os.Stdout
	c := &devCluster{}
	if *asJSON {
		out = os.Stderr
		c.announce = func(l readyLine) {
			// Nothing to do about a stdout that fails: the story goes on.
			_ = announceReady(os.Stdout, "", l)
		}
	}
	if *dataDir != "" {
		if err := os.MkdirAll(*dataDir, 0o755); err != nil {
			return fmt.Errorf("--data-dir: %w", err)
		}
		c.dir = *dataDir
	} else {
		dir, err := os.MkdirTemp("", "tenure-dev-")
		if err != nil {
			return fmt.Errorf("temp dir: %w", err)
		}
		c.dir, c.removeDir = dir, true
	}
	if abs, err := filepath.Abs(c.dir); err == nil {
		c.dir = abs
	}
	// Before anything in the directory is opened: another tenure dev may
	// be using it (lockDataDir).
	lock, err := lockDataDir(c.dir)
	if err != nil {
		if c.removeDir {
			os.RemoveAll(c.dir)
		}
		return err
	}
	c.dirLock = lock
	defer func() {
		fmt.Fprintf(out, "\nstopping: promoter, replicas, lease service, etcd")
		if c.removeDir {
			fmt.Fprintf(out, "; removing %s", c.dir)
		}
		fmt.Fprintln(out)
		c.close()
		fmt.Fprintln(out, "stopped.")
	}()

	if !*insecure {
		// Secure by default, the demo too: a CA and certificates of the
		// cluster's own, this process (lease service, promoter and the
		// story's client) with the promoter, operator, producer and
		// consumer roles, each replica with its own.
		c.certs = filepath.Join(c.dir, "certs")
		if err := setupDevTLS(c.certs, c.log); err != nil {
			return err
		}
		defer transport.SetTLS(nil)
	}
	ports, note, err := reservePorts(*basePort)
	if err != nil {
		return err
	}
	kept := "removed on exit"
	if !c.removeDir {
		kept = "kept on exit"
	}
	fmt.Fprintf(out, "tenure dev: a whole cluster on loopback; data in %s (%s)\n", c.dir, kept)
	if note != "" {
		fmt.Fprintf(out, "  note: %s\n", note)
	}
	sctx, cancel := context.WithTimeout(ctx, devStartTimeout)
	err = startDevCluster(sctx, c, ports, out)
	cancel()
	if err := interrupted(ctx, out, err); err != nil {
		return fmt.Errorf("start the dev cluster: %w", err)
	}
	if ctx.Err() != nil {
		return nil
	}

	began := time.Now()
	st := &story{c: c, w: out, rangeID: *rangeID, records: *records}
	err = st.run(ctx)
	reused := errors.Is(err, errStoryRangeExists)
	if reused {
		// Running again on a kept --data-dir (the same version's, or an
		// older tenure's being upgraded in place) must bring its ranges
		// back, not fail on the story's CreateRange and stop them all.
		err = nil
		fmt.Fprintf(out, "\nrange %q already exists: %s holds the cluster of an earlier run, which serves again as it was; no story (--range NAME tells it on a new range).\n", *rangeID, c.dir)
		warnMovedReplicas(ctx, out, c)
	}
	if err := interrupted(ctx, out, err); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return nil
	}
	if !reused {
		fmt.Fprintf(out, "\nthe story took %v.\n", since(began))
	}
	if !*keep {
		fmt.Fprintf(out, "Run 'make demo ARGS=--keep' (or 'bin/tenure dev --keep') to keep the cluster running for tenurectl.\n")
		return nil
	}
	printTryTenurectl(out, c, *rangeID)
	<-ctx.Done()
	return nil
}

// interrupted turns an error caused by Ctrl-C into a message and nil: an
// interrupted demo is not a failure.
func interrupted(ctx context.Context, out io.Writer, err error) error {
	if err != nil && ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, ctx.Err())) {
		fmt.Fprintln(out, "\ninterrupted.")
		return nil
	}
	if err == nil && ctx.Err() != nil {
		fmt.Fprintln(out, "\ninterrupted.")
	}
	return err
}

func printTryTenurectl(out io.Writer, c *devCluster, rangeID string) {
	flags := ""
	if s := transport.Scheme(); c.leaseURL() != s+"://127.0.0.1:7000" || c.promoterURL() != s+"://127.0.0.1:7200" {
		flags = fmt.Sprintf(" --lease %s --promoter %s", c.leaseURL(), c.promoterURL())
	}
	exports := ""
	if c.certs != "" {
		exports = fmt.Sprintf("  export TENURECTL_CACERT=%s TENURECTL_CERT=%s TENURECTL_KEY=%s\n",
			filepath.Join(c.certs, auth.CAFile), filepath.Join(c.certs, "operator.pem"), filepath.Join(c.certs, "operator-key.pem"))
	}
	var members string
	for i, r := range c.replicas {
		if i > 0 {
			members += ","
		}
		members += r.id + "=" + r.url()
	}
	fmt.Fprintf(out, `
The cluster keeps running (--keep). In another terminal, try (build it with 'make build'):

  export PATH=$PWD/bin:$PATH
%[5]s  tenurectl%[1]s status
  tenurectl%[1]s status %[2]s
  tenurectl%[1]s produce %[2]s hello world
  tenurectl%[1]s consume %[2]s --from 0
  tenurectl%[1]s consume %[2]s --follow            # Ctrl-C to stop
  tenurectl%[1]s epochs %[2]s
  tenurectl%[1]s promote %[2]s --preferred r3 --reason "planned handover"
  tenurectl%[1]s transitions %[2]s
  tenurectl%[1]s range create orders --replicas %[3]s --preferred r2
  tenurectl%[1]s range list
  tenurectl%[1]s bench orders --records 5000 --concurrency 8
  tenurectl journal dump %[4]s

Replica processes: %[6]s (the PID column of 'tenurectl status').
Kill a leader yourself ('tenurectl status %[2]s' names it) and
watch 'tenurectl transitions %[2]s'. Ctrl-C here stops everything.
`, flags, rangeID, members, filepath.Join(c.replica("r1").dataDir, "journal", rangeID+".journal"), exports, replicaPids(c.replicas, nil))
}

// setupDevTLS makes the dev cluster's certificates in dir and installs this
// process's.
func setupDevTLS(dir string, log *slog.Logger) error {
	specs := append(auth.DefaultSpecs([]string{"r1", "r2", "r3"}, nil, nil, nil), auth.Spec{
		Name:     "dev",
		Identity: auth.Identity{Roles: []auth.Role{auth.RolePromoter, auth.RoleOperator, auth.RoleProducer, auth.RoleConsumer}},
	})
	if _, err := auth.Init(dir, specs); err != nil {
		return fmt.Errorf("dev certificates: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	src, err := auth.Load(auth.Files{Cert: filepath.Join(dir, "dev.pem"), Key: filepath.Join(dir, "dev-key.pem"), CA: filepath.Join(dir, auth.CAFile)}, log)
	if err != nil {
		return err
	}
	transport.SetTLS(src)
	return nil
}
