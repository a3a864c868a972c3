package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/tenurelog/tenure/internal/flagusage"
	"github.com/tenurelog/tenure/pkg/auth"
)

func init() {
	commands["certs"] = command{summary: "make the cluster's TLS certificates: `tenure certs init DIR` writes a CA and one certificate per service and role", run: runCerts}
}

func runCerts(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "init" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			args = []string{"init", "--help"}
		} else {
			return usagef("usage: tenure certs init DIR [flags] (see tenure certs init --help)")
		}
	}
	fs := flag.NewFlagSet("certs init", flag.ContinueOnError)
	replicas := fs.String("replicas", "r1,r2,r3", "comma-separated replica ids: one certificate each, role replica, bound to its id")
	promoters := fs.String("promoters", "1,2", "comma-separated promoter names: one certificate each (promoter-<name>), role promoter")
	leases := fs.String("leases", "1,2", "comma-separated lease service names: one certificate each (lease-<name>), no role")
	servers := fs.String("servers", "", "comma-separated names of other servers (etcd members, Jaeger): one certificate each, <name>, no role, carrying --hosts too")
	hosts := fs.String("hosts", "", "comma-separated extra DNS names or IPs every server certificate carries (compose service names, a host name); localhost and 127.0.0.1 always are")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: tenure certs init DIR [flags]

Writes DIR/ca.pem and DIR/ca-key.pem (a new CA, unless DIR holds one) and,
signed by it, <name>.pem and <name>-key.pem for each replica
(replica-<id>: role replica), promoter (promoter-<name>: role promoter) and
lease service (lease-<name>), and the clients: operator (roles operator,
producer and consumer: tenurectl), producer and consumer. Certificates that
exist and chain to the CA are kept, so running it again only adds what is
missing. Keys are written 0600. Give each process its own pair with
--tls-cert/--tls-key and the CA with --tls-ca; tenurectl takes
--cacert/--cert/--key.

Flags:
`)
		flagusage.Print(fs.Output(), fs)
	}
	// DIR may come before or after the flags.
	rest := args[1:]
	var dir string
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		dir, rest = rest[0], rest[1:]
	}
	if err := parseQuietly(fs, rest); err != nil {
		return err
	}
	if dir == "" && fs.NArg() == 1 {
		dir = fs.Arg(0)
	} else if fs.NArg() > 0 || dir == "" {
		return usagef("tenure certs init: give exactly one directory (see --help)")
	}
	specs := auth.DefaultSpecs(list(*replicas), list(*promoters), list(*leases), list(*hosts))
	for _, name := range list(*servers) {
		specs = append(specs, auth.Spec{Name: name, Hosts: list(*hosts)})
	}
	wrote, err := auth.Init(dir, specs)
	if err != nil {
		return err
	}
	if len(wrote) == 0 {
		fmt.Fprintf(os.Stdout, "%s: every certificate is there already\n", dir)
		return nil
	}
	fmt.Fprintf(os.Stdout, "%s: wrote %s\n", dir, strings.Join(wrote, ", "))
	return nil
}

// list splits a comma-separated flag, dropping empty items.
func list(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
