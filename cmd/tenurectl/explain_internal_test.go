package main

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/auth"
	"github.com/tenurelog/tenure/pkg/transport"
)

// A cleartext client hung up on by a TLS server, and the refusals of a TLS
// cluster, are explained with what to pass.
func TestExplainTLSErrors(t *testing.T) {
	for _, tc := range []struct {
		err  error
		url  string
		want string
	}{
		{connect.NewError(connect.CodeUnavailable, errors.New("write tcp 127.0.0.1:1->127.0.0.1:2: write: broken pipe")), "http://127.0.0.1:7000", "runs mutual TLS; pass --cacert"},
		{connect.NewError(connect.CodeCanceled, errors.New("unexpected EOF")), "http://127.0.0.1:7000", "runs mutual TLS"},
		{connect.NewError(connect.CodeUnauthenticated, errors.New("auth: needs a client certificate")), "https://127.0.0.1:7000", "wants a client certificate"},
		{connect.NewError(connect.CodePermissionDenied, errors.New("auth: producer may not")), "https://127.0.0.1:7000", "refused this certificate"},
	} {
		if got := explain(tc.err, "the lease service", tc.url, "--lease").Error(); !strings.Contains(got, tc.want) {
			t.Errorf("explain(%v, %s) = %q, want it to say %q", tc.err, tc.url, got, tc.want)
		}
	}
}

// Against real servers: TLS flags to a cleartext server say the server
// runs without TLS (it was "the lease service at ...: unavailable: ...
// server gave HTTP response to HTTPS client"); no TLS flags against a TLS
// server say it runs mutual TLS, for a HOST:PORT URL too (it was
// "unavailable: http2: client conn could not be established"), and for an
// https:// URL, where it was the bare "unavailable: tls: failed to verify
// certificate: x509: certificate signed by unknown authority"; another
// cluster's CA says --cacert is not this server's.
func TestExplainTLSMismatchAgainstRealServers(t *testing.T) {
	dir := t.TempDir()
	if _, err := auth.Init(dir, auth.DefaultSpecs([]string{"r1"}, []string{"p1"}, []string{"1"}, nil)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { transport.SetTLS(nil) }) // tenurectl's TLS flags install it process-wide
	cleartext, err := transport.Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer cleartext.Close()
	src, err := auth.Load(auth.Files{Cert: filepath.Join(dir, "lease-1.pem"), Key: filepath.Join(dir, "lease-1-key.pem"), CA: filepath.Join(dir, auth.CAFile)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	transport.SetTLS(src)
	tlsSrv, err := transport.Serve("127.0.0.1:0")
	transport.SetTLS(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tlsSrv.Close()

	ctl := func(args ...string) (int, string) {
		var out, errOut strings.Builder
		e := &env{stdout: &out, stderr: &errOut, stdin: strings.NewReader(""), getenv: func(string) string { return "" }}
		code := run(context.Background(), e, args)
		transport.SetTLS(nil)
		return code, errOut.String()
	}
	certs := []string{"--cacert", filepath.Join(dir, auth.CAFile), "--cert", filepath.Join(dir, "operator.pem"), "--key", filepath.Join(dir, "operator-key.pem")}
	code, stderr := ctl(append([]string{"range", "list", "--lease", cleartext.Addr}, certs...)...)
	if code != exitFail || !strings.Contains(stderr, "answered in cleartext") || !strings.Contains(stderr, "drop --cacert") {
		t.Errorf("TLS flags against a cleartext lease service: status %d, stderr:\n%s", code, stderr)
	}
	code, stderr = ctl("range", "list", "--lease", tlsSrv.Addr)
	if code != exitFail || !strings.Contains(stderr, "runs mutual TLS; pass --cacert") {
		t.Errorf("no TLS flags against a TLS lease service, HOST:PORT: status %d, stderr:\n%s", code, stderr)
	}
	code, stderr = ctl("range", "list", "--lease", tlsSrv.URL())
	if code != exitFail || !strings.Contains(stderr, "cannot verify") || !strings.Contains(stderr, "pass --cacert") {
		t.Errorf("no TLS flags against a TLS lease service, https:// URL: status %d, stderr:\n%s", code, stderr)
	}
	other := t.TempDir()
	if _, err := auth.Init(other, auth.DefaultSpecs([]string{"r1"}, []string{"p1"}, []string{"1"}, nil)); err != nil {
		t.Fatal(err)
	}
	otherCerts := []string{"--cacert", filepath.Join(other, auth.CAFile), "--cert", filepath.Join(other, "operator.pem"), "--key", filepath.Join(other, "operator-key.pem")}
	code, stderr = ctl(append([]string{"range", "list", "--lease", tlsSrv.URL()}, otherCerts...)...)
	if code != exitFail || !strings.Contains(stderr, "--cacert must be the CA of that server's cluster") {
		t.Errorf("another cluster's CA against a TLS lease service: status %d, stderr:\n%s", code, stderr)
	}
}

// Half a TLS setup, or files that do not load, are this client's mistake,
// told in tenurectl's flag names: they were "the lease service at ...:
// unavailable: auth: TLS needs all three ... (--tls-cert, --tls-key,
// --tls-ca)", the server's flags, blaming a server nothing was sent to.
func TestTLSSetupErrorsNameTenurectlsFlags(t *testing.T) {
	dir := t.TempDir()
	if _, err := auth.Init(dir, auth.DefaultSpecs([]string{"r1"}, []string{"p1"}, []string{"1"}, nil)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { transport.SetTLS(nil) })
	ca := filepath.Join(dir, auth.CAFile)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--cacert", ca}, "mutual TLS needs all three of --cacert, --cert and --key"},
		{[]string{"--cacert", ca, "--cert", filepath.Join(dir, "nonexistent.pem"), "--key", filepath.Join(dir, "operator-key.pem")}, "loading --cacert, --cert and --key"},
	} {
		var out, errOut strings.Builder
		e := &env{stdout: &out, stderr: &errOut, stdin: strings.NewReader(""), getenv: func(string) string { return "" }}
		code := run(context.Background(), e, append([]string{"range", "list", "--lease", "http://127.0.0.1:1"}, tc.args...))
		if got := errOut.String(); code != exitFail || !strings.Contains(got, tc.want) || strings.Contains(got, "--tls-") || strings.Contains(got, "lease service at") {
			t.Errorf("range list %q: status %d, stderr:\n%s\nwant %q, in tenurectl's flag names, not blaming the server", tc.args, code, got, tc.want)
		}
	}
}
