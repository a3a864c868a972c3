package transport

import (
	"context"
	"errors"
	"fmt"
	"io"

	"connectrpc.com/connect"
)

// LostStream turns the error a client stream's Send or Receive returned into
// the one a caller should act on when the connection under the stream broke.
//
// connect-go reports a response body that ends mid-stream (the server
// crashed, the connection was cut) as Internal ("protocol error: incomplete
// envelope") or Unknown, the codes of a server bug, which callers do not
// retry, and a connection the peer reset (a server process killed while
// bytes were in flight) as Canceled, the code of a call its caller
// canceled. Each is a lost connection: Unavailable, with the usual meaning
// that a request sent and not answered has an unknown outcome. Errors the
// server sent (wire errors), the caller's own context errors and a clean
// end of the stream (io.EOF) are returned as they are.
//
// Clients built with ClientOptions apply it to every stream and unary call
// already; calling it again changes nothing.
func LostStream(err error) error {
	var ce *connect.Error
	if !errors.As(err, &ce) || connect.IsWireError(err) || errors.Is(err, io.EOF) {
		return err
	}
	switch ce.Code() {
	case connect.CodeInternal, connect.CodeUnknown:
	case connect.CodeCanceled:
		if errors.Is(err, context.Canceled) {
			return err // the caller's context
		}
	default:
		return err
	}
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("connection lost mid-stream: %w", ce.Unwrap()))
}

// lostConnection is the interceptor ClientOptions puts on every client:
// a connection the peer reset is Unavailable, not the Canceled connect-go
// reports (LostStream), on unary calls and streams alike. A call whose own
// context ended keeps its Canceled or DeadlineExceeded.
type lostConnection struct{}

var _ connect.Interceptor = lostConnection{}

func (lostConnection) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		resp, err := next(ctx, req)
		if err != nil && ctx.Err() == nil && connect.CodeOf(err) == connect.CodeCanceled {
			err = LostStream(err)
		}
		return resp, err
	}
}

func (lostConnection) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		return &lostConnectionConn{StreamingClientConn: next(ctx, spec), ctx: ctx}
	}
}

func (lostConnection) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// lostConnectionConn applies LostStream to a client stream's Send and
// Receive while its context is live.
type lostConnectionConn struct {
	connect.StreamingClientConn
	ctx context.Context
}

func (c *lostConnectionConn) lost(err error) error {
	if err == nil || c.ctx.Err() != nil {
		return err
	}
	return LostStream(err)
}

func (c *lostConnectionConn) Send(m any) error { return c.lost(c.StreamingClientConn.Send(m)) }

func (c *lostConnectionConn) Receive(m any) error {
	return c.lost(c.StreamingClientConn.Receive(m))
}
