package main

import (
	"bufio"
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tenurelog/tenure/internal/testnet"
)

// stderrLines runs the binary with args and delivers its stderr line by
// line; exited receives Wait's error once the process is gone.
type stderrLines struct {
	cmd    *exec.Cmd
	stdout bytes.Buffer // read only after exited
	lines  chan string
	exited chan error
	all    []string // the lines received so far (by next)
}

func startWithStderr(t *testing.T, bin string, args ...string) *stderrLines {
	t.Helper()
	p := &stderrLines{cmd: exec.Command(bin, args...), lines: make(chan string, 64), exited: make(chan error, 1)}
	p.cmd.Stdout = &p.stdout
	errPipe, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(errPipe)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		p.exited <- p.cmd.Wait()
	}()
	t.Cleanup(func() { _ = p.cmd.Process.Kill() })
	return p
}

// next waits for a stderr line containing want, up to within.
func (p *stderrLines) next(t *testing.T, want string, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("exited without a line containing %q; stderr:\n%s", want, strings.Join(p.all, "\n"))
			}
			p.all = append(p.all, l)
			if strings.Contains(l, want) {
				return
			}
		case <-deadline:
			t.Fatalf("no line containing %q within %v; stderr:\n%s", want, within, strings.Join(p.all, "\n"))
		}
	}
}

// wait drains stderr and returns the exit status, up to within.
func (p *stderrLines) wait(t *testing.T, within time.Duration) int {
	t.Helper()
	deadline := time.After(within)
	for l := range p.lines {
		p.all = append(p.all, l)
	}
	select {
	case err := <-p.exited:
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-deadline:
		t.Fatalf("did not exit within %v; stderr:\n%s", within, strings.Join(p.all, "\n"))
		return -1
	}
}

// A lease service that cannot reach etcd says so at once, at warn level,
// naming the address and why, and again at a bounded rate while it keeps
// trying; it prints no ready line, SIGTERM stops it cleanly, and past
// --etcd-wait it exits 1 saying why. It said nothing for its whole 30s
// start bound, and on SIGTERM only "probe etcd's minimum lease TTL:
// context canceled".
func TestLeaseSaysItCannotReachEtcd(t *testing.T) {
	bin := buildTenure(t)
	etcd := "http://" + testnet.ClosedAddr(t)

	t.Run("warns at once and stops on SIGTERM", func(t *testing.T) {
		p := startWithStderr(t, bin, "lease", "--etcd", etcd, "--listen", "127.0.0.1:0")
		p.next(t, "msg=tracing", 10*time.Second) // the process is up
		began := time.Now()
		p.next(t, `level=WARN msg="cannot reach etcd; retrying" etcd=`+etcd+` err="dial tcp `, 3*time.Second)
		if d := time.Since(began); d > 3*time.Second {
			t.Errorf("the first warning came %v after start, want within a second or two", d)
		}
		p.next(t, "cannot reach etcd; retrying", etcdWarnEvery+3*time.Second)
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if status := p.wait(t, 10*time.Second); status != 0 {
			t.Errorf("after SIGTERM: exit %d, want 0 (stopped, not failed); stderr:\n%s", status, strings.Join(p.all, "\n"))
		}
		if p.stdout.Len() != 0 {
			t.Errorf("it printed %q on stdout, want no ready line: it never served", p.stdout.String())
		}
	})

	t.Run("gives up after --etcd-wait", func(t *testing.T) {
		const wait = 7 * time.Second
		began := time.Now()
		p := startWithStderr(t, bin, "lease", "--etcd", etcd, "--listen", "127.0.0.1:0", "--etcd-wait", wait.String())
		status := p.wait(t, wait+15*time.Second)
		took := time.Since(began)
		stderr := strings.Join(p.all, "\n")
		if status != 1 || took < wait {
			t.Errorf("exit %d after %v, want 1 after --etcd-wait %v; stderr:\n%s", status, took, wait, stderr)
		}
		last := p.all[len(p.all)-1]
		if want := "tenure lease: start against etcd " + etcd + " (--etcd-wait 7s): cannot reach etcd at " + etcd + ": dial tcp "; !strings.HasPrefix(last, want) {
			t.Errorf("last line %q, want it to start %q", last, want)
		}
		// At once, then every etcdWarnEvery: over 7s two, perhaps three
		// on a slow machine, never one a second.
		if n := strings.Count(stderr, "cannot reach etcd; retrying"); n < 2 || n > 3 {
			t.Errorf("%d warnings in %v, want 2 or 3 (at once, then every %v):\n%s", n, wait, etcdWarnEvery, stderr)
		}
		if p.stdout.Len() != 0 {
			t.Errorf("it printed %q on stdout, want no ready line", p.stdout.String())
		}
	})
}
