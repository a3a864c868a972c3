package tlshint

import (
	"errors"
	"testing"

	"connectrpc.com/connect"
)

// Each form of a TLS disagreement seen from the client is recognised, and
// none is when the server sent the error: an answer proves the two agreed.
func TestRecognisesTheClientsOwnErrorsOnly(t *testing.T) {
	for _, tc := range []struct {
		msg                          string
		hungUp, unverified, cleartxt bool
	}{
		{"unavailable: unexpected EOF", true, false, false},
		{"unavailable: read tcp 127.0.0.1:1->127.0.0.1:2: read: connection reset by peer", true, false, false},
		{"unavailable: http2: client conn could not be established", true, false, false},
		{`canceled: Post "http://127.0.0.1:1/x": write tcp 127.0.0.1:2->127.0.0.1:1: write: broken pipe`, true, false, false},
		{"unavailable: tls: failed to verify certificate: x509: certificate signed by unknown authority", false, true, false},
		{"unavailable: http: server gave HTTP response to HTTPS client", false, false, true},
		{"unavailable: tls: first record does not look like a TLS handshake", false, false, true},
		{"unavailable: dial tcp 127.0.0.1:1: connect: connection refused", false, false, false},
	} {
		err := errors.New(tc.msg)
		if HungUp(err) != tc.hungUp || UnverifiedServer(err) != tc.unverified || CleartextServer(err) != tc.cleartxt {
			t.Errorf("%q: HungUp %v UnverifiedServer %v CleartextServer %v, want %v %v %v",
				tc.msg, HungUp(err), UnverifiedServer(err), CleartextServer(err), tc.hungUp, tc.unverified, tc.cleartxt)
		}
	}
	// A server's answer that happens to quote such a text is an answer.
	wire := connect.NewWireError(connect.CodeUnavailable, errors.New("replica r2 at https://x: x509: certificate signed by unknown authority; unexpected EOF"))
	if HungUp(wire) || UnverifiedServer(wire) || CleartextServer(wire) {
		t.Errorf("a wire error %v is taken for this client's own", wire)
	}
}
