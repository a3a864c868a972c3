package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"

	"github.com/tenurelog/tenure/internal/flagusage"
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
		fmt.Fprintf(fs.Output(), "Usage: tenure health [--url URL] [--service NAME]\n\nChecks a tenure server's gRPC health (grpc.health.v1.Health/Check) and exits\n0 when it answers SERVING, 1 otherwise. Container health checks use it, since\nthe images have no shell. Against a TLS server give --tls-ca (and, as every\nservice's environment does, --tls-cert and --tls-key): health needs no client\ncertificate, only the CA to trust the server's. Flags (env TENURE_<FLAG> as\nfallback):\n")
		flagusage.Print(fs.Output(), fs)
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := tlsf.setup(slog.New(slog.DiscardHandler), ""); err != nil {
		return err
	}
	base, err := serviceURL("url", *url)
	if err != nil {
		return err
	}
	*url = base
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	c := grpchealth.NewClient(transport.NewHTTPClient(), *url, connect.WithGRPC())
	resp, err := c.Check(ctx, &grpchealth.CheckRequest{Service: *service})
	if err != nil {
		return fmt.Errorf("%s: %w", *url, err)
	}
	if resp.Status != grpchealth.StatusServing {
		return fmt.Errorf("%s: %s", *url, resp.Status)
	}
	fmt.Fprintf(os.Stdout, "%s: %s\n", *url, resp.Status)
	return nil
}
