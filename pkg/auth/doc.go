// Package auth is who may call what in tenure: mutual TLS on every hop, an
// identity read from the peer's certificate, and one table (Table, in
// table.go) of the roles each procedure admits.
//
// # Identities
//
// A certificate names its holder in its Subject common name and its roles in
// URI SANs of the form "urn:tenure:role:<role>" (Role). A replica's
// certificate also carries "urn:tenure:replica:<id>", so a replica can only
// ever open a lease session, and so lead, under its own id. Server
// certificates carry the DNS names and IPs their peers dial (localhost and
// 127.0.0.1 for tenure dev; the service names in compose).
//
// # Decisions
//
// No certificate, or one that does not chain to the CA: Unauthenticated. A
// verified certificate without a role the procedure admits:
// PermissionDenied. In both cases the request never reaches the handler, so
// nothing changes. gRPC health needs no certificate (probes); reflection
// needs the operator role.
//
// # Files
//
// Certificates are PEM files (the CA's, and each service's certificate and
// key) reloaded when they change, without a restart (Source). `tenure certs
// init DIR` writes a CA and one certificate per service and role (Init).
package auth
