package replica

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// DropRange implements ReplicaService.DropRange.
func (s *Replica) DropRange(ctx context.Context, req *connect.Request[tenurev1.DropRangeRequest]) (*connect.Response[tenurev1.DropRangeResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("replica: DropRange is not built yet"))
}
