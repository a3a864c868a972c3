package transport

import (
	"errors"

	"connectrpc.com/connect"
)

// NotHandledHeader is set (to "1") in the metadata of the error that ends a
// request-per-response stream (AppendStream, FetchStream) when the server
// stopped the stream itself, draining or closing: every request on the
// stream that got no answer was never handled, and never will be.
//
// A unary call has this from HTTP/2 itself: a server that stops sends
// GOAWAY naming the last stream it will process, and the client retries
// the later ones. A stream that is already open gets no such guarantee
// from HTTP/2, so the server states it. A pooled AppendStream the server
// drained while it sat idle is the common case: without the marker the
// next append on it would be an unknown outcome though it was never read.
const NotHandledHeader = "Tenure-Not-Handled"

// NotHandledError is a stream's end error carrying NotHandledHeader. Only a
// server that has answered every request it handled on the stream may use
// it.
func NotHandledError(code connect.Code, err error) *connect.Error {
	ce := connect.NewError(code, err)
	ce.Meta().Set(NotHandledHeader, "1")
	return ce
}

// NotHandled reports whether err ended a stream with NotHandledHeader: the
// request that got err instead of an answer changed nothing on the server,
// so sending it again cannot apply it twice.
func NotHandled(err error) bool {
	var ce *connect.Error
	return errors.As(err, &ce) && ce.Meta().Get(NotHandledHeader) == "1"
}
