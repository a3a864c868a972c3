package workload

import (
	"errors"
	"fmt"
	"testing"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/internal/chaos/check"
	"github.com/tenurelog/tenure/pkg/transport"
)

// Only errors that prove nothing was written count as Failed: the checker
// holds every Failed append to never appearing in the log (failed-applied),
// so a wrong Failed raises an alarm that is the classifier's fault, and a
// wrong Unknown quietly weakens the check.
func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want check.Outcome
	}{
		{nil, check.OK},
		{fmt.Errorf("r1: %w", ErrNotSent), check.Failed},
		{connect.NewError(connect.CodeUnavailable, errors.New("dial tcp 127.0.0.1:1: connect: connection refused")), check.Failed},
		{fmt.Errorf("r1: %w", transport.NotHandledError(connect.CodeUnavailable, errors.New("replica is stopping; open a new stream"))), check.Failed},
		// The same words without the marker: the stream may have handled it.
		{connect.NewError(connect.CodeUnavailable, errors.New("replica is stopping; open a new stream")), check.Unknown},
		{connect.NewError(connect.CodeFailedPrecondition, errors.New(`replica: range "c" on r2 is not the leader`)), check.Failed},
		{connect.NewError(connect.CodeFailedPrecondition, errors.New("replica: fenced at epoch 3; leader unknown")), check.Unknown},
		{connect.NewError(connect.CodeDeadlineExceeded, errors.New("append did not commit")), check.Unknown},
	} {
		if got := Classify(tc.err); got != tc.want {
			t.Errorf("Classify(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
