package replica

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"sync"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// AppendStream answers each append on the stream as Append would, one at a
// time and in order.
func (s *Replica) AppendStream(ctx context.Context, st *connect.BidiStream[tenurev1.AppendStreamRequest, tenurev1.AppendStreamResponse]) error {
	return serveStream(ctx, s, st.Receive, st.Send, func(ctx context.Context, m *tenurev1.AppendStreamRequest) (*tenurev1.AppendStreamResponse, error) {
		if m.GetAppend() == nil {
			return nil, invalidf("append stream message carries no append")
		}
		a, err := s.append(ctx, m.GetAppend())
		if err != nil {
			return nil, err
		}
		return &tenurev1.AppendStreamResponse{Append: a}, nil
	})
}

// FetchStream answers each pull on the stream as Fetch would, one at a time
// and in order.
func (s *Replica) FetchStream(ctx context.Context, st *connect.BidiStream[tenurev1.FetchStreamRequest, tenurev1.FetchStreamResponse]) error {
	return serveStream(ctx, s, st.Receive, st.Send, func(ctx context.Context, m *tenurev1.FetchStreamRequest) (*tenurev1.FetchStreamResponse, error) {
		if m.GetFetch() == nil {
			return nil, invalidf("fetch stream message carries no fetch")
		}
		a, err := s.fetch(ctx, m.GetFetch())
		if err != nil {
			return nil, err
		}
		return &tenurev1.FetchStreamResponse{Fetch: a}, nil
	})
}

// serveStream runs a request-per-response stream: each received request is
// handled to completion and answered before the next is read, so answers
// come in request order and a stream holds at most one request in hand. It
// ends cleanly when the client closes its side, with handle's error when a
// request fails (as the unary call would fail), and with Unavailable when the
// server begins to stop or the replica closes: after the request in hand is
// answered, never in the middle of one.
//
// That Unavailable carries transport.NotHandledHeader: every request the
// loop handled was answered, so a request the client got no answer for was
// never handled, and a client may send it again without applying it twice.
// So when the stop meets a request in hand that failed (or whose answer
// could not be sent), the stream ends with that request's own error
// instead: it was handled, and its outcome is what its error says.
//
// The requests are received, handled and answered on a goroutine of their
// own, while this one watches for the server stopping: an idle stream (a
// producer with nothing to append, a follower between polls) would
// otherwise sit in Receive and hold a graceful Shutdown until its deadline.
// One goroutine does all three so that a request costs no hand-off between
// goroutines. To stop, this one closes the request body (stopReceiving),
// which ends a waiting Receive, and waits for that goroutine to end: nothing
// may touch the stream after the handler returns (interceptors keep state
// in it).
func serveStream[Req, Res any](ctx context.Context, s *Replica, recv func() (*Req, error), send func(*Res) error, handle func(context.Context, *Req) (*Res, error)) error {
	var (
		// mu is held while a request is handled and answered; stopped,
		// set under it once serveStream is returning, keeps the loop from
		// handling or answering anything after that.
		mu      sync.Mutex
		stopped bool
	)
	// loopEnd is how the loop ended: err, and whether err is the outcome of
	// a request the loop handled (handle failed, or its answer was not
	// sent) rather than of receiving the next one.
	type loopEnd struct {
		err    error
		inHand bool
	}
	ended := make(chan loopEnd, 1) // buffered: the loop may end after we stopped listening
	go func() {
		ended <- func() loopEnd {
			for {
				m, err := recv()
				if errors.Is(err, io.EOF) {
					return loopEnd{} // the client closed its side
				}
				if err != nil {
					return loopEnd{err: err}
				}
				mu.Lock()
				if stopped {
					// Received after the stop: dropped unhandled, as
					// NotHandledHeader promises.
					mu.Unlock()
					return loopEnd{}
				}
				res, err := handle(ctx, m)
				if err != nil {
					err = toConnect(err) // the code the unary call answers
				} else {
					err = send(res)
				}
				mu.Unlock()
				if err != nil {
					return loopEnd{err: err, inHand: true}
				}
			}
		}()
	}()
	var why error
	select {
	case e := <-ended:
		return e.err
	case <-transport.Draining(ctx):
		why = transport.NotHandledError(connect.CodeUnavailable, errors.New("replica is stopping; open a new stream"))
	case <-s.ctx.Done():
		why = transport.NotHandledError(connect.CodeUnavailable, errors.New("replica is closed"))
	case <-ctx.Done():
		why = ctx.Err()
	}
	// Wait for the request in hand, if any, to be answered, then end the
	// receiving goroutine's Receive and wait for it to return.
	mu.Lock()
	stopped = true
	mu.Unlock()
	stopReceiving(ctx)
	if e := <-ended; e.inHand {
		// The request in hand was handled and failed: the client must
		// learn that outcome, not that its request was never handled.
		return e.err
	}
	return why
}

type requestBodyKey struct{}

// withStoppableStreams wraps a service handler so that calls to the named
// procedures carry their request body in their context, for stopReceiving.
// Connect does not hand a handler its request body; the body stays the one
// Connect reads.
func withStoppableStreams(h http.Handler, procedures ...string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if slices.Contains(procedures, r.URL.Path) {
			r = r.WithContext(context.WithValue(r.Context(), requestBodyKey{}, r.Body))
		}
		h.ServeHTTP(w, r)
	})
}

// stopReceiving closes the request body of the stream whose context is ctx,
// so a Receive waiting on it returns an error. An HTTP/2 request body may be
// closed while another goroutine reads it (the read is woken); bidi streams
// are HTTP/2 only.
func stopReceiving(ctx context.Context) {
	if b, ok := ctx.Value(requestBodyKey{}).(io.Closer); ok {
		_ = b.Close()
	}
}
