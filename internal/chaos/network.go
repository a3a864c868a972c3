package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
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
//     an error wrapping workload.ErrNotSent: certainly no effect) and
//     cancels the requests in flight between them (outcome unknown);
//   - a drop rate loses requests before sending or answers after the server
//     processed them (outcome unknown);
//   - a delay holds each request up to a bound before sending it;
//   - a paused node handles nothing: its incoming requests wait at its
//     server and its outgoing ones at its client until Resume, and then
//     proceed as if nothing happened, however stale (the zombie).
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
// delay before sending; zero values turn it off.
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

// Handler wraps a server's handler: while node is paused, requests wait
// (ignoring their callers' deadlines, as a stopped process's socket buffers
// do) and then run.
func (n *Network) Handler(node string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		waitGate(n.gate(node))
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), nodeKey{}, node)))
	})
}

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

func (t *faultRT) RoundTrip(req *http.Request) (*http.Response, error) {
	n := t.n
	waitGate(n.gate(t.src))
	n.mu.Lock()
	dst := n.nodeOf[req.URL.Host]
	pair := [2]string{t.src, dst}
	cut := n.cut[pair]
	dropBefore := n.drop > 0 && n.rng.Float64() < n.drop/2
	dropAfter := n.drop > 0 && n.rng.Float64() < n.drop/2
	var delay time.Duration
	if n.delay > 0 {
		delay = time.Duration(n.rng.Int64N(int64(n.delay)))
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
	resp, err := t.base.RoundTrip(req.WithContext(ctx))
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
	resp.Body = &doneBody{ReadCloser: resp.Body, done: sync.OnceFunc(done)}
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
