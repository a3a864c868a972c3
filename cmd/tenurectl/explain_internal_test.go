package main

import (
	"errors"
	"strings"
	"testing"

	"connectrpc.com/connect"
)

// A cleartext client hung up on by a TLS server, and the refusals of a TLS
// cluster, are explained with what to pass.
func TestExplainTLSErrors(t *testing.T) {
	for _, tc := range []struct {
		err  error
		url  string
		want string
	}{
		{connect.NewError(connect.CodeUnavailable, errors.New("write tcp 127.0.0.1:1->127.0.0.1:2: write: broken pipe")), "http://127.0.0.1:7000", "runs mutual TLS; pass --cacert"},
		{connect.NewError(connect.CodeCanceled, errors.New("unexpected EOF")), "http://127.0.0.1:7000", "runs mutual TLS"},
		{connect.NewError(connect.CodeUnauthenticated, errors.New("auth: needs a client certificate")), "https://127.0.0.1:7000", "wants a client certificate"},
		{connect.NewError(connect.CodePermissionDenied, errors.New("auth: producer may not")), "https://127.0.0.1:7000", "refused this certificate"},
	} {
		if got := explain(tc.err, "the lease service", tc.url, "--lease").Error(); !strings.Contains(got, tc.want) {
			t.Errorf("explain(%v, %s) = %q, want it to say %q", tc.err, tc.url, got, tc.want)
		}
	}
}
