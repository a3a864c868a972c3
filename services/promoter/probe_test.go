package promoter

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"os"
	"syscall"
	"testing"

	"connectrpc.com/connect"
)

// A probe whose connection broke (the replica died mid-probe) is asked
// again at once; a slow or erroring replica is not.
func TestConnectionLost(t *testing.T) {
	wrapped := func(err error) error {
		return connect.NewError(connect.CodeCanceled, &url.Error{Op: "Post", URL: "http://127.0.0.1:1/x",
			Err: &net.OpError{Op: "write", Net: "tcp", Err: err}})
	}
	for name, tc := range map[string]struct {
		err  error
		lost bool
	}{
		"broken pipe":       {wrapped(os.NewSyscallError("write", syscall.EPIPE)), true},
		"reset":             {wrapped(os.NewSyscallError("read", syscall.ECONNRESET)), true},
		"eof":               {connect.NewError(connect.CodeUnknown, io.ErrUnexpectedEOF), true},
		"deadline":          {connect.NewError(connect.CodeDeadlineExceeded, context.DeadlineExceeded), false},
		"answered an error": {connect.NewError(connect.CodeNotFound, errors.New("range not hosted")), false},
	} {
		if got := connectionLost(tc.err); got != tc.lost {
			t.Errorf("%s: connectionLost(%v) = %v, want %v", name, tc.err, got, tc.lost)
		}
	}
}
