package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tenurelog/tenure/pkg/embedetcd"
)

// server is one server process of the ready-line test.
type server struct {
	name      string
	cmd       *exec.Cmd
	readyFile string
	lines     chan string // stdout, line by line
	stderr    bytes.Buffer
	exited    chan error
}

// startServer runs the tenure binary with args, its stdout read line by
// line; env is added to the environment.
func startServer(t *testing.T, bin, name, readyFile string, env []string, args ...string) *server {
	t.Helper()
	s := &server{name: name, readyFile: readyFile, lines: make(chan string, 16), exited: make(chan error, 1)}
	s.cmd = exec.Command(bin, args...)
	s.cmd.Env = append(os.Environ(), env...)
	s.cmd.Stderr = &s.stderr
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			s.lines <- sc.Text()
		}
		close(s.lines)
		s.exited <- s.cmd.Wait()
	}()
	t.Cleanup(func() { _ = s.cmd.Process.Kill() })
	return s
}

// readyLine waits for the server's first stdout line and parses it.
func (s *server) waitReady(t *testing.T) (readyLine, string) {
	t.Helper()
	select {
	case line, ok := <-s.lines:
		if !ok {
			t.Fatalf("%s exited without a ready line; stderr:\n%s", s.name, s.stderr.String())
		}
		var l readyLine
		dec := json.NewDecoder(strings.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil {
			t.Fatalf("%s ready line %q: %v", s.name, line, err)
		}
		return l, line
	case <-time.After(30 * time.Second):
		t.Fatalf("%s printed no ready line within 30s", s.name)
	}
	return readyLine{}, ""
}

// stop sends SIGTERM and waits for a clean exit, bounded.
func (s *server) stop(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for range s.lines {
		t.Errorf("%s printed more than its ready line on stdout", s.name)
	}
	select {
	case err := <-s.exited:
		if err != nil {
			t.Errorf("%s after SIGTERM: %v; stderr:\n%s", s.name, err, s.stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("%s did not stop within 20s of SIGTERM", s.name)
	}
}

// Every server prints one JSON ready line on stdout once it serves, and
// writes the same to --ready-file (or TENURE_READY_FILE): its service, id,
// the address it really bound (here port 0) and its pid. The address
// serves at that point; a clean stop removes the file. A file left by an
// earlier run is this run's once the line is out.
func TestServersPrintReadyLine(t *testing.T) {
	bin := buildTenure(t)
	dir := t.TempDir()
	etcd, err := embedetcd.Start(filepath.Join(dir, "etcd"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { etcd.Close() })
	ep := etcd.Endpoints()[0]
	file := func(n string) string { return filepath.Join(dir, n+".ready") }
	// An earlier run's file: it must not survive into this run.
	if err := os.WriteFile(file("lease"), []byte(`{"ready":true,"service":"lease","address":"http://127.0.0.1:1","pid":1}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	lease := startServer(t, bin, "lease", file("lease"), nil, "lease", "--etcd", ep, "--listen", "127.0.0.1:0", "--ready-file", file("lease"))
	ll, _ := lease.waitReady(t)
	rep := startServer(t, bin, "replica", file("replica"), []string{"TENURE_READY_FILE=" + file("replica")},
		"replica", "--id", "r1", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "r1"), "--lease", ll.Address)
	prom := startServer(t, bin, "promoter", file("promoter"), nil,
		"promoter", "--id", "p1", "--etcd", ep, "--lease", ll.Address, "--listen", "127.0.0.1:0", "--ready-file", file("promoter"))

	for _, tc := range []struct {
		s       *server
		service string
		id      string
	}{{lease, "lease", ""}, {rep, "replica", "r1"}, {prom, "promoter", "p1"}} {
		var l readyLine
		var line string
		if tc.s == lease {
			l = ll
			b, _ := os.ReadFile(file("lease"))
			line = strings.TrimSuffix(string(b), "\n")
		} else {
			l, line = tc.s.waitReady(t)
		}
		if !l.Ready || l.Service != tc.service || l.ID != tc.id || l.PID != tc.s.cmd.Process.Pid ||
			!strings.HasPrefix(l.Address, "http://127.0.0.1:") || strings.HasSuffix(l.Address, ":0") {
			t.Errorf("%s ready line = %+v, want ready, service %s, id %q, pid %d, the bound loopback address", tc.service, l, tc.service, tc.id, tc.s.cmd.Process.Pid)
		}
		b, err := os.ReadFile(tc.s.readyFile)
		if err != nil || string(b) != line+"\n" {
			t.Errorf("%s ready file = %q, %v; want the stdout line %q", tc.service, b, err, line)
		}
		// Ready means serving: its health endpoint answers at once.
		if err := runHealth(context.Background(), []string{"--url", l.Address, "--timeout", "5s"}); err != nil {
			t.Errorf("%s at its ready address %s: %v", tc.service, l.Address, err)
		}
		if left, _ := filepath.Glob(filepath.Join(dir, "."+tc.service+".ready.tmp-*")); len(left) > 0 {
			t.Errorf("%s left temp files: %v", tc.service, left)
		}
	}
	for _, s := range []*server{prom, rep, lease} {
		s.stop(t)
		if _, err := os.Stat(s.readyFile); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s ready file after a clean stop: %v, want it removed", s.name, err)
		}
	}
}
