package replica

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// This file is the one place where the replica's errors meet Connect codes.
// Handlers build errors with the constructors below (or return wire and
// logstore errors as they come) and every handler's error goes out through
// toConnect, so one meaning keeps one code:
//
//	NotFound           the range is not hosted here (no Fence named it yet)
//	InvalidArgument    a malformed request (wire.ErrInvalid)
//	FailedPrecondition not leader / fenced / stale epoch / would discard
//	                   committed records (the message names the current
//	                   epoch, leader or offsets; a not-leader answer also
//	                   carries a NotLeaderDetail)
//	                   or refuses an idempotent producer's append (a
//	                   sequence gap naming the expected one, a fenced
//	                   producer epoch), or the range is quarantined (its
//	                   stored data failed its checks at startup:
//	                   logstore.ErrQuarantined)
//	OutOfRange         an offset the log does not hold (a read past the
//	                   HWM, or below the log start: that one carries a
//	                   LogStartDetail), or a producer sequence older than
//	                   the range's dedupe window
//	DataLoss           the range stopped after a safety violation
//	Unavailable        the replica is closing, or reopening its store
//	                   after a want of space (reopen.go), or a leader
//	                   could not confirm with a quorum that it still
//	                   leads (a read), or a new leader has not yet
//	                   committed its epoch-start record (a read or tail
//	                   just after its promotion)
//	DeadlineExceeded   an append that did not commit within its bound
//	ResourceExhausted  the replica's disk is full (below its reserve, or a
//	                   write failed for want of space: logstore.ErrDiskFull;
//	                   or its store failed for want of space and reopens
//	                   by itself: reopen.go); appends resume by themselves
//	                   once space is back

// statusError is an error with the Connect code it maps to, and the
// Connect error detail it carries, if any.
type statusError struct {
	code   connect.Code
	msg    string
	detail proto.Message
}

func (e *statusError) Error() string { return "replica: " + e.msg }

func coded(code connect.Code, format string, args ...any) error {
	return &statusError{code: code, msg: fmt.Sprintf(format, args...)}
}

// notFoundf: the range is not hosted here.
func notFoundf(format string, args ...any) error {
	return coded(connect.CodeNotFound, format, args...)
}

// invalidf: the request is malformed. Wraps wire.ErrInvalid so a caller can
// test for it the same way it tests wire's own validation errors.
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{wire.ErrInvalid}, args...)...)
}

// preconditionf: the request is well-formed but the range's state refuses
// it: a stale or future epoch, not the leader, fenced, below the HWM.
func preconditionf(format string, args ...any) error {
	return coded(connect.CodeFailedPrecondition, format, args...)
}

// notLeaderf: this replica does not lead the range; d says who does, as
// far as it knows. The message names the leader for people; the detail is
// what clients read (pkg/appender follows it).
func notLeaderf(d *tenurev1.NotLeaderDetail, format string, args ...any) error {
	return &statusError{code: connect.CodeFailedPrecondition, msg: fmt.Sprintf(format, args...), detail: d}
}

// outOfRangef: an offset outside what the log can serve.
func outOfRangef(format string, args ...any) error {
	return coded(connect.CodeOutOfRange, format, args...)
}

// belowLogStartf: a read below the range's log start. The records there
// were committed and deleted by retention; the LogStartDetail tells a reader
// where the log now starts, so it can start there (tenurectl consume does).
func belowLogStartf(start uint64, format string, args ...any) error {
	return &statusError{code: connect.CodeOutOfRange, msg: fmt.Sprintf(format, args...), detail: &tenurev1.LogStartDetail{LogStart: start}}
}

// deadlinef: the request did not complete within the replica's own bound.
func deadlinef(format string, args ...any) error {
	return coded(connect.CodeDeadlineExceeded, format, args...)
}

// diskFullf: this replica's store refused an append because its disk is
// full. Nothing of it was written: the client may retry, here or at a new
// leader, and the range goes on serving reads and fences meanwhile.
func diskFullf(format string, args ...any) error {
	return coded(connect.CodeResourceExhausted, format, args...)
}

// errSafety marks a safety violation: the range stops serving (see halt).
var errSafety = errors.New("safety violation")

// safetyf builds a safety violation. It maps to DataLoss: a committed record
// and what a peer claims about it disagree, which only a bug or a damaged disk
// can cause, and no automatic step may paper over it.
func safetyf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errSafety}, args...)...)
}

// errClosed: the replica is shutting down.
var errClosed = coded(connect.CodeUnavailable, "replica is closing")

// toConnect maps any error a handler returns to a *connect.Error. Errors that
// are already Connect errors (from a peer, or built here) keep their code.
// The message a client reads has no "logstore: " in it (forClient).
func toConnect(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	err = forClient(err)
	var se *statusError
	switch {
	case errors.As(err, &se):
		ce := connect.NewError(se.code, err)
		if se.detail != nil {
			if d, derr := connect.NewErrorDetail(se.detail); derr == nil {
				ce.AddDetail(d)
			}
		}
		return ce
	case errors.Is(err, wire.ErrInvalid):
		return connect.NewError(connect.CodeInvalidArgument, err)
	case errors.Is(err, logstore.ErrQuarantined):
		// The range's stored data failed its checks at startup: it takes
		// no command until rebuilt. Not DataLoss: nothing committed is
		// lost while its peers hold it, and the rebuild restores it here.
		return connect.NewError(connect.CodeFailedPrecondition, err)
	case errors.Is(err, errSafety):
		return connect.NewError(connect.CodeDataLoss, err)
	case errors.Is(err, logstore.ErrBelowHWM):
		// The store's own guard: a truncation that would remove committed
		// records. The handler checks first; this is the backstop.
		return connect.NewError(connect.CodeFailedPrecondition, err)
	case errors.Is(err, logstore.ErrSequence), errors.Is(err, logstore.ErrProducerFenced):
		return connect.NewError(connect.CodeFailedPrecondition, err)
	case errors.Is(err, logstore.ErrProducerWindow):
		return connect.NewError(connect.CodeOutOfRange, err)
	case errors.Is(err, logstore.ErrDiskFull):
		// Nothing of the refused append was written; it may be retried
		// once space is back (see diskFullf).
		return connect.NewError(connect.CodeResourceExhausted, err)
	case errors.Is(err, logstore.ErrClosed):
		// A handler that looked the range up before its store was closed
		// for a reopen (reopen.go): the range is back in a moment.
		return connect.NewError(connect.CodeUnavailable, err)
	case errors.Is(err, logstore.ErrBusy):
		// The dedupe state is being rebuilt or was just cut: retry.
		return connect.NewError(connect.CodeUnavailable, err)
	case errors.Is(err, context.Canceled):
		return connect.NewError(connect.CodeCanceled, err)
	case errors.Is(err, context.DeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	}
	return connect.NewError(connect.CodeInternal, err)
}

// storePrefix begins the text of every logstore error.
const storePrefix = "logstore: "

// clientError is an error as a client reads it (Error), wrapping the
// error the handler returned (Unwrap), so errors.Is still maps it.
type clientError struct {
	msg string
	err error
}

func (e *clientError) Error() string { return e.msg }
func (e *clientError) Unwrap() error { return e.err }

// forClient drops the store's package name from err's text: the store's
// errors reach clients (a producer's sequence gap, a full disk, a
// quarantined range), and a JSON caller read
//
//	range "demo": logstore: producer sequence out of order: producer ... expected sequence 1, got 5 (a gap)
//
// where "logstore" is the name of a Go package behind the API, which
// tells it nothing.
func forClient(err error) error {
	msg := err.Error()
	if !strings.Contains(msg, storePrefix) {
		return err
	}
	return &clientError{msg: strings.ReplaceAll(msg, storePrefix, ""), err: err}
}
