// Command chaos is the driver of `make chaos-compose` (deploy/compose/chaos.sh):
// it breaks a running compose stack on purpose and judges what the
// replicated log did with the shared chaos checkers (internal/chaos/check).
//
// It runs on the host, not in the stack's network: the faults are docker
// operations (kill, pause, network disconnect, stop/start, editing a file in
// a stopped container's volume), which need the host's docker CLI. The
// workload reaches the replicas at their published ports: its HTTP client
// dials "replica-1:7100" at wherever replica-1's port is published now, so
// it uses the same URLs the replicas use among themselves, and the driver
// re-reads the port whenever a container starts or rejoins the network.
// (Clients that follow the advertised leader address, like tenurectl
// produce, would need the network; the workload finds the leader by asking
// every replica it knows.)
//
// Each scenario runs on a range of its own, created for it:
//
//  1. create the range on replica-1..3, wait for a leader (replica-4 is
//     the spare: idle until replace-replica makes it a member, in place of
//     one of the three; from then on the checks below cover the range's
//     new members, and the removed replica, which dropped its copy, is
//     no member whose log must agree);
//  2. start the workload (concurrent appends and reads, each recorded with
//     its outcome) and a poller (every replica's HWM, fenced epoch and epoch
//     history, every 100ms);
//  3. after traffic, inject the fault, heal it, and wait until the faulted
//     replicas have rejoined: that window is "during";
//  4. check liveness: within the bound after healing (check.LivenessBound,
//     from the lease TTL and the promoter's timings) the range must have
//     served an acknowledged append and a read, and the elected promoter's
//     view must agree with the replicas' (a range it calls healthy is led
//     at its epoch by a leader with a valid lease), or the run is stuck;
//  5. stop the workload, append one final record (the run counts only if
//     it is acknowledged), wait until all members hold the same log;
//  6. read the final state through tenurectl: the transition records
//     (tenurectl transitions) and, from a copy of each stopped member's
//     data directory, its whole log of the range (tenurectl log dump);
//  7. check.Check the run, print the report, add it to the scoreboard.
//
// The exit status is non-zero if any counted run is unsafe, any run is
// stuck (the scoreboard's stuck column), any run is void
// (no traffic before or during the fault, or the final append failed), or a
// scenario's expectation failed (no promotion after the leader's fault, a
// corrupted journal not rebuilt, the replicas not converging).
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/tenurelog/tenure/internal/chaos/check"
	"github.com/tenurelog/tenure/pkg/auth"
)

// tenurectlTLSEnv is the environment that gives tenurectl the same
// certificate.
var tenurectlTLSEnv []string

type config struct {
	project   string
	tenurectl string
	workDir   string
	seed      int64
	scenarios []string
	clients   int
	pace      time.Duration
	leaseTTL  time.Duration
	// diskFullDir is the host directory that is diskFullReplica's /data
	// (a tmpfs of a fixed size), for the disk-full scenario.
	diskFullDir string
}

func main() {
	var cfg config
	var scenarios string
	flag.StringVar(&cfg.project, "project", "", "the compose project to break (required; its containers are found by their compose labels)")
	flag.StringVar(&cfg.tenurectl, "tenurectl", "bin/static/tenurectl", "the tenurectl binary the final state is read with")
	flag.StringVar(&cfg.workDir, "work", "", "directory for copies of the replicas' data (required; the caller removes it)")
	flag.Int64Var(&cfg.seed, "seed", 0, "seed of the run's choices (which follower, how long); 0 picks one from the clock")
	flag.StringVar(&scenarios, "scenarios", strings.Join(allScenarios, ","), "comma-separated scenarios to run, in order")
	flag.IntVar(&cfg.clients, "clients", 3, "concurrent workload clients")
	flag.DurationVar(&cfg.pace, "pace", 10*time.Millisecond, "a client's pause between operations (bounds the history, and so the linearizability check)")
	flag.DurationVar(&cfg.leaseTTL, "lease-ttl", 2*time.Second, "the replicas' lease TTL in the stack (the lease service's default); the pause lasts past it")
	flag.StringVar(&cfg.diskFullDir, "disk-full-dir", "", "the host directory bound as "+diskFullReplica+"'s /data, a small tmpfs (disk-full fills it; chaos.sh mounts it)")
	var files auth.Files
	flag.StringVar(&files.CA, "cacert", "", "CA certificate of a stack that runs mutual TLS (with --cert and --key: the operator's, which may also produce and consume)")
	flag.StringVar(&files.Cert, "cert", "", "client certificate")
	flag.StringVar(&files.Key, "key", "", "its key")
	flag.Parse()
	if files.Configured() {
		src, err := auth.Load(files, nil)
		if err != nil {
			fmt.Fprintf(os.Stderr, "chaos: %v\n", err)
			os.Exit(2)
		}
		tlsSource = src
		tenurectlTLSEnv = []string{"TENURECTL_CACERT=" + files.CA, "TENURECTL_CERT=" + files.Cert, "TENURECTL_KEY=" + files.Key}
	}
	if cfg.project == "" || cfg.workDir == "" {
		fmt.Fprintln(os.Stderr, "chaos: --project and --work are required")
		os.Exit(2)
	}
	if cfg.seed == 0 {
		cfg.seed = time.Now().UnixNano() % 1_000_000_000
	}
	for _, s := range strings.Split(scenarios, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if scenarioFuncs[s] == nil {
			fmt.Fprintf(os.Stderr, "chaos: unknown scenario %q (known: %s)\n", s, strings.Join(allScenarios, ", "))
			os.Exit(2)
		}
		cfg.scenarios = append(cfg.scenarios, s)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, cfg)
	stop()
	os.Exit(code)
}

func logf(format string, args ...any) {
	fmt.Printf("[chaos %s] %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

func run(ctx context.Context, cfg config) int {
	start := time.Now()
	logf("project %s, seed %d, scenarios %s (reproduce: CHAOS_SEED=%d)", cfg.project, cfg.seed, strings.Join(cfg.scenarios, ","), cfg.seed)
	s, err := discover(ctx, cfg.project)
	if err != nil {
		logf("FAIL: %v", err)
		return 1
	}
	var board check.Scoreboard
	var failures []string
	incarnation := map[string]int{}
	for i, name := range cfg.scenarios {
		if ctx.Err() != nil {
			failures = append(failures, "interrupted")
			break
		}
		sc := &scenario{
			cfg: cfg, name: name, stack: s, incarnation: incarnation,
			seed: cfg.seed*100 + int64(i),
			rng:  rand.New(rand.NewPCG(uint64(cfg.seed), uint64(i))),
		}
		sc.rangeID = fmt.Sprintf("chaos-%s-%d", name, sc.seed)
		logf("=== scenario %s: range %s, seed %d", name, sc.rangeID, sc.seed)
		runObs, err := sc.run(ctx)
		if err != nil {
			failures = append(failures, fmt.Sprintf("%s: %v", name, err))
			logf("scenario %s FAILED to run: %v", name, err)
			if runObs == nil {
				continue
			}
		}
		rep := check.Check(*runObs)
		printReport(name, *runObs, rep, sc)
		board.Add(name, *runObs, rep)
		if v := runObs.Void(); v != "" {
			failures = append(failures, fmt.Sprintf("%s: void run (%s)", name, v))
		}
		for _, e := range sc.expectFailed {
			failures = append(failures, fmt.Sprintf("%s: %s", name, e))
		}
	}
	fmt.Println()
	fmt.Printf("compose chaos scoreboard: project %s, seed %d, %s\n", cfg.project, cfg.seed, time.Since(start).Round(time.Second))
	if err := board.Render(os.Stdout); err != nil {
		logf("render: %v", err)
	}
	if !board.Safe() {
		failures = append(failures, fmt.Sprintf("unsafe or stuck seeds: %v", board.Failed()))
	}
	if len(failures) > 0 {
		fmt.Printf("FAIL (seed %d):\n  %s\n", cfg.seed, strings.Join(failures, "\n  "))
		return 1
	}
	fmt.Printf("PASS (seed %d)\n", cfg.seed)
	return 0
}

func printReport(name string, r check.Run, rep check.Report, sc *scenario) {
	ops := rep.OpsByOutcome
	logf("report %s (seed %d): ops append ok/failed/unknown %d/%d/%d, read ok/failed/unknown %d/%d/%d; traffic before %d, during %d; final append ok %t",
		name, rep.Seed,
		ops[check.Append][check.OK], ops[check.Append][check.Failed], ops[check.Append][check.Unknown],
		ops[check.Read][check.OK], ops[check.Read][check.Failed], ops[check.Read][check.Unknown],
		r.TrafficBefore, r.TrafficDuring, r.FinalAppendOK)
	logf("report %s: lost %d, duplicates %d, inconsistent offsets %d, divergent prefixes %d, hwm regressions %d, stale-epoch %d, acked truncated %d, failed-but-applied %d, stuck %d, linearizable %s, check %s",
		name, rep.Lost, rep.Duplicates, rep.InconsistentOffsets, rep.DivergentPrefixes, rep.HWMRegressions,
		rep.StaleEpochAcceptances, rep.AckedTruncated, rep.FailedButApplied, rep.Stuck, rep.Linearizable, rep.CheckTime.Round(time.Millisecond))
	logf("report %s: %d truncations from transition records (%d without a fence-time history, not attributable); %d HWM samples; %d epoch events; final logs of %d replicas",
		name, len(r.Truncations), sc.unattributed, len(r.HWMs), len(r.Epochs), len(r.Final))
	if v := r.Void(); v != "" {
		logf("report %s: VOID: %s", name, v)
	}
	for _, p := range rep.Problems {
		logf("report %s: problem: %s", name, p)
	}
	for _, e := range sc.expectFailed {
		logf("report %s: EXPECTATION FAILED: %s", name, e)
	}
}
