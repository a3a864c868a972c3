// Package testnet holds network helpers tests share.
package testnet

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tenurelog/tenure/internal/freeport"
)

// FreeAddr is a loopback HOST:PORT where nothing listens, below the
// kernel's ephemeral range (internal/freeport), for the first start of a
// server the test stops and starts again on the same address. A port from
// ":0" could be taken, while the server was down, by any connection's
// local port or any ":0" listener of the tests running beside it, and the
// restart then failed with "address already in use"; a port below the
// range is taken by nobody but a listener asking for that very port.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := freeport.Listen()
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// ClosedAddr is a loopback HOST:PORT where nothing listens, so connections
// to it are refused. Its port is a FreeAddr's: one from ":0" the kernel
// could hand out again, to another test's ":0" listener or as a dial's own
// local port (a self-connect), and a connection to it would then not be
// refused.
func ClosedAddr(t testing.TB) string {
	t.Helper()
	return FreeAddr(t)
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

// ConnectStream is what a server-streaming Connect call answered, read the
// way a client in another language reads it: each message's JSON, and the
// end-of-stream message's JSON ("{}" for a clean end, else
// {"error":{"code":...,"message":...}}).
type ConnectStream struct {
	Status   int
	Messages []string
	End      string
}

// StreamJSON calls a server-streaming procedure with one JSON request in
// the Connect streaming protocol (application/connect+json, enveloped), as
// curl --data-binary @envelope does, with the given extra headers
// (Connect-Timeout-Ms), and reads to the end of the stream, bounded to 30 s.
func StreamJSON(t testing.TB, baseURL, procedure, body string, header http.Header) ConnectStream {
	t.Helper()
	env := make([]byte, 5, 5+len(body))
	binary.BigEndian.PutUint32(env[1:], uint32(len(body)))
	env = append(env, body...)
	req, err := http.NewRequest(http.MethodPost, baseURL+procedure, bytes.NewReader(env))
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "application/connect+json")
	hc := &http.Client{Timeout: 30 * time.Second}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", procedure, err)
	}
	defer resp.Body.Close()
	out := ConnectStream{Status: resp.StatusCode}
	for {
		var prefix [5]byte
		if _, err := io.ReadFull(resp.Body, prefix[:]); err != nil {
			t.Fatalf("POST %s: the stream ended without its end message (%v); messages so far: %q", procedure, err, out.Messages)
		}
		msg := make([]byte, binary.BigEndian.Uint32(prefix[1:]))
		if _, err := io.ReadFull(resp.Body, msg); err != nil {
			t.Fatalf("POST %s: a message cut short: %v", procedure, err)
		}
		if prefix[0]&2 != 0 { // the end-of-stream flag
			out.End = string(msg)
			return out
		}
		out.Messages = append(out.Messages, string(msg))
	}
}
