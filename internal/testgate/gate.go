// Package testgate is a test seam: a replica's outgoing HTTP client that a
// test can close, so the replica's fetches fail as if it were partitioned
// from its leader.
package testgate

import (
	"errors"
	"io"
	"net/http"
	"sync/atomic"

	"github.com/tenurelog/tenure/pkg/transport"
)

// ErrClosed is what a call through a closed Gate fails with.
var ErrClosed = errors.New("gate: partitioned by the test")

// Gate is a connect.HTTPClient that fails every call while closed. A
// FetchStream outlives the call that opened it, so closing the gate also
// fails reads of the answers of calls already open.
type Gate struct {
	c      *http.Client
	closed atomic.Bool
}

// New returns an open Gate over a tenure HTTP client.
func New() *Gate { return &Gate{c: transport.NewHTTPClient()} }

// Close partitions the replica; Open heals it.
func (g *Gate) Close() { g.closed.Store(true) }

// Open lets calls through again.
func (g *Gate) Open() { g.closed.Store(false) }

// Do sends r unless the gate is closed.
func (g *Gate) Do(r *http.Request) (*http.Response, error) {
	if g.closed.Load() {
		return nil, ErrClosed
	}
	resp, err := g.c.Do(r)
	if err != nil {
		return nil, err
	}
	resp.Body = &body{ReadCloser: resp.Body, g: g}
	return resp, nil
}

type body struct {
	io.ReadCloser
	g *Gate
}

func (b *body) Read(p []byte) (int, error) {
	if b.g.closed.Load() {
		return 0, ErrClosed
	}
	return b.ReadCloser.Read(p)
}
