// Package tlshint recognises, in the error of a call that never got an
// answer, a client and a server that disagree about TLS, so the client's
// command can say which flag to change. The Go errors name neither the
// flag nor the file: "unexpected EOF", "x509: certificate signed by
// unknown authority". tenurectl and tenure health share it, each adding
// its own flag names.
//
// Every check is false for an error the server sent (a Connect wire
// error), whatever its message says: a server's answer proves the two
// agreed about TLS.
package tlshint

import (
	"strings"

	"connectrpc.com/connect"
)

// HungUp says whether the server closed the connection under the
// request, as a TLS server does on a cleartext HTTP/2 client (a 400
// reply, then close). Which form the client sees depends on where in its
// preface and request the close lands; all of these were seen: EOF,
// "could not be established" in CI, a broken pipe under -count=3, a reset.
func HungUp(err error) bool {
	return local(err, "EOF", "connection reset", "broken pipe", "client conn could not be established")
}

// UnverifiedServer says whether the server's certificate did not verify:
// it speaks TLS and the client trusts no CA that signed it (no CA given,
// or another cluster's).
func UnverifiedServer(err error) bool {
	return local(err, "x509:")
}

// CleartextServer says whether a TLS client was answered in cleartext:
// the server runs without TLS. The form depends on the protocol the
// client tried first.
func CleartextServer(err error) bool {
	return local(err, "server gave HTTP response to HTTPS client", "does not look like a TLS handshake")
}

// local says whether err is this side's (not the server's answer) and
// its message holds one of subs.
func local(err error, subs ...string) bool {
	if err == nil || connect.IsWireError(err) {
		return false
	}
	msg := err.Error()
	for _, s := range subs {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
