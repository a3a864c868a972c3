package wire

import (
	"errors"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// BelowLogStart returns the log start a replica named in err's
// LogStartDetail (an OutOfRange answered to a Read or Tail below the range's
// log start: the records there were deleted by retention), and whether err
// carries one. A detail that does not decode is none: it is a peer's claim.
func BelowLogStart(err error) (logStart uint64, ok bool) {
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeOutOfRange {
		return 0, false
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if ls, isLS := v.(*tenurev1.LogStartDetail); isLS {
				return ls.GetLogStart(), true
			}
		}
	}
	return 0, false
}

// HistoryKnownFrom is HistoryKnown for a log that starts at logStart: a log
// reset to a leader's log start holds no record (logStart == logEnd) and has
// an empty journal, and is known like a log that never held anything (every
// offset below its start is committed, and it has nothing to reconcile).
func HistoryKnownFrom(h []*tenurev1.EpochStart, logStart, logEnd uint64) bool {
	return HistoryKnown(h, logEnd) || (logStart > 0 && logStart == logEnd)
}
