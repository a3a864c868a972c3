package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"log/slog"
	"strings"

	"github.com/tenurelog/tenure/pkg/auth"
	"github.com/tenurelog/tenure/pkg/transport"
)

// tlsFlags are every server's TLS flags (env TENURE_TLS_CERT, ... as
// fallback, like every flag).
type tlsFlags struct {
	cert, key, ca *string
	insecure      *bool
}

const tlsHelp = `
Every hop is mutual TLS when --tls-cert, --tls-key and --tls-ca are given
(tenure certs init DIR writes them): the server presents its certificate,
requires one from every caller but health probes, and admits each procedure
only to the roles its certificate carries (pkg/auth, table.go). The files are
reloaded when they change. Without them the server speaks cleartext and
listens only on loopback, unless --insecure says so on purpose.
`

func addTLSFlags(fs *flag.FlagSet) *tlsFlags {
	return &tlsFlags{
		cert:     fs.String("tls-cert", "", "PEM certificate this process presents as a server and as a client (with --tls-key and --tls-ca)"),
		key:      fs.String("tls-key", "", "PEM private key of --tls-cert"),
		ca:       fs.String("tls-ca", "", "PEM CA certificate(s) peers' certificates must chain to"),
		insecure: fs.Bool("insecure", false, "allow cleartext on a non-loopback address (no TLS, no authentication: anyone who reaches the port can fence and truncate)"),
	}
}

// setup installs the process's TLS identity before any server or client is
// built, or refuses to serve cleartext beyond loopback. listen is the
// address the process serves on ("" for none).
func (f *tlsFlags) setup(log *slog.Logger, listen string) error {
	files := auth.Files{Cert: *f.cert, Key: *f.key, CA: *f.ca}
	if !files.Configured() {
		if listen != "" && !transport.Loopback(listen) && !*f.insecure {
			return usageError{fmt.Errorf("--listen %s: %w", listen, auth.ErrNoTLS)}
		}
		if listen != "" && !transport.Loopback(listen) {
			log.Warn("serving cleartext without authentication on a non-loopback address (--insecure)", "listen", listen)
		}
		return nil
	}
	if files.Cert == "" || files.Key == "" || files.CA == "" {
		return usagef("TLS needs all three of --tls-cert, --tls-key and --tls-ca")
	}
	src, err := auth.Load(files, log)
	if err != nil {
		return err
	}
	transport.SetTLS(src)
	return nil
}

// etcdTLS is the etcd client's TLS configuration: the process's own
// certificate and CA when TLS is on and the endpoints say https (etcd's
// client URLs), nil otherwise.
func etcdTLS(endpoints string) *tls.Config {
	src := transport.TLS()
	if src == nil || !strings.Contains(endpoints, "https://") {
		return nil
	}
	return src.ClientConfig()
}

// serviceURL is a peer's base URL from a flag, by the rule every URL flag
// of tenure and tenurectl follows (transport.BaseURL): HOST:PORT, and
// http:// when this process speaks TLS, mean the scheme it speaks, so a
// default like http://127.0.0.1:7000 still names the right server.
// leaseFlagHelp is the --help text of the promoter's --lease.
const leaseFlagHelp = "lease service base URL, or several instances of it (over the same etcd) separated by commas, e.g. https://lease-1:7000,https://lease-2:7000: calls go to the instance that answered last, and to the next when it does not answer (those safe to repeat also when the outcome is unknown: pkg/leaseclient)"

// serviceURLs is serviceURL for a flag that may name several instances of
// one service, separated by commas (--lease).
func serviceURLs(flagName, u string) ([]string, error) {
	v, err := transport.BaseURLs(u, transport.TLS() != nil)
	if err != nil {
		return nil, usageError{fmt.Errorf("--%s: %w", flagName, err)}
	}
	return v, nil
}

func serviceURL(flagName, u string) (string, error) {
	v, err := transport.BaseURL(u, transport.TLS() != nil)
	if err != nil {
		return "", usageError{fmt.Errorf("--%s: %w", flagName, err)}
	}
	return v, nil
}
