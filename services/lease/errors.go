package lease

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// This file is the one place where lease errors become Connect codes. Each
// code has one meaning (docs/design.md, "Errors and bad input"):
//
//	InvalidArgument     a malformed request (wire.ErrInvalid and invalidf)
//	NotFound            an unknown range or session
//	AlreadyExists       CreateRange of an existing range
//	Aborted             a lost compare-and-swap; the message and a RangeEpoch
//	                    detail carry the current epoch, so the caller can retry
//	FailedPrecondition  acting under an epoch that is not current, or with a
//	                    session that is gone; detail RangeEpoch where an epoch is involved
//	OutOfRange          a watch resuming from a compacted revision
//	Unavailable         etcd unreachable, leaderless or too slow, or the service closing
//	Internal            a stored value this service did not write
//
// Handlers build errors with the constructors below, or return store errors
// as they come; toConnect maps the latter.

var (
	// errCorrupt is wrapped by every decode failure of a stored value.
	errCorrupt = errors.New("lease: corrupt stored value")

	// errStoreTimeout is the cause of a handler's context when the handler's
	// own bound on etcd ran out (as opposed to the caller's deadline).
	errStoreTimeout = errors.New("etcd did not answer in time")
)

func errCorruptf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errCorrupt}, args...)...)
}

func invalidf(format string, args ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("lease: "+format, args...))
}

func notFoundf(format string, args ...any) error {
	return connect.NewError(connect.CodeNotFound, fmt.Errorf("lease: "+format, args...))
}

func alreadyExistsf(format string, args ...any) error {
	return connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("lease: "+format, args...))
}

func failedf(format string, args ...any) error {
	return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("lease: "+format, args...))
}

func abortedf(format string, args ...any) error {
	return connect.NewError(connect.CodeAborted, fmt.Errorf("lease: "+format, args...))
}

func outOfRangef(format string, args ...any) error {
	return connect.NewError(connect.CodeOutOfRange, fmt.Errorf("lease: "+format, args...))
}

func unavailablef(format string, args ...any) error {
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("lease: "+format, args...))
}

func rangeNotFound(rangeID string) error {
	return notFoundf("range %q not found (CreateRange registers it)", rangeID)
}

// withDetail attaches msg to a Connect error, so clients read structured
// facts (the current epoch) instead of parsing messages.
func withDetail(err error, msg proto.Message) error {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return err
	}
	if d, derr := connect.NewErrorDetail(msg); derr == nil {
		ce.AddDetail(d)
	}
	return ce
}

// lostGrant is the answer to a GrantEpoch whose previous epoch is not the
// stored one: somebody else was granted first (or the caller's view is old).
func lostGrant(rangeID string, previous, current uint64) error {
	return withDetail(
		abortedf("range %q: grant lost: the current epoch is %d, not previous_epoch %d; re-read and retry with previous_epoch %d",
			rangeID, current, previous, current),
		&tenurev1.RangeEpoch{RangeId: rangeID, Epoch: current})
}

// notCurrent is the answer to acting under an epoch that is not the range's
// current one.
func notCurrent(rangeID string, epoch, current uint64) error {
	return withDetail(
		failedf("range %q: epoch %d is not current; the current epoch is %d", rangeID, epoch, current),
		&tenurev1.RangeEpoch{RangeId: rangeID, Epoch: current})
}

// CurrentEpoch reads the current epoch a lease service error carries (the
// RangeEpoch detail of Aborted and FailedPrecondition answers), so a caller
// that lost a grant can retry with previous_epoch set to it.
func CurrentEpoch(err error) (uint64, bool) {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return 0, false
	}
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if re, ok := v.(*tenurev1.RangeEpoch); derr == nil && ok {
			return re.GetEpoch(), true
		}
	}
	return 0, false
}

// toConnect maps any error a handler produced. ctx is the handler's bounded
// context: its cause tells the service's own etcd timeout from the caller
// giving up.
func toConnect(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	switch {
	case errors.As(err, &ce):
		return ce
	case errors.Is(err, wire.ErrInvalid):
		return connect.NewError(connect.CodeInvalidArgument, err)
	case errors.Is(err, errCorrupt):
		return connect.NewError(connect.CodeInternal, err)
	}
	if ctx.Err() != nil {
		cause := context.Cause(ctx)
		switch {
		case errors.Is(cause, errStoreTimeout):
			return unavailablef("%v: %v", cause, err)
		case errors.Is(cause, context.DeadlineExceeded):
			return connect.NewError(connect.CodeDeadlineExceeded, err)
		default:
			return connect.NewError(connect.CodeCanceled, err)
		}
	}
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return notFoundf("session not found: it expired or was closed (%v)", err)
	case errors.Is(err, rpctypes.ErrCompacted):
		return outOfRangef("%v", err)
	}
	switch etcdCode(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return unavailablef("etcd: %v", err)
	case codes.ResourceExhausted:
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("lease: etcd: %w", err))
	}
	return connect.NewError(connect.CodeInternal, fmt.Errorf("lease: etcd: %w", err))
}

// etcdCode is the gRPC code of an etcd client error: the client turns known
// server errors into rpctypes.EtcdError and leaves transport errors as gRPC
// statuses.
func etcdCode(err error) codes.Code {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code()
	}
	return status.Code(err)
}

// isLeaseNotFound reports an etcd "requested lease not found".
func isLeaseNotFound(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound) || etcdCode(err) == codes.NotFound
}
