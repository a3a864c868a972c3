package transport

import (
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
// retry. It is a lost connection: Unavailable, with the usual meaning that
// a request sent and not answered has an unknown outcome. Errors the server
// sent (wire errors), context errors and a clean end of the stream (io.EOF)
// are returned as they are.
func LostStream(err error) error {
	var ce *connect.Error
	if !errors.As(err, &ce) || connect.IsWireError(err) || errors.Is(err, io.EOF) {
		return err
	}
	if ce.Code() != connect.CodeInternal && ce.Code() != connect.CodeUnknown {
		return err
	}
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("connection lost mid-stream: %w", ce.Unwrap()))
}
