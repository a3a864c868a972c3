package transport_test

import (
	"context"
	"errors"
	"io"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// echoUnary answers a request with its fetch offset as the HWM.
func echoUnary(_ context.Context, r *connect.Request[tenurev1.FetchRequest]) (*connect.Response[tenurev1.FetchResponse], error) {
	return connect.NewResponse(&tenurev1.FetchResponse{HighWaterMark: r.Msg.GetFetchOffset()}), nil
}

// echoStream answers each message on a stream as echoUnary does, until the
// client closes its side.
func echoStream(_ context.Context, s *connect.BidiStream[tenurev1.FetchRequest, tenurev1.FetchResponse]) error {
	for {
		m, err := s.Receive()
		if errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
		if err := s.Send(&tenurev1.FetchResponse{HighWaterMark: m.GetFetchOffset()}); err != nil {
			return err
		}
	}
}
