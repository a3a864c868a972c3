package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/auth"
	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// devReplicaStopTimeout bounds a replica child's graceful stop (SIGTERM):
// its own shutdown is bounded by replicaShutdownTimeout, so past this it is
// stuck and gets SIGKILL.
const devReplicaStopTimeout = replicaShutdownTimeout + 2*time.Second

// devFetchWait is how long a replica's leader may hold its fetch long poll.
const devFetchWait = 500 * time.Millisecond

// devLeaseTTL is the replicas' lease session TTL (whole seconds).
const devLeaseTTL = 4 * time.Second

// devReplicaReadyTimeout bounds how long a replica child may take to answer
// its first GetStatus: opening Badger and reloading ranges.
const devReplicaReadyTimeout = 20 * time.Second

// devReplica is one replica of the dev cluster: a separate OS process
// running this same binary as "tenure replica", so that killing it is a real
// crash (SIGKILL: no shutdown code runs, its lease session is left to
// expire, its sockets are reset by the kernel).
type devReplica struct {
	id     string
	listen string // host:port, fixed for the cluster's life so membership stays true
	// metricsListen is its --metrics-listen host:port, fixed like listen.
	metricsListen string
	dataDir       string
	logPath       string
	leaseURL      string
	// certs is the cluster's certificate directory ("" for cleartext).
	certs string

	// cmd is the running process; nil while down.
	cmd *exec.Cmd
	// exited is closed once cmd has been reaped; exitErr is then its status.
	exited  chan struct{}
	exitErr error
	// paused is set while the process is stopped by SIGSTOP.
	paused bool
}

func (r *devReplica) url() string { return transport.Scheme() + "://" + r.listen }

// metricsURL is where the replica serves its metrics.
func (r *devReplica) metricsURL() string { return "http://" + r.metricsListen + "/metrics" }

func newDevReplica(id, listen, metricsListen, root, leaseURL, certs string) *devReplica {
	return &devReplica{id: id, listen: listen, metricsListen: metricsListen, dataDir: filepath.Join(root, id), logPath: filepath.Join(root, id+".log"), leaseURL: leaseURL, certs: certs}
}

func (r *devReplica) args() []string {
	args := []string{"replica", "--id", r.id, "--listen", r.listen, "--metrics-listen", r.metricsListen, "--data-dir", r.dataDir, "--lease", r.leaseURL,
		// The lease TTL only matters for a leader that hangs without
		// dying (a killed one refuses connections and is promoted away at
		// once); 4s keeps the followers' sessions alive through the
		// story's pause. A short fetch wait keeps long polls brief.
		"--lease-ttl", devLeaseTTL.String(), "--fetch-wait", devFetchWait.String()}
	if r.certs != "" {
		name := filepath.Join(r.certs, "replica-"+r.id)
		args = append(args, "--tls-cert", name+".pem", "--tls-key", name+"-key.pem", "--tls-ca", filepath.Join(r.certs, auth.CAFile))
	}
	return args
}

// start launches the replica process. Its output goes to its log file
// (appended across restarts), not the terminal, so the story stays readable.
func (r *devReplica) start(self string) error {
	if r.cmd != nil {
		return fmt.Errorf("replica %s already runs (pid %d)", r.id, r.cmd.Process.Pid)
	}
	logf, err := os.OpenFile(r.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("replica %s: log file: %w", r.id, err)
	}
	cmd := exec.Command(self, r.args()...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// The parent's TENURE_* settings are for the parent: the child is
	// configured by its flags alone, so the demo means the same everywhere.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TENURE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.SysProcAttr = childProcAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("replica %s: start %s: %w", r.id, self, err)
	}
	exited := make(chan struct{})
	r.cmd, r.exited, r.exitErr = cmd, exited, nil
	go func() {
		// Wait reaps the process: no zombie outlives the dev cluster.
		err := cmd.Wait()
		logf.Close()
		r.exitErr = err
		close(exited)
	}()
	return nil
}

// pause stops the process with SIGSTOP: it keeps its sockets and state
// but does nothing, like a process stuck in a long GC pause or swapped out.
func (r *devReplica) pause() error {
	if r.cmd == nil {
		return fmt.Errorf("replica %s is not running", r.id)
	}
	if err := r.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("replica %s: SIGSTOP: %w", r.id, err)
	}
	r.paused = true
	return nil
}

// resume continues a paused process (SIGCONT).
func (r *devReplica) resume() error {
	if r.cmd == nil || !r.paused {
		return nil
	}
	r.paused = false
	if err := r.cmd.Process.Signal(syscall.SIGCONT); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("replica %s: SIGCONT: %w", r.id, err)
	}
	return nil
}

// kill sends SIGKILL and reaps the process: a crash, not a shutdown.
func (r *devReplica) kill() error {
	if r.cmd == nil {
		return nil
	}
	err := r.cmd.Process.Signal(syscall.SIGKILL)
	<-r.exited
	r.cmd = nil
	if err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("replica %s: SIGKILL: %w", r.id, err)
	}
	return nil
}

// stop asks the replica to shut down (SIGTERM: it finishes in-flight calls,
// closes its store and its lease session), and kills it if it has not
// exited within devReplicaStopTimeout. Either way it is reaped.
func (r *devReplica) stop() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	// A paused process acts on SIGTERM only once continued.
	_ = r.resume()
	select {
	case <-r.exited:
	case <-time.After(devReplicaStopTimeout):
		_ = r.cmd.Process.Signal(syscall.SIGKILL)
		<-r.exited
	}
	r.cmd = nil
}

// waitReady waits until the replica answers GetStatus, its process exits,
// or devReplicaReadyTimeout passes.
func (r *devReplica) waitReady(ctx context.Context, c tenurev1connect.ReplicaServiceClient) error {
	ctx, cancel := context.WithTimeout(ctx, devReplicaReadyTimeout)
	defer cancel()
	for {
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		_, err := c.GetStatus(cctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{}))
		ccancel()
		if err == nil {
			return nil
		}
		select {
		case <-r.exited:
			return fmt.Errorf("replica %s exited before serving (%v); the end of its log %s:\n%s", r.id, r.exitErr, r.logPath, tailOf(r.logPath, 10))
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("replica %s (pid %d) did not answer on %s within %v (last error: %v); see its log %s", r.id, r.cmd.Process.Pid, r.url(), devReplicaReadyTimeout, err, r.logPath)
			}
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// tailOf returns the last n lines of a file, indented, for error messages.
func tailOf(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "    (" + err.Error() + ")"
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "    " + string(bytes.Join(lines, []byte("\n    ")))
}

// replicaClient dials a replica the way every tenure client does.
func replicaClient(hc connect.HTTPClient, url string) tenurev1connect.ReplicaServiceClient {
	return tenurev1connect.NewReplicaServiceClient(hc, url, transport.ClientOptions()...)
}
