package wire

import (
	"errors"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// NotLeader returns the NotLeaderDetail a replica attached to err (a
// FailedPrecondition: it does not lead the range), or nil when err carries
// none. A detail that does not decode is none: it is a peer's claim.
func NotLeader(err error) *tenurev1.NotLeaderDetail {
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeFailedPrecondition {
		return nil
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if nl, ok := v.(*tenurev1.NotLeaderDetail); ok {
				return nl
			}
		}
	}
	return nil
}
