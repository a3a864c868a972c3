package auth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"connectrpc.com/connect"
)

// Decide is the authorisation decision for one request: the procedure (the
// request's path) and the peer's verified leaf certificate identity, or
// ok=false when the peer presented none that verified. It returns nil or a
// Connect error (Unauthenticated or PermissionDenied). Pure: the table and
// the identity are all it reads.
func Decide(procedure string, id Identity, ok bool) *connect.Error {
	if strings.HasPrefix(procedure, healthPrefix) {
		// Probes (compose, orchestrators) carry no certificate.
		return nil
	}
	if !ok {
		return connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("auth: %s needs a client certificate signed by the cluster's CA", procedure))
	}
	var admits []Role
	switch {
	case strings.HasPrefix(procedure, reflectionV1), strings.HasPrefix(procedure, reflectionV1Alpha):
		admits = []Role{RoleOperator}
	default:
		var known bool
		if admits, known = Table[procedure]; !known {
			return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("auth: %s is not in the authorisation table: nobody may call it", procedure))
		}
	}
	if !id.Has(admits...) {
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("auth: %s may not call %s (needs one of the roles %v)", id, procedure, admits))
	}
	return nil
}

// Handler enforces the table in front of next: the client's certificate is
// verified against src's CA, then a request that Decide refuses is answered
// with its error, in the protocol the client speaks, and never reaches
// next. A request it admits carries the identity in its context (From).
func Handler(next http.Handler, src *Source, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.Default()
	}
	ew := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok, err := peerIdentity(r, src)
		if err != nil {
			// A certificate from another CA, expired, or not a tenure
			// identity: as good as none.
			log.Warn("auth: client certificate refused", "remote", r.RemoteAddr, "err", err)
		}
		if cerr := Decide(r.URL.Path, id, ok && err == nil); cerr != nil {
			log.Warn("auth: refused", "procedure", r.URL.Path, "remote", r.RemoteAddr, "code", cerr.Code(), "peer", id.Name)
			_ = ew.Write(w, r, cerr)
			return
		}
		if ok {
			r = r.WithContext(context.WithValue(r.Context(), identityKey{}, id))
		}
		next.ServeHTTP(w, r)
	})
}

// peerIdentity verifies the request's client certificate and reads its
// identity; ok=false when there is none (cleartext, or no certificate).
func peerIdentity(r *http.Request, src *Source) (Identity, bool, error) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return Identity{}, false, nil
	}
	leaf, err := src.VerifyClient(r.TLS.PeerCertificates)
	if err != nil {
		return Identity{}, true, err
	}
	id, err := IdentityOf(leaf)
	return id, true, err
}

type identityKey struct{}

// From returns the identity a Handler admitted the request with, and
// whether there was one (false on a server without TLS).
func From(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(Identity)
	return id, ok
}

// RequireHolder refuses a lease session for a holder other than the caller's
// replica id, when the caller is a replica and nothing more: a replica
// leads only under its own id. Other roles (the promoter) name their own
// holder ids. No identity (no TLS) passes: the server was started without it.
func RequireHolder(ctx context.Context, holderID string) error {
	id, ok := From(ctx)
	if !ok || id.Has(RolePromoter, RoleOperator) {
		return nil
	}
	if id.ReplicaID == "" || id.ReplicaID != holderID {
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("auth: %s may open a lease session only as its own replica id, not %q", id, holderID))
	}
	return nil
}

// ErrNoTLS is what a server refuses to start with: no TLS configured and a
// listen address that is not loopback, without --insecure.
var ErrNoTLS = errors.New("auth: refusing to serve without TLS on a non-loopback address (give --tls-cert/--tls-key/--tls-ca, or --insecure)")
