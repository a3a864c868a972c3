package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// The ...Procs benchmarks run the same shapes against clusters whose
// servers are processes of their own, as deployed (one replica or NATS
// server per process, each with its own Go runtime), while BenchmarkTenure
// and BenchmarkJetStream host all three servers and the clients in the
// benchmark's process, sharing one Go scheduler. The clients stay here.
// CPU per record counts the servers' processes too (processCPU); scheduler
// samples count this process's goroutines only.
//
// The server binaries are built from this module's dependencies (the
// working tree's tenure, the pinned nats-server) with the go command, run
// from the bench directory; or name prebuilt ones.
var (
	tenureBinary = flag.String("bench.tenure-binary", "", "tenure binary for BenchmarkTenureProcs (default: go build it into the benchmark's temp dir)")
	natsBinary   = flag.String("bench.nats-binary", "", "nats-server binary for BenchmarkJetStreamProcs (default: go build it into the benchmark's temp dir)")
)

// BenchmarkTenureProcs is BenchmarkTenure with each replica a `tenure
// replica` process.
func BenchmarkTenureProcs(b *testing.B) {
	c, _ := startTenureProcs(b, 3)
	runTenureShapes(b, c, false)
}

// startTenureProcs starts n `tenure replica` processes (r1..rn) on
// 127.0.0.1 and waits until each serves; it returns the cluster and the
// processes' pids, in the nodes' order.
func startTenureProcs(b *testing.B, n int) (*tenureCluster, []int) {
	return startTenureProcsWith(b, n, nil)
}

// startTenureProcsWith is startTenureProcs with more arguments for replica
// i (0-based) from extra, when it is not nil.
func startTenureProcsWith(b *testing.B, n int, extra func(i int) []string) (*tenureCluster, []int) {
	// Built in tenure's own module: its go.sum, not this module's, covers
	// the server's dependencies (etcd, OpenTelemetry).
	bin := serverBinary(b, *tenureBinary, "github.com/tenurelog/tenure", "./cmd/tenure")
	ports := freePorts(b, n)
	c := &tenureCluster{}
	var pids []int
	for i := range n {
		dir := b.TempDir()
		id := fmt.Sprintf("r%d", i+1)
		listen := fmt.Sprintf("127.0.0.1:%d", ports[i])
		// Info lines (a fence, an adoption) go to the log file, not the
		// benchmark's output.
		args := []string{"replica", "--id", id, "--listen", listen, "--data-dir", filepath.Join(dir, "data")}
		if extra != nil {
			args = append(args, extra(i)...)
		}
		pids = append(pids, startServer(b, dir, bin, args...))
		hc := transport.NewHTTPClient()
		b.Cleanup(hc.CloseIdleConnections)
		address := "http://" + listen
		c.nodes = append(c.nodes, &tenureNode{
			id: id, address: address, hc: hc,
			rc: tenurev1connect.NewReplicaServiceClient(hc, address, transport.ClientOptions()...),
		})
	}
	for _, nd := range c.nodes {
		waitFor(b, 30*time.Second, nd.id+" serving", func() error {
			ctx, cancel := context.WithTimeout(b.Context(), time.Second)
			defer cancel()
			_, err := nd.rc.GetStatus(ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{}))
			return err
		})
	}
	return c, pids
}

// BenchmarkJetStreamProcs is BenchmarkJetStream with each server a
// nats-server process, configured as startJetStreamCluster configures the
// in-process ones (sync_interval: always, routes on 127.0.0.1).
func BenchmarkJetStreamProcs(b *testing.B) {
	runJetStreamShapes(b, startJetStreamProcs(b))
}

// startJetStreamProcs starts three nats-server processes configured as
// startJetStreamCluster configures the in-process servers and waits until
// their JetStream cluster has formed.
func startJetStreamProcs(b *testing.B) *jsCluster {
	bin := serverBinary(b, *natsBinary, "", "github.com/nats-io/nats-server/v2")
	const n = 3
	ports := freePorts(b, 2*n) // client ports, then route ports
	routes := make([]string, n)
	for i := range n {
		routes[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", ports[n+i])
	}
	c := &jsCluster{}
	for i := range n {
		dir := b.TempDir()
		conf := fmt.Sprintf(`server_name: js%d
listen: 127.0.0.1:%d
jetstream { store_dir: %q, sync_interval: always }
cluster { name: bench, listen: 127.0.0.1:%d, routes: [%s] }
`, i, ports[i], filepath.Join(dir, "store"), ports[n+i], strings.Join(routes, ", "))
		path := filepath.Join(dir, "nats.conf")
		if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
			b.Fatal(err)
		}
		startServer(b, dir, bin, "-c", path)
		c.urls = append(c.urls, fmt.Sprintf("nats://127.0.0.1:%d", ports[i]))
	}
	// The meta leader is elected once the routes are up: account info
	// answers from then on.
	waitFor(b, 60*time.Second, "JetStream cluster formed", func() error {
		nc, err := c.connect()
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(b.Context(), jsAttemptTimeout)
		defer cancel()
		_, err = js.AccountInfo(ctx)
		return err
	})
	return c
}

// serverBinary returns prebuilt if set, else builds pkg into tb's temp dir
// (the go build cache makes every build after the first a link): in the
// directory of module, a dependency of this one (its replace target for
// tenure), or in this module if module is empty.
func serverBinary(tb testing.TB, prebuilt, module, pkg string) string {
	tb.Helper()
	if prebuilt != "" {
		return prebuilt
	}
	dir := "."
	if module != "" {
		out, err := exec.CommandContext(tb.Context(), "go", "list", "-m", "-f", "{{.Dir}}", module).Output()
		if err != nil {
			tb.Fatalf("find module %s (run from the bench directory, or pass its binary by flag): %v", module, err)
		}
		dir = strings.TrimSpace(string(out))
	}
	out := filepath.Join(tb.TempDir(), "server")
	args := []string{"build", "-o", out}
	if raceEnabled {
		// A race-enabled benchmark (make bench-check) checks that the
		// benchmarks run, not how fast: race-enabled servers then reuse
		// the packages the race tests compiled instead of building every
		// dependency again.
		args = append(args, "-race")
	}
	cmd := exec.CommandContext(tb.Context(), "go", append(args, pkg)...)
	cmd.Dir = dir
	if msg, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build %s in %s (run from the bench directory, or pass its binary by flag): %v\n%s", pkg, dir, err, msg)
	}
	return out
}

// startServer starts bin with args, its output in dir/server.log, counts
// its CPU as the benchmark's (AddServerProcess), and stops it when tb ends:
// SIGTERM (both servers then stop gracefully), SIGKILL after 10s. It
// returns the process's pid.
func startServer(tb testing.TB, dir, bin string, args ...string) int {
	tb.Helper()
	logFile, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// This process's sync counters are inherited by the processes it
	// starts once they are open, and only then: open them first, so that
	// syncs/record counts the server's (an error is reported where the
	// metric is, by runShapeCounting).
	_, _ = processSyncs()
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		tb.Fatalf("start %s: %v", bin, err)
	}
	removeCPU := AddServerProcess(cmd.Process.Pid)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	tb.Cleanup(func() {
		defer logFile.Close()
		// Counted no longer: after the wait below the pid may be reused.
		removeCPU()
		_ = cmd.Process.Signal(syscall.SIGTERM)
		var err error
		select {
		case err = <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			err = errors.Join(errors.New("did not stop within 10s of SIGTERM; killed"), <-exited)
		}
		if err != nil && !tb.Failed() {
			// A server that failed is worth its log; a clean stop is not.
			msg, _ := os.ReadFile(logFile.Name())
			tb.Logf("%s %s: %v; last of its log:\n%s", filepath.Base(bin), strings.Join(args, " "), err, tail(msg, 2000))
		}
	})
	return cmd.Process.Pid
}

// tail is the last n bytes of b.
func tail(b []byte, n int) []byte {
	return b[max(0, len(b)-n):]
}
