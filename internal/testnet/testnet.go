// Package testnet holds network helpers tests share.
package testnet

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// ClosedAddr is a loopback HOST:PORT where nothing listens: a port bound
// and closed again, so connections to it are refused (until the kernel
// hands the port out again, which a test's lifetime does not reach).
func ClosedAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// ConnectJSON is the answer to a unary Connect call made the way a client
// in another language makes it (curl -H 'Content-Type: application/json'
// -d BODY URL): the HTTP status, the raw body and, for an error, the
// Connect error's code and message.
type ConnectJSON struct {
	Status  int
	Body    string
	Code    string
	Message string
}

// PostJSON calls procedure ("/tenure.v1.LeaseService/GetRange") on the
// server at baseURL with a JSON body over HTTP/1.1, as curl does, bounded
// to 30 s. It uses no Connect code: what it sees is what any HTTP client
// sees.
func PostJSON(t testing.TB, baseURL, procedure, body string) ConnectJSON {
	t.Helper()
	hc := &http.Client{Timeout: 30 * time.Second}
	resp, err := hc.Post(baseURL+procedure, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", procedure, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: reading the answer: %v", procedure, err)
	}
	out := ConnectJSON{Status: resp.StatusCode, Body: string(raw)}
	if resp.StatusCode != http.StatusOK {
		var e struct{ Code, Message string }
		if err := json.Unmarshal(raw, &e); err != nil {
			t.Fatalf("POST %s: status %d with a body that is not a Connect error: %q", procedure, resp.StatusCode, raw)
		}
		out.Code, out.Message = e.Code, e.Message
	}
	return out
}
