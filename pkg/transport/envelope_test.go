package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// envelope returns the Connect/gRPC framing of msg: flags, length, msg.
func envelope(msg []byte) []byte {
	b := []byte{0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

// chunked is a body that returns the given chunks one per Read (as a pipe
// returns one write per Read), then err.
type chunked struct {
	chunks [][]byte
	err    error
	reads  int
}

func (c *chunked) Read(p []byte) (int, error) {
	c.reads++
	if len(c.chunks) == 0 {
		return 0, c.err
	}
	n := copy(p, c.chunks[0])
	if c.chunks[0] = c.chunks[0][n:]; len(c.chunks[0]) == 0 {
		c.chunks = c.chunks[1:]
	}
	return n, nil
}

func (c *chunked) Close() error { return nil }

// reads returns what each Read of an envelopeBody over chunks returned,
// with a buffer of size bufSize, until an error.
func reads(t *testing.T, bufSize int, chunks ...[]byte) ([][]byte, error) {
	t.Helper()
	e := &envelopeBody{body: &chunked{chunks: chunks, err: io.EOF}}
	var out [][]byte
	buf := make([]byte, bufSize)
	for range 100 {
		n, err := e.Read(buf)
		if n > 0 {
			out = append(out, bytes.Clone(buf[:n]))
		}
		if err != nil {
			return out, err
		}
	}
	t.Fatal("no error after 100 reads")
	return nil, nil
}

func TestEnvelopeBodyJoinsPrefixAndMessage(t *testing.T) {
	a, b := envelope([]byte("first message")), envelope([]byte("second"))
	// connect-go's writes: prefix, message, prefix, message.
	got, err := reads(t, 1024, a[:5], a[5:], b[:5], b[5:])
	if !errors.Is(err, io.EOF) {
		t.Fatalf("final error = %v, want io.EOF", err)
	}
	if len(got) != 2 || !bytes.Equal(got[0], a) || !bytes.Equal(got[1], b) {
		t.Fatalf("reads = %q, want one per envelope: %q, %q", got, a, b)
	}
}

func TestEnvelopeBodyOddSplits(t *testing.T) {
	a, empty, b := envelope([]byte("abc")), envelope(nil), envelope(bytes.Repeat([]byte("x"), 40))
	all := bytes.Join([][]byte{a, empty, b}, nil)
	cases := map[string][][]byte{
		"prefix split":                 {a[:2], a[2:4], a[4:], empty, b},
		"envelopes in one write":       {all},
		"an envelope and a half":       {all[:len(a)+3], all[len(a)+3:]},
		"byte by byte":                 splitEvery(all, 1),
		"empty message ends its write": {a, empty[:5], b},
	}
	for name, chunks := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := reads(t, 1024, chunks...)
			if !errors.Is(err, io.EOF) {
				t.Fatalf("final error = %v", err)
			}
			if joined := bytes.Join(got, nil); !bytes.Equal(joined, all) {
				t.Fatalf("bytes = %q, want %q", joined, all)
			}
			// Every Read but one that ends on an error returns at an
			// envelope boundary.
			pos := 0
			for i, r := range got {
				pos += len(r)
				if !boundary(all, pos) && i != len(got)-1 {
					t.Fatalf("read %d ends at %d, inside an envelope (reads %q)", i, pos, got)
				}
			}
		})
	}
}

// boundary reports whether pos is at the start of an envelope of stream.
func boundary(stream []byte, pos int) bool {
	at := 0
	for at < pos {
		at += 5 + int(binary.BigEndian.Uint32(stream[at+1:]))
	}
	return at == pos
}

func splitEvery(b []byte, n int) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		k := min(n, len(b))
		out = append(out, b[:k])
		b = b[k:]
	}
	return out
}

func TestEnvelopeBodyMessageLargerThanBuffer(t *testing.T) {
	a := envelope(bytes.Repeat([]byte("y"), 100))
	got, err := reads(t, 16, a[:5], a[5:])
	if !errors.Is(err, io.EOF) {
		t.Fatalf("final error = %v", err)
	}
	if joined := bytes.Join(got, nil); !bytes.Equal(joined, a) {
		t.Fatalf("bytes = %q, want %q", joined, a)
	}
	for i, r := range got[:len(got)-1] {
		if len(r) != 16 {
			t.Fatalf("read %d returned %d bytes with a 16-byte buffer and more of the envelope to come", i, len(r))
		}
	}
}

func TestEnvelopeBodyPassesErrorsWithPartialEnvelope(t *testing.T) {
	boom := errors.New("pipe closed")
	a := envelope([]byte("cut short"))
	e := &envelopeBody{body: &chunked{chunks: [][]byte{a[:7]}, err: boom}}
	buf := make([]byte, 64)
	n, err := e.Read(buf)
	if n != 7 || !errors.Is(err, boom) {
		t.Fatalf("Read = %d, %v; want the 7 bytes there are and the body's error", n, err)
	}
}

// TestEnvelopeTransportWrapsOnlyStreams checks which requests get the
// envelope body: a wrapped bare body would hold a Read for bytes its
// writer may never send.
func TestEnvelopeTransportWrapsOnlyStreams(t *testing.T) {
	cases := []struct {
		ct      string
		length  int64
		wrapped bool
	}{
		{"application/connect+proto", -1, true},
		{"application/connect+json", -1, true},
		{"application/grpc", -1, true},
		{"application/grpc+proto", -1, true},
		{"application/proto", -1, false},         // Connect unary
		{"application/connect+proto", 12, false}, // a known length: sent as is
		{"text/plain", -1, false},
		{"application/grpcfoo", -1, false},
	}
	for _, c := range cases {
		var body io.ReadCloser
		rt := envelopeTransport{base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			body = r.Body
			return nil, errors.New("not sent")
		})}
		req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1:1/x", io.NopCloser(strings.NewReader("hello")))
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = c.length
		req.Header.Set("Content-Type", c.ct)
		_, _ = rt.RoundTrip(req)
		if _, ok := body.(*envelopeBody); ok != c.wrapped {
			t.Errorf("%s, length %d: wrapped = %v, want %v", c.ct, c.length, ok, c.wrapped)
		}
		if _, ok := req.Body.(*envelopeBody); ok {
			t.Errorf("%s: the caller's request was modified", c.ct)
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestEnvelopeBodyDoesNotWaitAtBoundary: a Read that has a whole envelope
// returns it while the writer is idle; it never waits for the next message.
func TestEnvelopeBodyDoesNotWaitAtBoundary(t *testing.T) {
	pr, pw := io.Pipe()
	defer pr.Close()
	e := &envelopeBody{body: pr}
	a := envelope([]byte("only one"))
	go func() {
		_, _ = pw.Write(a[:5])
		_, _ = pw.Write(a[5:])
		// and then nothing more for now
	}()
	done := make(chan int, 1)
	go func() {
		n, _ := e.Read(make([]byte, 1024))
		done <- n
	}()
	select {
	case n := <-done:
		if n != len(a) {
			t.Fatalf("Read = %d bytes, want the whole envelope, %d", n, len(a))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Read held a complete envelope waiting for more")
	}
	_ = pw.Close()
}
