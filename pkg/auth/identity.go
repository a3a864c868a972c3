package auth

import (
	"crypto/x509"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/tenurelog/tenure/pkg/wire"
)

// URI SAN prefixes (see the package comment). Part of the certificate
// format: changing them invalidates every certificate issued.
const (
	roleURIPrefix    = "urn:tenure:role:"
	replicaURIPrefix = "urn:tenure:replica:"
)

// Identity is who a verified certificate names.
type Identity struct {
	// Name is the certificate's common name, for logs.
	Name string
	// Roles are the roles it carries.
	Roles []Role
	// ReplicaID is the replica it is, for a replica certificate ("" else).
	ReplicaID string
}

// Has reports whether the identity carries any of roles.
func (id Identity) Has(roles ...Role) bool {
	for _, r := range roles {
		if slices.Contains(id.Roles, r) {
			return true
		}
	}
	return false
}

func (id Identity) String() string {
	roles := make([]string, len(id.Roles))
	for i, r := range id.Roles {
		roles[i] = string(r)
	}
	s := fmt.Sprintf("%q (roles %s)", id.Name, strings.Join(roles, ","))
	if id.ReplicaID != "" {
		s += " replica " + id.ReplicaID
	}
	return s
}

// IdentityOf reads the identity of a verified leaf certificate. Unknown
// roles are ignored (a newer issuer's role means nothing here); a malformed
// replica id or two of them is an error.
func IdentityOf(cert *x509.Certificate) (Identity, error) {
	id := Identity{Name: cert.Subject.CommonName}
	for _, u := range cert.URIs {
		s := u.String()
		switch {
		case strings.HasPrefix(s, roleURIPrefix):
			r := Role(strings.TrimPrefix(s, roleURIPrefix))
			if slices.Contains(Roles, r) && !slices.Contains(id.Roles, r) {
				id.Roles = append(id.Roles, r)
			}
		case strings.HasPrefix(s, replicaURIPrefix):
			rid := strings.TrimPrefix(s, replicaURIPrefix)
			if err := wire.ValidateReplicaID(rid); err != nil {
				return Identity{}, fmt.Errorf("auth: certificate %q: %w", id.Name, err)
			}
			if id.ReplicaID != "" && id.ReplicaID != rid {
				return Identity{}, fmt.Errorf("auth: certificate %q names two replicas, %s and %s", id.Name, id.ReplicaID, rid)
			}
			id.ReplicaID = rid
		}
	}
	return id, nil
}

// uris are the URI SANs of an identity, for Init.
func (id Identity) uris() []*url.URL {
	var out []*url.URL
	for _, r := range id.Roles {
		out = append(out, &url.URL{Scheme: "urn", Opaque: "tenure:role:" + string(r)})
	}
	if id.ReplicaID != "" {
		out = append(out, &url.URL{Scheme: "urn", Opaque: "tenure:replica:" + id.ReplicaID})
	}
	return out
}
