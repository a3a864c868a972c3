package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tenurelog/tenure/internal/metrics"
)

// The tenure binary, built once for every test that runs it: tenure dev
// re-executes itself as its replicas, so the tests need the real binary,
// not the test binary.
var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
	buildDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

func buildTenure(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary and runs a whole cluster")
	}
	// go test runs under the go tool, so it is on PATH; its absence is a
	// broken environment, not a reason to pass without testing the demo.
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go tool to build the binary with: %v", err)
	}
	buildOnce.Do(func() {
		if buildDir, buildErr = os.MkdirTemp("", "tenure-dev-test-"); buildErr != nil {
			return
		}
		builtBin = filepath.Join(buildDir, "tenure")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if out, err := exec.CommandContext(ctx, goTool, "build", "-o", builtBin, ".").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

// devRun is a running "tenure dev" whose output the test reads as it comes.
type devRun struct {
	cmd    *exec.Cmd
	tmp    string
	mu     sync.Mutex
	out    strings.Builder // stdout and stderr, as they came
	stdout strings.Builder // stdout alone
	lines  chan string
	exited chan error
}

func startDev(t *testing.T, bin string, args ...string) *devRun {
	t.Helper()
	d := &devRun{tmp: t.TempDir(), lines: make(chan string, 1024), exited: make(chan error, 1)}
	d.cmd = exec.Command(bin, append([]string{"dev", "--base-port", "0"}, args...)...)
	// Its temp dir goes under ours, so the test can see it removed.
	d.cmd.Env = append(os.Environ(), "TMPDIR="+d.tmp)
	pr, pw := io.Pipe()
	opr, opw := io.Pipe()
	d.cmd.Stdout, d.cmd.Stderr = opw, pw
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var readers sync.WaitGroup
	read := func(r io.Reader, alone *strings.Builder) {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			d.mu.Lock()
			d.out.WriteString(sc.Text() + "\n")
			if alone != nil {
				alone.WriteString(sc.Text() + "\n")
			}
			d.mu.Unlock()
			select {
			case d.lines <- sc.Text():
			default:
			}
		}
	}
	readers.Go(func() { read(pr, nil) })
	readers.Go(func() { read(opr, &d.stdout) })
	go func() {
		readers.Wait()
		close(d.lines)
	}()
	go func() {
		// Wait returns once the process is gone and its output copied.
		err := d.cmd.Wait()
		pw.Close()
		opw.Close()
		d.exited <- err
	}()
	t.Cleanup(func() {
		// A failed test must not leave a cluster behind: SIGKILL takes the
		// replicas with it (they die with their parent).
		_ = d.cmd.Process.Kill()
	})
	return d
}

func (d *devRun) output() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.out.String()
}

// wait waits for the process to exit within the bound.
func (d *devRun) wait(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case err := <-d.exited:
		return err
	case <-time.After(within):
		t.Fatalf("tenure dev did not finish within %v; output so far:\n%s", within, d.output())
		return nil
	}
}

// waitLine waits for an output line containing want.
func (d *devRun) waitLine(t *testing.T, want string, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case line, ok := <-d.lines:
			if !ok {
				t.Fatalf("tenure dev ended without printing %q:\n%s", want, d.output())
			}
			if strings.Contains(line, want) {
				return
			}
		case <-deadline:
			t.Fatalf("tenure dev did not print %q within %v:\n%s", want, within, d.output())
		}
	}
}

// checkCleanedUp checks that every replica process the run printed is gone
// and its temp dir removed.
func (d *devRun) checkCleanedUp(t *testing.T) {
	t.Helper()
	out := d.output()
	pids := regexp.MustCompile(`pid (\d+)`).FindAllStringSubmatch(out, -1)
	if len(pids) < 3 {
		t.Errorf("output names %d replica pids, want at least 3:\n%s", len(pids), out)
	}
	for _, m := range pids {
		pid, _ := strconv.Atoi(m[1])
		// The replicas were children of tenure dev, which reaped them; a
		// pid that still answers signal 0 is a replica left running (or,
		// rarely, a reused pid: then it is not a tenure replica).
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			if b, _ := os.ReadFile("/proc/" + m[1] + "/cmdline"); strings.Contains(string(b), "replica") {
				t.Errorf("replica process %d still runs after tenure dev exited", pid)
			}
		}
	}
	left, _ := filepath.Glob(filepath.Join(d.tmp, "tenure-dev-*"))
	if len(left) > 0 {
		t.Errorf("tenure dev left its temp dir behind: %v", left)
	}
}

// The demo end to end: a real leader process is SIGKILLed, a new leader is
// promoted, and every acknowledged record is readable from it afterwards.
func TestDevStory(t *testing.T) {
	bin := buildTenure(t)
	d := startDev(t, bin, "--json")
	start := time.Now()
	if err := d.wait(t, 90*time.Second); err != nil {
		t.Fatalf("tenure dev: %v\n%s", err, d.output())
	}
	t.Logf("tenure dev took %v", time.Since(start))
	out := d.output()
	// The first leader is the preferred r1, unless a loaded machine made
	// its fence answer too late to count.
	first := "r1"
	if m := regexp.MustCompile(`(r\d) leads at epoch 1,`).FindStringSubmatch(out); m != nil {
		first = m[1]
	} else {
		t.Errorf("output does not name the first leader")
	}
	for _, want := range []string{
		"pause the followers (SIGSTOP",
		"kill the leader: SIGKILL " + first,
		"acknowledged records are there, each at the offset it was acknowledged at",
		first + " vs leader",
		first + " (pid",
		"follows",
		"stopped.",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	// Usually one promotion at epoch 2; on a loaded machine there may be
	// another before the story sees a serving leader.
	if m := regexp.MustCompile(`epoch \d+ -> \d+: (r\d) leads`).FindStringSubmatch(out); m == nil || m[1] == first {
		t.Errorf("after killing %s the new leader is %v, want another replica", first, m)
	}
	// The record the dead leader wrote without a quorum is either cut (the
	// usual case) or was carried to a follower and kept: never lost if it
	// was acknowledged, and either way the histories end up agreeing.
	if !regexp.MustCompile(`the in-doubt record is gone|still holds "in-doubt"|"in-doubt" was acknowledged`).MatchString(out) {
		t.Errorf("output does not say what became of the in-doubt record")
	}
	if !regexp.MustCompile(`trace id: [0-9a-f]{32}`).MatchString(out) {
		t.Errorf("output lacks the promotion's trace id")
	}
	checkDevReadyLines(t, d, first)
	if t.Failed() {
		t.Logf("output:\n%s", out)
	}
	d.checkCleanedUp(t)
}

// Ctrl-C while the cluster is kept running stops everything: replica
// processes reaped, temp dir removed.
func TestDevKeepInterrupt(t *testing.T) {
	bin := buildTenure(t)
	d := startDev(t, bin, "--keep", "--records", "1")
	d.waitLine(t, "The cluster keeps running", 60*time.Second)
	checkDevMetrics(t, d.output())
	checkStrayClientLogged(t, d)
	if err := d.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := d.wait(t, 30*time.Second); err != nil {
		t.Fatalf("tenure dev after Ctrl-C: %v\n%s", err, d.output())
	}
	if !strings.Contains(d.output(), "stopped.") {
		t.Errorf("output lacks %q:\n%s", "stopped.", d.output())
	}
	d.checkCleanedUp(t)
}

// checkDevReadyLines checks what tenure dev --json printed on stdout: only
// ready lines, one per process as it came up: etcd, the lease service and
// the promoter in dev's own process, each replica in its own, and the
// restarted replica again with its new pid, the one the story names.
func checkDevReadyLines(t *testing.T, d *devRun, restarted string) {
	t.Helper()
	d.mu.Lock()
	stdout := d.stdout.String()
	d.mu.Unlock()
	pids := map[string][]int{}
	for _, line := range strings.Split(strings.TrimSuffix(stdout, "\n"), "\n") {
		var l readyLine
		dec := json.NewDecoder(strings.NewReader(line))
		dec.DisallowUnknownFields()
		err := dec.Decode(&l)
		// The dev cluster runs mutual TLS (its embedded etcd is cleartext,
		// on loopback, and only this process talks to it).
		scheme := "https"
		if l.Service == "etcd" {
			scheme = "http"
		}
		if err != nil || !l.Ready || !strings.HasPrefix(l.Address, scheme+"://127.0.0.1:") {
			t.Errorf("stdout line %q is not a ready line (%v)", line, err)
			continue
		}
		if l.Service != "etcd" && !strings.HasPrefix(l.Metrics, "http://127.0.0.1:") {
			t.Errorf("ready line %q names no metrics URL", line)
		}
		key := l.Service
		if l.Service == "replica" {
			key += " " + l.ID
		}
		pids[key] = append(pids[key], l.PID)
	}
	self := d.cmd.Process.Pid
	for _, key := range []string{"etcd", "lease", "promoter"} {
		if got := pids[key]; len(got) != 1 || got[0] != self {
			t.Errorf("%s ready lines name pids %v, want one line with dev's pid %d", key, got, self)
		}
	}
	for _, id := range devReplicaIDs {
		got := pids["replica "+id]
		want := 1
		if id == restarted {
			want = 2
		}
		if len(got) != want || slices.Contains(got, self) || (want == 2 && got[0] == got[1]) {
			t.Errorf("replica %s ready lines name pids %v, want %d line(s) with pids of its own", id, got, want)
			continue
		}
		if id == restarted && !strings.Contains(d.output(), fmt.Sprintf("%s (pid %d) follows", id, got[1])) {
			t.Errorf("the restarted %s's last ready line names pid %d, which the story does not", id, got[1])
		}
		// After the restart the story lists every replica's current pid:
		// the ones printed at start-up are stale for the restarted one.
		now := fmt.Sprintf("%s pid %d", id, got[0])
		if id == restarted {
			now = fmt.Sprintf("%s pid %d (restarted; was %d)", id, got[1], got[0])
		}
		if m := regexp.MustCompile(`replica processes now: .*`).FindString(d.output()); !strings.Contains(m, now) {
			t.Errorf("the story's pids after the restart (%q) lack %q", m, now)
		}
	}
}

// checkDevMetrics scrapes every metrics URL tenure dev printed: one for
// its own process (the lease service and the promoter) and one per
// replica, and checks they describe the cluster after the story: one
// leader, an elected promoter that promoted, no range without a leader.
func checkDevMetrics(t *testing.T, out string) {
	t.Helper()
	urls := map[string]bool{}
	for _, m := range regexp.MustCompile(`metrics (http://127\.0\.0\.1:\d+/metrics)`).FindAllStringSubmatch(out, -1) {
		urls[m[1]] = true
	}
	if len(urls) != 1+len(devReplicaIDs) {
		t.Fatalf("output names metrics URLs %v, want %d (dev's and each replica's):\n%s", urls, 1+len(devReplicaIDs), out)
	}
	var leaders, promotions float64
	elected := 0
	for u := range urls {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s, err := metrics.Scrape(ctx, http.DefaultClient, u)
		cancel()
		if err != nil {
			t.Errorf("scrape %s: %v", u, err)
			continue
		}
		leaders += s.Sum(`tenure_replica_ranges{role="leader"}`)
		if v, _ := s.Get("tenure_promoter_elected"); v == 1 {
			elected++
			promotions = s.Sum("tenure_promoter_promotions_total")
			if v, ok := s.Get("tenure_promoter_ranges_without_leader"); !ok || v != 0 {
				t.Errorf("%s: tenure_promoter_ranges_without_leader = %v (exported %v), want 0", u, v, ok)
			}
			// The lease service and the promoter share dev's registry,
			// and so the RPC series: the story called both.
			for _, svc := range []string{"LeaseService", "PromoterService"} {
				n := 0.0
				for k, v := range s {
					if strings.HasPrefix(k, "tenure_rpc_server_handled_total{") && strings.Contains(k, "/tenure.v1."+svc+"/") {
						n += v
					}
				}
				if n == 0 {
					t.Errorf("%s: no %s RPCs counted", u, svc)
				}
			}
		}
	}
	if leaders != 1 || elected != 1 || promotions < 2 {
		t.Errorf("metrics: %v replicas lead, %d promoters elected, %v promotions; want 1, 1 and at least 2 (first leader, failover)", leaders, elected, promotions)
	}
}

// checkStrayClientLogged sends a cleartext request to the dev cluster's
// TLS lease port: net/http's complaint about it belongs in dev.log with the
// cluster's other logs, not bare on stderr in the middle of the story (it
// was printed there, as was every auth refusal of the in-process servers).
func checkStrayClientLogged(t *testing.T, d *devRun) {
	t.Helper()
	out := d.output()
	lease := regexp.MustCompile(`lease\s+https://(127\.0\.0\.1:\d+)`).FindStringSubmatch(out)
	dir := regexp.MustCompile(`data in (\S+)`).FindStringSubmatch(out)
	if lease == nil || dir == nil {
		t.Fatalf("no lease address or data dir in the output:\n%s", out)
	}
	c := &http.Client{Timeout: 5 * time.Second}
	if resp, err := c.Get("http://" + lease[1] + "/"); err == nil {
		resp.Body.Close()
	}
	const complaint = "TLS handshake error"
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		b, _ := os.ReadFile(filepath.Join(dir[1], "dev.log"))
		if strings.Contains(string(b), complaint) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("dev.log lacks net/http's %q 10s after a cleartext request to the lease service's TLS port", complaint)
			break
		}
	}
	if strings.Contains(d.output(), complaint) {
		t.Errorf("net/http's complaint went to dev's stderr, not dev.log:\n%s", d.output())
	}
}

// A kept --data-dir is run again, as an operator does after upgrading the
// binary in place: the second run must bring the cluster back, not fail on
// the story's CreateRange ("range demo already exists") and stop it all.
// Both runs pick free ports, so the second also names the replicas whose
// recorded addresses moved.
func TestDevReusedDataDir(t *testing.T) {
	bin := buildTenure(t)
	dir := t.TempDir()
	first := startDev(t, bin, "--insecure", "--records", "1", "--data-dir", dir)
	if err := first.wait(t, 90*time.Second); err != nil {
		t.Fatalf("first tenure dev: %v\n%s", err, first.output())
	}
	if !strings.Contains(first.output(), "the story took") {
		t.Fatalf("first run did not tell the story:\n%s", first.output())
	}
	second := startDev(t, bin, "--insecure", "--records", "1", "--data-dir", dir)
	if err := second.wait(t, 60*time.Second); err != nil {
		t.Fatalf("tenure dev again on its kept --data-dir: %v\n%s", err, second.output())
	}
	out := second.output()
	for _, want := range []string{
		`range "demo" already exists: ` + dir + ` holds the cluster of an earlier run`,
		"r1 now listens at http://127.0.0.1:",
		"but ranges demo record it at http://127.0.0.1:",
		"stopped.",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("second run's output lacks %q", want)
		}
	}
	if strings.Contains(out, "kill the leader") {
		t.Errorf("second run told the story on the kept range")
	}
	if t.Failed() {
		t.Logf("second run's output:\n%s", out)
	}
}
