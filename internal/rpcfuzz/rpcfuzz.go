// Package rpcfuzz sends arbitrary bytes to a real tenure server as Connect
// requests: the fuzz targets of every service use it (issue 25, "every RPC
// fuzzed"). A fuzz input picks a procedure of the service and a body; the
// body goes out as the request message's bytes, framed the way the
// procedure's protocol frames it (a unary body, or one stream envelope), so
// the server's own decoding and validation face whatever the fuzzer makes,
// including well-formed messages with arbitrary fields.
package rpcfuzz

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Procedure is one RPC of a service.
type Procedure struct {
	Path      string // "/tenure.v1.ReplicaService/Fence"
	Streaming bool   // any streaming side: framed as a Connect stream
}

// Procedures lists the RPCs of the named service in its descriptor.
func Procedures(svc protoreflect.ServiceDescriptor) []Procedure {
	var out []Procedure
	for i := range svc.Methods().Len() {
		m := svc.Methods().Get(i)
		out = append(out, Procedure{
			Path:      "/" + string(svc.FullName()) + "/" + string(m.Name()),
			Streaming: m.IsStreamingClient() || m.IsStreamingServer(),
		})
	}
	return out
}

// callTimeout bounds each call (sent as Connect-Timeout-Ms, so long polls
// such as Fetch, Tail and WatchLeases end soon) and the client's wait for it.
// Every handler decodes and validates its input, and answers a refusal, in
// well under it; only a long poll waits it out, and every such input cost
// the whole bound (at 300 ms the lease target ran ~300 inputs a second, at
// 50 ms ~500 on the same loaded box).
const callTimeout = 50 * time.Millisecond

// maxAnswerBytes bounds what is read of an answer.
const maxAnswerBytes = 1 << 20

// Send posts body to the procedure at baseURL and reads (and discards) a
// bounded part of the answer. The status is returned for the caller's
// checks; transport errors are returned too. A fuzz target fails only on
// what the server does (a panic, a broken invariant, a dead server),
// never on a refusal.
func Send(hc *http.Client, baseURL string, p Procedure, body []byte) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*callTimeout)
	defer cancel()
	ct := "application/proto"
	payload := body
	if p.Streaming {
		ct = "application/connect+proto"
		// One envelope: flags 0, big-endian length, the message.
		var b bytes.Buffer
		b.WriteByte(0)
		_ = binary.Write(&b, binary.BigEndian, uint32(len(body)))
		b.Write(body)
		payload = b.Bytes()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+p.Path, bytes.NewReader(payload))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", ct)
	req.Header.Set("Connect-Protocol-Version", "1")
	req.Header.Set("Connect-Timeout-Ms", strconv.Itoa(int(callTimeout/time.Millisecond)))
	resp, err := hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("rpcfuzz: %s: %w", p.Path, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxAnswerBytes))
	return resp.StatusCode, nil
}

// Pick chooses a procedure by an input byte.
func Pick(ps []Procedure, b byte) Procedure { return ps[int(b)%len(ps)] }

// Seed adds m, marshalled, to f's corpus as a call of the procedure at path.
func Seed(f *testing.F, ps []Procedure, path string, m proto.Message) {
	f.Helper()
	i := slices.IndexFunc(ps, func(p Procedure) bool { return p.Path == path })
	if i < 0 {
		f.Fatalf("rpcfuzz: no procedure %s", path)
	}
	b, err := proto.Marshal(m)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(byte(i), b)
}
