package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Spec is one certificate Init issues.
type Spec struct {
	// Name is the file name stem (<Name>.pem, <Name>-key.pem) and the
	// common name.
	Name string
	// Identity is what the certificate says: roles and replica id.
	Identity Identity
	// Hosts are the DNS names and IPs the holder is dialled at, besides
	// localhost and 127.0.0.1, which every certificate carries.
	Hosts []string
}

// Validity of what Init issues. A CA outlives the certificates it signs;
// a certificate is renewed by running Init again after deleting it (the
// servers reload it).
const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 2 * 365 * 24 * time.Hour
)

// CAFile is the CA certificate's file name in an Init directory.
const CAFile = "ca.pem"

// Init makes dir hold a CA (ca.pem, ca-key.pem) and one certificate and key
// per spec, signed by it. It is idempotent: an existing CA is reused, and a
// certificate that exists and chains to it is kept, so running it again
// adds what is missing without invalidating what was deployed. Keys are
// written 0600. It returns the names it wrote.
func Init(dir string, specs []Spec) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	ca, caKey, wrote, err := loadOrMakeCA(dir)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	for _, sp := range specs {
		if sp.Name == "" || filepath.Base(sp.Name) != sp.Name {
			return wrote, fmt.Errorf("auth: certificate name %q must be a plain file name", sp.Name)
		}
		certPath := filepath.Join(dir, sp.Name+".pem")
		if keep(certPath, pool) {
			continue
		}
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return wrote, fmt.Errorf("auth: %w", err)
		}
		id := sp.Identity
		id.Name = sp.Name
		tmpl, err := template(sp.Name, leafValidity)
		if err != nil {
			return wrote, err
		}
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		// Every tenure process is both a server and a client of others.
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
		tmpl.URIs = id.uris()
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
		for _, h := range sp.Hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return wrote, fmt.Errorf("auth: issue %s: %w", sp.Name, err)
		}
		if err := writeKeyPair(dir, sp.Name, der, key); err != nil {
			return wrote, err
		}
		wrote = append(wrote, sp.Name)
	}
	return wrote, nil
}

// keep reports whether the certificate at path exists and chains to pool.
func keep(path string, pool *x509.CertPool) bool {
	c, err := readCert(path)
	if err != nil {
		return false
	}
	_, err = c.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err == nil
}

func loadOrMakeCA(dir string) (*x509.Certificate, *ecdsa.PrivateKey, []string, error) {
	certPath, keyPath := filepath.Join(dir, CAFile), filepath.Join(dir, "ca-key.pem")
	if c, err := readCert(certPath); err == nil {
		kb, err := os.ReadFile(keyPath)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("auth: %s exists but its key does not: %w", certPath, err)
		}
		blk, _ := pem.Decode(kb)
		if blk == nil {
			return nil, nil, nil, fmt.Errorf("auth: %s holds no PEM key", keyPath)
		}
		k, err := x509.ParseECPrivateKey(blk.Bytes)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("auth: %s: %w", keyPath, err)
		}
		return c, k, nil, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("auth: %w", err)
	}
	tmpl, err := template("tenure CA", caValidity)
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("auth: make the CA: %w", err)
	}
	if err := writeKeyPair(dir, "ca", der, key); err != nil {
		return nil, nil, nil, err
	}
	c, err := x509.ParseCertificate(der)
	return c, key, []string{"ca"}, err
}

func template(cn string, validity time.Duration) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn, Organization: []string{"tenure"}},
		// A little slack for clocks a minute apart.
		NotBefore: now.Add(-time.Hour),
		NotAfter:  now.Add(validity),
	}, nil
}

func readCert(path string) (*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("auth: %s holds no PEM certificate", path)
	}
	return x509.ParseCertificate(blk.Bytes)
}

// writeKeyPair writes <name>.pem and <name>-key.pem, each to a temporary
// file renamed into place, so a server reloading them never reads half of
// one (it may briefly see a new certificate with the old key: that pair
// does not load, and the Source keeps the old one until both are new).
func writeKeyPair(dir, name string, der []byte, key *ecdsa.PrivateKey) error {
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	if err := writeAtomic(filepath.Join(dir, name+"-key.pem"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return err
	}
	return writeAtomic(filepath.Join(dir, name+".pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

func writeAtomic(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	return nil
}

// DefaultSpecs are the certificates of a cluster: one per replica id (role
// replica), the lease services and promoters (role promoter for the
// promoters), and the clients: an operator (operator, producer, consumer,
// for tenurectl), a producer and a consumer. hosts are extra names every
// server certificate carries (compose service names, a host name).
func DefaultSpecs(replicas, promoters, leases, hosts []string) []Spec {
	var out []Spec
	for _, r := range replicas {
		out = append(out, Spec{Name: "replica-" + r, Identity: Identity{Roles: []Role{RoleReplica}, ReplicaID: r}, Hosts: hosts})
	}
	for _, p := range promoters {
		out = append(out, Spec{Name: "promoter-" + p, Identity: Identity{Roles: []Role{RolePromoter}}, Hosts: hosts})
	}
	for _, l := range leases {
		out = append(out, Spec{Name: "lease-" + l, Hosts: hosts})
	}
	return append(out,
		Spec{Name: "operator", Identity: Identity{Roles: []Role{RoleOperator, RoleProducer, RoleConsumer}}},
		Spec{Name: "producer", Identity: Identity{Roles: []Role{RoleProducer}}},
		Spec{Name: "consumer", Identity: Identity{Roles: []Role{RoleConsumer}}},
	)
}
