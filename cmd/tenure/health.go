package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"

	"github.com/tenurelog/tenure/internal/flagusage"
	"github.com/tenurelog/tenure/internal/tlshint"
	"github.com/tenurelog/tenure/pkg/transport"
)

func init() {
	commands["health"] = command{summary: "check a tenure server's gRPC health (exit 0 serving, 1 not): for container health checks", run: runHealth}
}

// runHealth asks a server's grpc.health.v1 endpoint whether it is serving.
// Images are built FROM scratch and have no shell or curl, so compose health
// checks exec this subcommand of the binary itself.
func runHealth(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("health", flag.ContinueOnError)
	url := fs.String("url", "http://127.0.0.1:7000", "base URL of the server to check")
	service := fs.String("service", "", "service name to check (e.g. tenure.v1.LogService); empty asks about the server as a whole")
	timeout := fs.Duration("timeout", 2*time.Second, "give up after this long")
	tlsf := addTLSFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: tenure health [--url URL] [--service NAME]\n\nChecks a tenure server's gRPC health (grpc.health.v1.Health/Check) and exits\n0 when it answers SERVING, 1 otherwise. Container health checks use it, since\nthe images have no shell. Against a TLS server give --tls-ca: health needs no\nclient certificate, only the CA to trust the server's (servers admit health\nchecks without one). --tls-cert and --tls-key, which every service's\nenvironment sets, may be given too, both or neither. Flags (env TENURE_<FLAG>\nas fallback):\n")
		flagusage.Print(fs.Output(), fs)
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var hc *http.Client
	if *tlsf.ca != "" && *tlsf.cert == "" && *tlsf.key == "" {
		// The servers admit gRPC health without a client certificate
		// (pkg/auth), so a probe needs only the CA. transport's TLS is a
		// process identity, all three files; this client is the probe's.
		var err error
		if hc, err = caOnlyClient(*tlsf.ca); err != nil {
			return err
		}
	} else {
		if err := tlsf.setup(slog.New(slog.DiscardHandler), ""); err != nil {
			return err
		}
		hc = transport.NewHTTPClient()
	}
	// HOST:PORT and http:// mean https:// when the probe speaks TLS, the
	// rule of every URL flag (serviceURL).
	base, err := transport.BaseURL(*url, *tlsf.ca != "")
	if err != nil {
		return usageError{fmt.Errorf("--url: %w", err)}
	}
	*url = base
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	c := grpchealth.NewClient(hc, *url, connect.WithGRPC())
	resp, err := c.Check(ctx, &grpchealth.CheckRequest{Service: *service})
	if err != nil {
		return fmt.Errorf("%s: %w%s", *url, err, healthTLSHint(err, *tlsf.ca != ""))
	}
	if resp.Status != grpchealth.StatusServing {
		return fmt.Errorf("%s: %s", *url, resp.Status)
	}
	fmt.Fprintf(os.Stdout, "%s: %s\n", *url, resp.Status)
	return nil
}

// healthTLSHint says what to change when the probe and the server disagree
// about TLS; the bare errors ("unexpected EOF", "certificate signed by
// unknown authority") name neither the flag nor the file.
func healthTLSHint(err error, withCA bool) string {
	switch {
	case tlshint.UnverifiedServer(err) && withCA:
		return "; the server's certificate does not chain to --tls-ca: give its cluster's CA (ca.pem of 'tenure certs init')"
	case tlshint.UnverifiedServer(err):
		return "; the server speaks TLS: give --tls-ca, its cluster's CA (ca.pem of 'tenure certs init')"
	case tlshint.CleartextServer(err):
		return "; the server speaks cleartext: drop --tls-ca"
	case !withCA && tlshint.HungUp(err):
		return "; the server hung up: it probably speaks TLS: give --tls-ca, its cluster's CA (ca.pem of 'tenure certs init')"
	}
	return ""
}

// caOnlyClient is an HTTP/2 client that trusts the servers' certificates
// the CA in caFile signed and presents none of its own.
func caOnlyClient(caFile string) (*http.Client, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--tls-ca: %s holds no PEM certificate", caFile)
	}
	var p http.Protocols
	p.SetHTTP2(true)
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{
		Protocols:       &p,
		TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool, NextProtos: []string{"h2"}},
	}}, nil
}
