package auth

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// Files names a party's PEM files: its certificate (chain), its key, and
// the CA certificates it trusts.
type Files struct {
	Cert, Key, CA string
}

// Configured reports whether any file is named; Load needs all three.
func (f Files) Configured() bool { return f.Cert != "" || f.Key != "" || f.CA != "" }

// recheckEvery bounds how often a Source looks at its files: at most once a
// second per handshake burst, so a reload costs nothing on the data path
// (connections are long-lived) and a renewed certificate is in use within
// a second of being written.
const recheckEvery = time.Second

// Source serves a party's certificate and trust roots from its files and
// reloads them when they change, without a restart. A change that does not
// load (a half-written file, a key that does not match) keeps the last good
// pair and is logged; the next check tries again.
type Source struct {
	files Files
	log   *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	pool    *x509.CertPool
	stamp   string // the files' sizes and mtimes when last loaded
	checked time.Time
}

// Load reads files and returns a Source over them. It fails if any file is
// missing or does not load: a server must not start with half a TLS setup.
func Load(files Files, log *slog.Logger) (*Source, error) {
	if files.Cert == "" || files.Key == "" || files.CA == "" {
		return nil, errors.New("auth: TLS needs all three of a certificate, its key and the CA certificate (--tls-cert, --tls-key, --tls-ca)")
	}
	if log == nil {
		log = slog.Default()
	}
	s := &Source{files: files, log: log}
	stamp, err := s.stampNow()
	if err != nil {
		return nil, err
	}
	if err := s.load(stamp); err != nil {
		return nil, err
	}
	s.checked = time.Now()
	return s, nil
}

func (s *Source) stampNow() (string, error) {
	var stamp string
	for _, p := range []string{s.files.Cert, s.files.Key, s.files.CA} {
		fi, err := os.Stat(p)
		if err != nil {
			return "", fmt.Errorf("auth: %w", err)
		}
		stamp += fmt.Sprintf("%s:%d:%d;", p, fi.Size(), fi.ModTime().UnixNano())
	}
	return stamp, nil
}

// load reads the files. s.mu is held (or s is not yet shared).
func (s *Source) load(stamp string) error {
	cert, err := tls.LoadX509KeyPair(s.files.Cert, s.files.Key)
	if err != nil {
		return fmt.Errorf("auth: load %s and %s: %w", s.files.Cert, s.files.Key, err)
	}
	caPEM, err := os.ReadFile(s.files.CA)
	if err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("auth: %s holds no PEM certificate", s.files.CA)
	}
	s.cert, s.pool, s.stamp = &cert, pool, stamp
	return nil
}

// current returns the certificate and pool, reloading first if the files
// changed since they were loaded (checked at most every recheckEvery).
func (s *Source) current() (*tls.Certificate, *x509.CertPool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now := time.Now(); now.Sub(s.checked) >= recheckEvery {
		s.checked = now
		if stamp, err := s.stampNow(); err != nil {
			s.log.Warn("auth: certificate files unreadable; keeping the loaded ones", "err", err)
		} else if stamp != s.stamp {
			if err := s.load(stamp); err != nil {
				s.log.Warn("auth: changed certificate files do not load; keeping the loaded ones", "err", err)
			} else {
				s.log.Info("auth: reloaded certificates", "cert", s.files.Cert, "ca", s.files.CA)
			}
		}
	}
	return s.cert, s.pool
}

// ServerConfig is the TLS configuration of a server: its certificate, and
// the client's certificate requested but neither required nor verified at
// the handshake: health probes need none, and a certificate from another CA
// must get an answer (Unauthenticated) rather than a broken handshake that
// looks like a network fault. Handler verifies it against the CA
// (VerifyClient) before anything else.
func (s *Source) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{"h2", "http/1.1"},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cert, _ := s.current()
			return &tls.Config{
				MinVersion:   tls.VersionTLS13,
				NextProtos:   []string{"h2", "http/1.1"},
				Certificates: []tls.Certificate{*cert},
				ClientAuth:   tls.RequestClientCert,
			}, nil
		},
	}
}

// VerifyClient verifies a client's certificate chain (as the handshake
// received it) against the current CA, for client authentication, and
// returns its leaf.
func (s *Source) VerifyClient(chain []*x509.Certificate) (*x509.Certificate, error) {
	if len(chain) == 0 {
		return nil, errors.New("auth: no client certificate")
	}
	_, pool := s.current()
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, fmt.Errorf("auth: client certificate %q: %w", chain[0].Subject.CommonName, err)
	}
	return chain[0], nil
}

// ClientConfig is the TLS configuration of a client: its certificate for
// the server to verify, and the server's verified against the CA, the
// current one at each handshake (so the roots reload too: crypto/tls reads
// RootCAs once, hence the verification here instead).
func (s *Source) ClientConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{"h2"},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cert, _ := s.current()
			return cert, nil
		},
		// The chain and the name are verified in VerifyConnection against
		// the current pool; nothing is skipped.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("auth: the server presented no certificate")
			}
			_, pool := s.current()
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
				Roots: pool, Intermediates: inter, DNSName: cs.ServerName,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			})
			if err != nil {
				return fmt.Errorf("auth: server certificate for %q: %w", cs.ServerName, err)
			}
			return nil
		},
	}
}
