// Package appender appends to a range's leader through LogService's
// AppendStream: a producer keeps streams open and each append is one stream
// message each way, instead of one unary call (request setup, headers and a
// handler goroutine per append). tenurectl bench and the benchmarks use it;
// so can any Go service that produces to tenure.
package appender

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// Appender appends to one replica (a range's leader) over a pool of
// AppendStreams. It is safe for concurrent use: each call in flight holds a
// stream of its own (a stream carries one append at a time), and a stream
// goes back to the pool when its append is answered.
type Appender struct {
	// dial makes the client of a leader another replica named (FollowLeader);
	// nil: no following.
	dial func(url string) tenurev1connect.LogServiceClient

	mu     sync.Mutex
	client tenurev1connect.LogServiceClient
	// url is the leader followed to last ("" until then); gen counts the
	// follows, so a stream of an earlier leader never goes back to the pool.
	url    string
	gen    int
	idle   []*stream
	closed bool
}

type stream struct {
	s      *connect.BidiStreamForClient[tenurev1.AppendStreamRequest, tenurev1.AppendStreamResponse]
	cancel context.CancelFunc
	gen    int
}

// Option configures an Appender.
type Option func(*Appender)

// FollowLeader makes the Appender follow a replica's not-leader answer:
// when the replica it appends to refuses an append naming another leader
// (a wire.NotLeader detail with its URL), it appends to that leader from
// then on, through a client from dial, and sends the refused append there
// once more. A refusal wrote nothing, so the retry cannot write it twice.
// At most maxFollows leaders per Append. Without it (the default), the
// refusal is Append's answer.
func FollowLeader(dial func(url string) tenurev1connect.LogServiceClient) Option {
	return func(a *Appender) { a.dial = dial }
}

// maxFollows bounds the leaders one Append follows: leadership moving that
// often is for the caller to wait out, not to chase.
const maxFollows = 3

// New returns an Appender that appends through client.
func New(client tenurev1connect.LogServiceClient, opts ...Option) *Appender {
	a := &Appender{client: client}
	for _, o := range opts {
		o(a)
	}
	return a
}

// errClosed is returned by Append after Close.
var errClosed = errors.New("appender: closed")

// Append appends records to rangeID and returns the acknowledgement: the
// records are committed (on a quorum) when it returns without error. On an
// error the stream it used is dropped, and the outcome is what Append's is
// for the same error: a refusal (InvalidArgument, NotFound, a
// FailedPrecondition naming another leader) wrote nothing, and so did an
// error for which transport.NotHandled reports true; anything else,
// including ctx ending and a connection lost mid-append (Unavailable, see
// transport.LostStream), is unknown.
//
// A stream the server stopped (a graceful restart drains every open stream,
// idle ones included) answers the append sent on it with an error saying it
// was never handled. Append then drops the pooled streams, which the same
// server stopped too, and sends the append once more on a new stream:
// nothing was written, so the retry cannot write it twice.
func (a *Appender) Append(ctx context.Context, rangeID string, records [][]byte) (*tenurev1.AppendResponse, error) {
	ack, err := a.appendOnce(ctx, rangeID, records)
	if err != nil && transport.NotHandled(err) && ctx.Err() == nil {
		a.dropIdle()
		ack, err = a.appendOnce(ctx, rangeID, records)
	}
	for follows := 0; err != nil && a.dial != nil && follows < maxFollows && ctx.Err() == nil; follows++ {
		d := wire.NotLeader(err)
		if d.GetLeaderUrl() == "" || !a.follow(d.GetLeaderUrl()) {
			break
		}
		ack, err = a.appendOnce(ctx, rangeID, records)
	}
	return ack, err
}

// follow makes url the replica appended to; false if it already is (the
// leader named is the one that refused: nothing to follow).
func (a *Appender) follow(url string) bool {
	a.mu.Lock()
	if a.url == url {
		a.mu.Unlock()
		return false
	}
	a.client, a.url = a.dial(url), url
	a.gen++
	idle := a.idle
	a.idle = nil
	a.mu.Unlock()
	for _, st := range idle {
		st.close()
	}
	return true
}

// appendOnce sends the append on one stream and waits for its answer.
func (a *Appender) appendOnce(ctx context.Context, rangeID string, records [][]byte) (*tenurev1.AppendResponse, error) {
	st, err := a.take()
	if err != nil {
		return nil, err
	}
	// The stream outlives the call; the call's context ends only this call,
	// and the stream with it (its state is then unknown).
	stop := context.AfterFunc(ctx, st.cancel)
	err = st.s.Send(&tenurev1.AppendStreamRequest{Append: &tenurev1.AppendRequest{RangeId: rangeID, Records: records}})
	var m *tenurev1.AppendStreamResponse
	if err == nil || errors.Is(err, io.EOF) {
		// A Send on a stream the server ended fails with io.EOF; the
		// server's reason is what Receive returns.
		m, err = st.s.Receive()
	}
	// A leader that crashed or was cut off ends the body mid-stream; that
	// is Unavailable (outcome unknown), not the Internal connect-go says.
	err = transport.LostStream(err)
	if !stop() {
		err = fmt.Errorf("append: %w (stream ended: %v)", context.Cause(ctx), err)
	}
	if err == nil && m.GetAppend() == nil {
		err = errors.New("append: the answer carries no acknowledgement")
	}
	if err != nil {
		st.close()
		return nil, err
	}
	a.put(st)
	return m.GetAppend(), nil
}

// take returns an idle stream or opens one.
func (a *Appender) take() (*stream, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, errClosed
	}
	if n := len(a.idle); n > 0 {
		st := a.idle[n-1]
		a.idle = a.idle[:n-1]
		return st, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &stream{s: a.client.AppendStream(ctx), cancel: cancel, gen: a.gen}, nil
}

// put returns a stream to the pool, or closes it if the Appender closed
// or followed another leader since the stream opened.
func (a *Appender) put(st *stream) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed || st.gen != a.gen {
		st.close()
		return
	}
	a.idle = append(a.idle, st)
}

func (st *stream) close() {
	st.cancel()
	_ = st.s.CloseRequest()
	_ = st.s.CloseResponse()
}

// dropIdle closes the idle streams: the next append opens a new one.
func (a *Appender) dropIdle() {
	a.mu.Lock()
	idle := a.idle
	a.idle = nil
	a.mu.Unlock()
	for _, st := range idle {
		st.close()
	}
}

// Close closes the idle streams; calls in flight close theirs when they
// end. Append fails after Close.
func (a *Appender) Close() {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	a.dropIdle()
}
