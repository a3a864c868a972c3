package main

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tenurelog/tenure/pkg/auth"
)

// tenure health against a mutual-TLS server needs only the CA, as its help
// says: servers admit gRPC health without a client certificate. It refused
// to run ("TLS needs all three of a certificate, its key and the CA
// certificate") unless given a certificate and key it never needed.
func TestHealthOverTLSNeedsOnlyTheCA(t *testing.T) {
	bin := buildTenure(t)
	certs, other := filepath.Join(t.TempDir(), "certs"), filepath.Join(t.TempDir(), "other")
	for _, dir := range []string{certs, other} {
		if err := runCerts(context.Background(), []string{"init", dir}); err != nil {
			t.Fatal(err)
		}
	}
	ca := filepath.Join(certs, auth.CAFile)
	dir := t.TempDir()
	rep := startServer(t, bin, "replica", filepath.Join(dir, "ready"), nil,
		"replica", "--id", "r1", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "r1"),
		"--tls-cert", filepath.Join(certs, "replica-r1.pem"), "--tls-key", filepath.Join(certs, "replica-r1-key.pem"), "--tls-ca", ca)
	l, _ := rep.waitReady(t)
	if !strings.HasPrefix(l.Address, "https://") {
		t.Fatalf("the replica serves at %s, want https", l.Address)
	}
	hostPort := strings.TrimPrefix(l.Address, "https://")
	for _, tc := range []struct {
		args    []string
		want    int
		wantErr string // on stderr: what to change
	}{
		{[]string{"--url", l.Address, "--tls-ca", ca}, 0, ""},
		// HOST:PORT and http:// mean https when TLS is on (serviceURL's rule).
		{[]string{"--url", hostPort, "--tls-ca", ca}, 0, ""},
		{[]string{"--url", "http://" + hostPort, "--tls-ca", ca}, 0, ""},
		// The environment's whole set, as compose's health checks give it.
		{[]string{"--url", l.Address, "--tls-ca", ca, "--tls-cert", filepath.Join(certs, "operator.pem"), "--tls-key", filepath.Join(certs, "operator-key.pem")}, 0, ""},
		// Another CA does not trust the server's certificate; none at all
		// speaks cleartext to a TLS port.
		// Each says which flag to change: the bare errors ("certificate
		// signed by unknown authority", "unexpected EOF") named none.
		{[]string{"--url", l.Address, "--tls-ca", filepath.Join(other, auth.CAFile)}, 1, "does not chain to --tls-ca"},
		{[]string{"--url", l.Address}, 1, "give --tls-ca"},
		{[]string{"--url", "http://" + hostPort}, 1, "give --tls-ca"},
		// Half a client identity is still a mistake.
		{[]string{"--url", l.Address, "--tls-ca", ca, "--tls-cert", filepath.Join(certs, "operator.pem")}, 2, ""},
	} {
		args := append([]string{"health", "--timeout", "5s"}, tc.args...)
		stdout, stderr, status := runTenure(t, bin, args...)
		if status != tc.want || (tc.want == 0 && !strings.Contains(stdout, ": serving")) || !strings.Contains(stderr, tc.wantErr) {
			t.Errorf("tenure %s: exit %d, stdout %q, stderr %q; want exit %d and %q", strings.Join(args, " "), status, stdout, stderr, tc.want, tc.wantErr)
		}
	}
	rep.stop(t)
}

// A cleartext probe of a TLS server fails in one of several forms,
// depending on which side of the HTTP/2 preface the server's hang-up
// lands; each names --tls-ca. CI saw "client conn could not be
// established", which the hint missed, where runs here saw EOF.
func TestHealthTLSHintCoversEveryHangUp(t *testing.T) {
	for _, msg := range []string{
		"unavailable: unexpected EOF",
		"unavailable: read tcp 127.0.0.1:1->127.0.0.1:2: read: connection reset by peer",
		"unavailable: http2: client conn could not be established",
		`canceled: Post "http://127.0.0.1:1/grpc.health.v1.Health/Check": write tcp 127.0.0.1:2->127.0.0.1:1: write: broken pipe`,
	} {
		if got := healthTLSHint(errors.New(msg), false); !strings.Contains(got, "give --tls-ca") {
			t.Errorf("hint for %q = %q, want it to name --tls-ca", msg, got)
		}
		if got := healthTLSHint(errors.New(msg), true); strings.Contains(got, "give --tls-ca") {
			t.Errorf("hint for %q with --tls-ca given = %q, want no --tls-ca advice", msg, got)
		}
	}
}
