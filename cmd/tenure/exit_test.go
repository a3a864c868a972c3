package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runTenure runs the binary with args, bounded, and returns its stdout,
// stderr and exit status.
func runTenure(t *testing.T, bin string, args ...string) (stdout, stderr string, status int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = t.TempDir() // a replica that did start would write ./data there
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("tenure %s did not exit within 30s; stderr:\n%s", strings.Join(args, " "), e.String())
	}
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		status = exit.ExitCode()
	default:
		t.Fatalf("tenure %s: %v", strings.Join(args, " "), err)
	}
	return o.String(), e.String(), status
}

// Help is asked for: it goes to stdout (so 'tenure replica --help | less'
// pages it) and exits 0, like tenurectl's. It went to stderr.
func TestHelpGoesToStdout(t *testing.T) {
	bin := buildTenure(t)
	cases := [][]string{{"--help"}, {"-h"}, {"help"}}
	for name := range commands {
		cases = append(cases, []string{name, "--help"}, []string{name, "-h"})
	}
	for _, args := range cases {
		stdout, stderr, status := runTenure(t, bin, args...)
		if status != 0 || !strings.Contains(stdout, "Usage:") || stderr != "" {
			t.Errorf("tenure %s: exit %d, stdout %d bytes (Usage: %v), stderr %q; want exit 0, the help on stdout, nothing on stderr",
				strings.Join(args, " "), status, len(stdout), strings.Contains(stdout, "Usage:"), stderr)
		}
	}
	if stdout, _, _ := runTenure(t, bin, "--help"); !strings.Contains(stdout, "2 invoked wrongly") {
		t.Errorf("tenure --help does not document the exit statuses:\n%s", stdout)
	}
}

// Exit status 2 is an invocation error (an unknown command or flag, a
// missing flag, a bad flag value), said on stderr with nothing on stdout;
// 1 a failure at run time. Bad flag values exited 1, like a failure, and
// only an unknown command exited 2.
func TestExitStatusTellsInvocationFromFailure(t *testing.T) {
	bin := buildTenure(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	file := filepath.Join(t.TempDir(), "a-file")
	if _, _, status := runTenure(t, bin, "certs", "init", file); status != 0 {
		t.Fatalf("tenure certs init %s: exit %d", file, status)
	}
	for _, tc := range []struct {
		args []string
		want int
	}{
		{nil, 2},
		{[]string{"no-such-command"}, 2},
		{[]string{"dev", "--records", "0"}, 2},
		{[]string{"dev", "--base-port", "70000"}, 2},
		{[]string{"dev", "--bogus"}, 2},
		{[]string{"replica"}, 2},
		{[]string{"replica", "--id", "r1", "--disk-reserve", "-1"}, 2},
		{[]string{"replica", "--id", "r1", "--segment-bytes", "1"}, 2},
		{[]string{"replica", "--id", "r1", "--lease-ttl", "1500ms", "--lease", "127.0.0.1:1"}, 2},
		{[]string{"replica", "--id", "r1", "--listen", "0.0.0.0:0"}, 2}, // cleartext beyond loopback without --insecure
		{[]string{"replica", "--id", "r1", "--tls-cert", "c.pem"}, 2},
		{[]string{"replica", "--id", "r1", "unexpected"}, 2},
		{[]string{"lease", "--log-format", "xml"}, 2},
		{[]string{"lease", "--default-ttl", "1500ms"}, 2},
		{[]string{"promoter", "--id="}, 2},
		{[]string{"promoter", "--lease", "lease-1"}, 2},
		{[]string{"health", "--url", "lease-1"}, 2},
		{[]string{"certs"}, 2},
		{[]string{"certs", "init"}, 2},
		// Failures at run time.
		{[]string{"health", "--url", "http://" + closed, "--timeout", "1s"}, 1},
		{[]string{"replica", "--id", "r1", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(file, "ca.pem")}, 1},
	} {
		stdout, stderr, status := runTenure(t, bin, tc.args...)
		if status != tc.want || stderr == "" || (tc.want == 2 && stdout != "") {
			t.Errorf("tenure %s: exit %d, stdout %q, stderr %q; want exit %d and the error on stderr", strings.Join(tc.args, " "), status, stdout, stderr, tc.want)
		}
	}
}
