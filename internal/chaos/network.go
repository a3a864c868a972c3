package chaos

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/tenurelog/tenure/internal/chaos/workload"
	"github.com/tenurelog/tenure/pkg/transport"
)

// Network is the chaos harness's fault seam between nodes. Every node's
// outgoing HTTP client (a replica's fetches and lease keep-alives, a
// promoter's fences and probes, the workload's clients) goes through
// Client(src), and every replica's server through Handler(node, ...), so a
// test can cut, drop, delay and pause traffic by node pair:
//
//   - a cut pair refuses new requests before sending them (the caller sees
//     an error wrapping workload.ErrNotSent: certainly no effect), cancels
//     the requests in flight between them (outcome unknown), and fails any
//     read of a body still open between them, so no message crosses a cut
//     on a stream opened before it;
//   - a drop rate loses requests before sending or answers after the server
//     processed them (outcome unknown);
//   - a delay holds each request up to a bound before sending it;
//   - a paused node handles nothing: its incoming requests wait at its
//     server and its outgoing ones at its client until Resume, and then
//     proceed as if nothing happened, however stale (the zombie). On
//     requests already open it neither reads request bytes nor writes
//     response bytes (server side), nor sends request bytes or reads
//     response bytes (client side), until Resume.
//
// Streaming calls (Connect's streaming protocol: FetchStream, AppendStream,
// Tail, WatchLeases) stay open for many messages, so checks made once per
// HTTP request would miss almost all of their traffic. On them, drops and
// delays apply per message instead, in each direction (see linkBody), and
// not to the request as a whole; unary calls are faulted per request.
//
// What it does not model: a paused node's own timers keep running (a real
// SIGSTOP stops them too), and etcd traffic (the promoters' and the lease
// service's clientv3 connections) is never faulted.
type Network struct {
	mu       sync.Mutex
	nodeOf   map[string]string // "host:port" -> node
	cut      map[[2]string]bool
	paused   map[string]chan struct{} // closed on Resume
	inflight map[[2]string]map[*inflightCall]struct{}
	drop     float64
	delay    time.Duration
	rng      *rand.Rand

	// Sent counts requests that reached a server through the network, and
	// Faulted those a fault stopped, delayed or lost (for the run report).
	Sent, Faulted int
}

type inflightCall struct{ cancel context.CancelFunc }

// NewNetwork returns a network without faults. seed makes drops and
// delays reproducible (up to goroutine scheduling).
func NewNetwork(seed uint64) *Network {
	return &Network{
		nodeOf:   map[string]string{},
		cut:      map[[2]string]bool{},
		paused:   map[string]chan struct{}{},
		inflight: map[[2]string]map[*inflightCall]struct{}{},
		rng:      rand.New(rand.NewPCG(seed, 0x6e6574)),
	}
}

// Register names the node listening at hostport ("127.0.0.1:port").
func (n *Network) Register(node, hostport string) {
	n.mu.Lock()
	n.nodeOf[hostport] = node
	n.mu.Unlock()
}

// Client is node src's outgoing HTTP client.
func (n *Network) Client(src string) *http.Client {
	base := transport.NewHTTPClient()
	return &http.Client{Transport: &faultRT{n: n, src: src, base: base.Transport}}
}

// Isolate cuts node from each of others, both ways. Leaving the workload's
// clients out of others is the zombie-leader case: clients keep talking to
// a leader the rest of the cluster cannot reach.
func (n *Network) Isolate(node string, others []string) {
	for _, o := range others {
		if o != node {
			n.Cut(node, o)
		}
	}
}

// Cut severs a and b both ways and cancels what is in flight between them.
func (n *Network) Cut(a, b string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range [][2]string{{a, b}, {b, a}} {
		n.cut[p] = true
		for c := range n.inflight[p] {
			c.cancel()
		}
	}
}

// Flaky makes every request lost with probability drop and held up to
// delay before sending; zero values turn it off. On a stream, each message
// is lost with probability drop/2 in each direction (a unary request is
// lost before sending or after handling with drop/2 each, so a
// request-answer pair on a stream is lost about as often as a unary call)
// and held up to delay/2 in each direction (a round trip up to delay).
func (n *Network) Flaky(drop float64, delay time.Duration) {
	n.mu.Lock()
	n.drop, n.delay = drop, delay
	n.mu.Unlock()
}

// Heal removes every cut, drop and delay (not pauses: see Resume).
func (n *Network) Heal() {
	n.mu.Lock()
	n.cut = map[[2]string]bool{}
	n.drop, n.delay = 0, 0
	n.mu.Unlock()
}

// Pause stops node handling anything until Resume.
func (n *Network) Pause(node string) {
	n.mu.Lock()
	if _, ok := n.paused[node]; !ok {
		n.paused[node] = make(chan struct{})
	}
	n.mu.Unlock()
}

// Resume lets a paused node go on.
func (n *Network) Resume(node string) {
	n.mu.Lock()
	if ch, ok := n.paused[node]; ok {
		close(ch)
		delete(n.paused, node)
	}
	n.mu.Unlock()
}

// gate returns the channel to wait on while node is paused, or nil.
func (n *Network) gate(node string) chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.paused[node]
}

// maxPause bounds how long a paused node's request waits, so a test that
// forgot to Resume still ends.
const maxPause = 30 * time.Second

func waitGate(ch chan struct{}) {
	if ch == nil {
		return
	}
	select {
	case <-ch:
	case <-time.After(maxPause):
	}
}

// waitGateCtx is waitGate for a request already under way: it also gives up
// when the request's context ends (the peer reset the stream, the server is
// closing), so no goroutine of a paused node outlives its request by more
// than that. It moves no bytes: the caller fails its read or write.
func waitGateCtx(ctx context.Context, ch chan struct{}) error {
	if ch == nil {
		return nil
	}
	t := time.NewTimer(maxPause)
	defer t.Stop()
	select {
	case <-ch:
		return nil
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Handler wraps a server's handler: while node is paused, requests wait
// (ignoring their callers' deadlines, as a stopped process's socket buffers
// do) and then run. Requests already running (long polls, and streams that
// stay open across the pause) neither read request bytes nor write
// response bytes while node is paused: see serverBody and serverWriter.
func (n *Network) Handler(node string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		waitGate(n.gate(node))
		ctx := context.WithValue(r.Context(), nodeKey{}, node)
		r = r.WithContext(ctx)
		r.Body = &serverBody{ReadCloser: r.Body, n: n, node: node, ctx: ctx}
		h.ServeHTTP(&serverWriter{ResponseWriter: w, n: n, node: node, ctx: ctx}, r)
		// What the handler left unwritten (the end of a stream, trailers)
		// goes out when it returns, around serverWriter: a paused node
		// does not end its responses either.
		_ = waitGateCtx(ctx, n.gate(node))
	})
}

// serverBody is a request body at a node's server. It exists because a
// stream stays open across a Pause: without it, a paused leader would go on
// reading the pulls its followers send on their open FetchStreams (and
// producers' appends on AppendStreams). A read waits while the node is
// paused, before reading and again before handing over what it read (bytes
// that arrived during the pause are not seen until Resume).
type serverBody struct {
	io.ReadCloser
	n    *Network
	node string
	ctx  context.Context
}

func (b *serverBody) Read(p []byte) (int, error) {
	if err := waitGateCtx(b.ctx, b.n.gate(b.node)); err != nil {
		return 0, err
	}
	k, err := b.ReadCloser.Read(p)
	if gerr := waitGateCtx(b.ctx, b.n.gate(b.node)); gerr != nil {
		return 0, gerr
	}
	return k, err
}

// serverWriter is a node's response writer. It exists for the zombie
// leader: without it, a paused leader kept answering fetches on the streams
// opened before the pause (each answer is a Write and a Flush on the one
// long-lived response). Writes and flushes wait while the node is paused.
// It keeps http.Flusher, which Connect requires of a streaming response,
// and Unwrap, for http.ResponseController.
type serverWriter struct {
	http.ResponseWriter
	n    *Network
	node string
	ctx  context.Context
}

func (w *serverWriter) Write(p []byte) (int, error) {
	if err := waitGateCtx(w.ctx, w.n.gate(w.node)); err != nil {
		return 0, err
	}
	return w.ResponseWriter.Write(p)
}

func (w *serverWriter) Flush() {
	if waitGateCtx(w.ctx, w.n.gate(w.node)) != nil {
		return // the request is over: nothing to flush to
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *serverWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// nodeKey carries the serving node's name in a request's context, for the
// observer's interceptor.
type nodeKey struct{}

func nodeFrom(ctx context.Context) string {
	s, _ := ctx.Value(nodeKey{}).(string)
	return s
}

type faultRT struct {
	n    *Network
	src  string
	base http.RoundTripper
}

// errDropped is a response lost after the server handled the request.
var errDropped = errors.New("chaos: response dropped by the network")

// streaming reports whether a request is a streaming call: its bodies are
// sequences of enveloped messages (a flags byte, a 4-byte big-endian length,
// the message) and it may stay open for many of them. Every Connect
// streaming call has a content type "application/connect+..."; a gRPC call
// is enveloped whether it streams or not, so there the method's name says.
func streaming(req *http.Request) bool {
	ct := req.Header.Get("Content-Type")
	if strings.HasPrefix(ct, "application/connect+") {
		return true
	}
	return strings.HasPrefix(ct, "application/grpc") && strings.HasSuffix(req.URL.Path, "Stream")
}

func (t *faultRT) RoundTrip(req *http.Request) (*http.Response, error) {
	n := t.n
	waitGate(n.gate(t.src))
	stream := streaming(req)
	n.mu.Lock()
	dst := n.nodeOf[req.URL.Host]
	pair := [2]string{t.src, dst}
	cut := n.cut[pair]
	// A stream is dropped and delayed per message (linkBody), not here.
	var dropBefore, dropAfter bool
	var delay time.Duration
	if !stream {
		dropBefore = n.drop > 0 && n.rng.Float64() < n.drop/2
		dropAfter = n.drop > 0 && n.rng.Float64() < n.drop/2
		if n.delay > 0 {
			delay = time.Duration(n.rng.Int64N(int64(n.delay)))
		}
	}
	if cut || dropBefore || delay > 0 {
		n.Faulted++
	}
	n.mu.Unlock()
	if req.Body != nil && (cut || dropBefore) {
		_ = req.Body.Close()
	}
	if cut {
		return nil, fmt.Errorf("%w: chaos: %s -> %s is cut", workload.ErrNotSent, t.src, dst)
	}
	if dropBefore {
		return nil, fmt.Errorf("%w: chaos: request %s -> %s lost", workload.ErrNotSent, t.src, dst)
	}
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-req.Context().Done():
			if req.Body != nil {
				_ = req.Body.Close()
			}
			return nil, fmt.Errorf("%w: %w", workload.ErrNotSent, req.Context().Err())
		}
	}
	ctx, cancel := context.WithCancel(req.Context())
	call := &inflightCall{cancel: cancel}
	n.mu.Lock()
	if n.cut[pair] {
		// Cut while we waited: still nothing sent.
		n.mu.Unlock()
		cancel()
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, fmt.Errorf("%w: chaos: %s -> %s is cut", workload.ErrNotSent, t.src, dst)
	}
	if n.inflight[pair] == nil {
		n.inflight[pair] = map[*inflightCall]struct{}{}
	}
	n.inflight[pair][call] = struct{}{}
	n.Sent++
	n.mu.Unlock()
	done := func() {
		n.mu.Lock()
		delete(n.inflight[pair], call)
		n.mu.Unlock()
		cancel()
	}
	out := req.WithContext(ctx) // a shallow copy: the caller's req is not changed
	newBody := func(rc io.ReadCloser, dir string) *linkBody {
		return &linkBody{ReadCloser: rc, n: n, src: t.src, pair: pair, ctx: ctx, dir: dir, stream: stream}
	}
	if req.Body != nil && req.Body != http.NoBody {
		out.Body = newBody(req.Body, "request")
		if req.GetBody != nil {
			// A transport that replays the body (a retry on a new
			// connection) must replay it through the faults too.
			getBody := req.GetBody
			out.GetBody = func() (io.ReadCloser, error) {
				rc, err := getBody()
				if err != nil || rc == nil || rc == http.NoBody {
					return rc, err
				}
				return newBody(rc, "request"), nil
			}
		}
	}
	resp, err := t.base.RoundTrip(out)
	if err != nil {
		done()
		return nil, err
	}
	if dropAfter {
		_ = resp.Body.Close()
		done()
		n.mu.Lock()
		n.Faulted++
		n.mu.Unlock()
		return nil, errDropped
	}
	// A paused client also stops reading answers.
	waitGate(n.gate(t.src))
	resp.Body = &doneBody{ReadCloser: newBody(resp.Body, "response"), done: sync.OnceFunc(done)}
	return resp, nil
}

// doneBody unregisters its call when the caller closes it.
type doneBody struct {
	io.ReadCloser
	done func()
}

func (b *doneBody) Close() error {
	err := b.ReadCloser.Close()
	b.done()
	return err
}

// errLinkCut fails a read of a body open between a pair that was cut.
var errLinkCut = errors.New("chaos: link cut")

// errMessageLost fails a read of a stream whose next message the network
// lost: the stream ends there, as after a TCP reset. Unlike a request lost
// before sending it does not wrap workload.ErrNotSent: earlier messages on
// the stream may be in flight, and their outcome is unknown.
var errMessageLost = errors.New("chaos: stream message lost by the network")

// linkBody is a request's or response's body on the client side of a link
// src -> dst. RoundTrip's checks happen once per request, which was right
// for unary calls and wrong for streams that stay open for minutes; this
// wrapper exists so that the link's state applies to every read of a body
// still open:
//
//   - while src is paused, nothing is read (for the request body: the
//     transport does not send it; for the response: src reads no answers),
//     checked before reading and again before handing over what was read;
//   - while src and dst are cut, every read fails, so no message crosses
//     the cut even on a stream opened before it (Cut cancels in-flight
//     calls too, but a stream's read may race that cancel);
//   - on a stream, each message is lost with probability drop/2 (the read
//     fails and so does the stream) or held up to delay/2 after it arrived,
//     in each direction. Reads are cut at message boundaries so that each
//     message draws once, whatever the reader's buffer size.
type linkBody struct {
	io.ReadCloser
	n      *Network
	src    string
	pair   [2]string
	ctx    context.Context
	dir    string // "request" or "response", for errors
	stream bool
	env    envelopes // only for streams
}

func (b *linkBody) Read(p []byte) (int, error) {
	if err := b.pass(); err != nil {
		return 0, err
	}
	first := false
	if b.stream {
		first = b.env.boundary()
		p = b.env.limit(p)
	}
	k, err := b.ReadCloser.Read(p)
	if b.stream {
		b.env.advance(p[:k])
		if first && k > 0 {
			if ferr := b.fault(); ferr != nil {
				return 0, ferr
			}
		}
	}
	// Bytes that arrived while src was paused or the pair was cut.
	if perr := b.pass(); perr != nil {
		return 0, perr
	}
	return k, err
}

// pass waits while src is paused and fails if the pair is cut.
func (b *linkBody) pass() error {
	if err := waitGateCtx(b.ctx, b.n.gate(b.src)); err != nil {
		return err
	}
	b.n.mu.Lock()
	cut := b.n.cut[b.pair]
	b.n.mu.Unlock()
	if cut {
		return fmt.Errorf("%w: %s -> %s (%s body)", errLinkCut, b.pair[0], b.pair[1], b.dir)
	}
	return nil
}

// fault draws the network's drop and delay for the message whose first
// bytes were just read.
func (b *linkBody) fault() error {
	n := b.n
	n.mu.Lock()
	drop := n.drop > 0 && n.rng.Float64() < n.drop/2
	var delay time.Duration
	if !drop && n.delay > 1 {
		delay = time.Duration(n.rng.Int64N(int64(n.delay / 2)))
	}
	if drop || delay > 0 {
		n.Faulted++
	}
	if b.dir == "request" {
		n.Sent++
	}
	n.mu.Unlock()
	if drop {
		return fmt.Errorf("%w: %s -> %s (%s)", errMessageLost, b.pair[0], b.pair[1], b.dir)
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-b.ctx.Done():
			return b.ctx.Err()
		}
	}
	return nil
}

// envelopes follows a stream body's message framing (a flags byte, a
// 4-byte big-endian length, then that many bytes), so that linkBody draws
// its faults once per message.
type envelopes struct {
	head   int     // prefix bytes read of the current message; 0 when in its payload or at a boundary
	prefix [5]byte // the current message's prefix
	left   uint64  // payload bytes still to read
}

// boundary reports whether the next byte starts a message.
func (e *envelopes) boundary() bool { return e.head == 0 && e.left == 0 }

// limit cuts p so that a read ends at the end of the prefix or the payload.
func (e *envelopes) limit(p []byte) []byte {
	if e.left > 0 {
		if uint64(len(p)) > e.left {
			return p[:e.left]
		}
		return p
	}
	if len(p) > 5-e.head {
		return p[:5-e.head]
	}
	return p
}

// advance accounts for bytes read.
func (e *envelopes) advance(b []byte) {
	for len(b) > 0 {
		if e.left > 0 {
			k := min(e.left, uint64(len(b)))
			e.left -= k
			b = b[k:]
			continue
		}
		e.prefix[e.head] = b[0]
		e.head++
		b = b[1:]
		if e.head == len(e.prefix) {
			e.head = 0
			e.left = uint64(binary.BigEndian.Uint32(e.prefix[1:]))
		}
	}
}
