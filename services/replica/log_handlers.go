package replica

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// tailWait bounds one wait of a Tail stream for the HWM to move, so a
// stream rechecks leadership and lease at least this often.
const tailWait = time.Second

// tailConfirmEvery is how often a Tail stream confirms its leadership with a
// quorum (readindex.go), sending or idle: a leader deposed without being
// fenced (cut off from the promoter and its followers, not from the
// consumer) would otherwise keep the stream open with a frozen HWM while
// the new leader commits. So a consumer learns of a new leader within about
// tailConfirmEvery + confirmTimeout (2 s), lease or no lease.
const tailConfirmEvery = time.Second

// Append assigns offsets to a batch under the leader's epoch and answers
// once the HWM has passed it.
func (s *Replica) Append(ctx context.Context, req *connect.Request[tenurev1.AppendRequest]) (*connect.Response[tenurev1.AppendResponse], error) {
	return respond(s.append(ctx, req.Msg))
}

func (s *Replica) append(ctx context.Context, m *tenurev1.AppendRequest) (*tenurev1.AppendResponse, error) {
	if err := wire.ValidateRangeID(m.GetRangeId()); err != nil {
		return nil, err
	}
	if err := wire.ValidateBatch(m.GetRecords()); err != nil {
		return nil, err
	}
	prod, err := producerOf(m)
	if err != nil {
		return nil, err
	}
	h, err := s.lookup(m.GetRangeId())
	if err != nil {
		return nil, err
	}
	began := time.Now()
	l, base, dup, err := h.appendLocal(m.GetRecords(), prod)
	if err != nil {
		return nil, err
	}
	// A retry's original may still be on its way to a quorum (written by
	// this leader a moment ago, or by an earlier one): it is acknowledged
	// the same way, once the HWM passes it.
	hwm, err := l.waitCommitted(ctx, base, base+uint64(len(m.GetRecords())))
	if err != nil {
		return nil, err
	}
	s.metrics.appendCommit.Observe(time.Since(began).Seconds())
	epoch := l.epoch
	if dup {
		// The ack names the epoch that wrote the records, as the first
		// acknowledgement did (or would have): an earlier leader's, perhaps.
		if epoch, err = h.r.EpochAt(base); err != nil {
			return nil, fmt.Errorf("range %q: epoch of the record at %d: %w", h.id, base, err)
		}
	}
	return &tenurev1.AppendResponse{BaseOffset: base, Epoch: epoch, HighWaterMark: hwm, Duplicate: dup}, nil
}

// producerOf returns an idempotent append's producer fields, nil for a
// non-idempotent one (no producer id), or InvalidArgument.
func producerOf(m *tenurev1.AppendRequest) (*logstore.ProducerAppend, error) {
	id := m.GetProducerId()
	if len(id) == 0 {
		if m.GetProducerEpoch() != 0 || m.GetFirstSequence() != 0 {
			return nil, invalidf("producer epoch or first sequence without a producer id")
		}
		return nil, nil
	}
	pa := &logstore.ProducerAppend{Epoch: m.GetProducerEpoch(), FirstSeq: m.GetFirstSequence()}
	if len(id) != len(pa.ID) {
		return nil, invalidf("producer id of %d bytes, want %d", len(id), len(pa.ID))
	}
	copy(pa.ID[:], id)
	if pa.ID == (logstore.ProducerID{}) {
		return nil, invalidf("the all-zero producer id is reserved")
	}
	return pa, nil
}

// appendLocal writes a batch to the leader's log under its epoch. The
// leadership check and the write happen under one shared hold of h.mu, so a
// fence cannot land between them: nothing is written under an epoch after a
// fence above it has been recorded. The store returns once the batch is
// readable; followers fetch it while the group commit fsyncs it here. With
// a producer, the store's dedupe state decides first: dup says the batch was
// written before, at base, and nothing was written now.
func (h *hosted) appendLocal(values [][]byte, prod *logstore.ProducerAppend) (_ *leader, base uint64, dup bool, _ error) {
	h.mu.RLock()
	l := h.acting()
	if l == nil {
		defer h.mu.RUnlock()
		return nil, 0, false, h.notLeaderErr()
	}
	if !h.leaseValid(l.epoch) {
		defer h.mu.RUnlock()
		return nil, 0, false, preconditionf("range %q: leader %s has no valid lease at epoch %d; not accepting appends", h.id, h.s.cfg.ID, l.epoch)
	}
	var err error
	if prod == nil {
		base, err = h.r.Append(l.epoch, false, values)
	} else {
		base, dup, err = h.r.AppendProduced(l.epoch, *prod, values)
	}
	h.mu.RUnlock()
	if errors.Is(err, logstore.ErrDiskFull) {
		// Refused before any offset was assigned: nothing was written,
		// so the range keeps leading (unlike a failed write, below).
		return nil, 0, false, diskFullf("replica %s: range %q: disk full, append of %d records refused: %v", h.s.cfg.ID, h.id, len(values), err)
	}
	if refusedByDedupe(err) {
		// The dedupe state refused the batch before anything was written.
		return nil, 0, false, fmt.Errorf("range %q: %w", h.id, err)
	}
	if err != nil {
		// The log's state after a failed write is unknown: stop leading.
		err = fmt.Errorf("range %q: append %d records at epoch %d: %w", h.id, len(values), l.epoch, err)
		h.halt(err)
		if failedForSpace(err) {
			// The store refused the batch before assigning it offsets
			// (it had already failed): nothing of it was written.
			return nil, 0, false, h.haltedErrShared()
		}
		return nil, 0, false, err
	}
	return l, base, dup, nil
}

// refusedByDedupe says whether err is the store's dedupe state refusing an
// append, which writes nothing: not a reason to stop leading.
func refusedByDedupe(err error) bool {
	return errors.Is(err, logstore.ErrSequence) || errors.Is(err, logstore.ErrProducerFenced) ||
		errors.Is(err, logstore.ErrProducerWindow) || errors.Is(err, logstore.ErrBusy)
}

// readableLeader returns the leadership if this range may serve reads: it
// leads, holds its lease, and has committed its own epoch-start record.
// h.mu is taken shared.
func (h *hosted) readableLeader() (*leader, error) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	l := h.acting()
	if l == nil {
		return nil, h.notLeaderErr()
	}
	if !h.leaseValid(l.epoch) {
		return nil, preconditionf("range %q: leader %s has no valid lease at epoch %d; not serving reads", h.id, h.s.cfg.ID, l.epoch)
	}
	// A new leader starts from the promotion's committed bound, the largest
	// HWM its fenced peers reported, which can be below what the previous
	// leader had already acknowledged (its own HWM died with it). Reads
	// answered from that HWM would go back in time: the chaos suite's
	// linearizability check caught one (kill, seed 3). Every acknowledged
	// record is in this leader's log below its epoch-start record, so once
	// that record is committed (HWM past it) the HWM covers them all
	// (Raft section 8: a leader serves reads only after committing an entry
	// of its own term).
	// Unavailable, not FailedPrecondition: this replica does lead, and
	// serves reads once a quorum holds that record, a moment after its
	// promotion; a client that followed a not-leader answer here retries.
	if hwm := h.r.HWM(); hwm <= l.epochStart {
		return nil, coded(connect.CodeUnavailable, "range %q: leader %s at epoch %d has not yet committed its epoch-start record (offset %d, HWM %d); not serving reads yet, retry shortly", h.id, h.s.cfg.ID, l.epoch, l.epochStart, hwm)
	}
	return l, nil
}

// readBounds resolves a request's bounds: 0 means the maximum, and larger
// values are capped at it.
func readBounds(maxRecords, maxBytes uint32) (int, int) {
	n, b := int(maxRecords), int(maxBytes)
	if n == 0 || n > wire.MaxReadRecords {
		n = wire.MaxReadRecords
	}
	if b == 0 || b > wire.MaxBatchBytes {
		b = wire.MaxBatchBytes
	}
	return n, b
}

// Read returns committed records from an offset. Reading at exactly the
// HWM is the caught-up position and answers no records; an offset beyond
// the HWM (or below the log start) is OutOfRange: it names a record that is
// not committed, which a client can only have learned of by mistake.
func (s *Replica) Read(ctx context.Context, req *connect.Request[tenurev1.ReadRequest]) (*connect.Response[tenurev1.ReadResponse], error) {
	return respond(s.read(ctx, req.Msg))
}

func (s *Replica) read(ctx context.Context, m *tenurev1.ReadRequest) (*tenurev1.ReadResponse, error) {
	h, err := s.lookup(m.GetRangeId())
	if err != nil {
		return nil, err
	}
	l, err := h.readableLeader()
	if err != nil {
		return nil, err
	}
	// Records below the HWM never change (nothing truncates below it), so
	// the read itself needs no lock.
	hwm, start := h.r.HWM(), h.r.LogStart()
	off := m.GetOffset()
	if err := checkReadOffset(h.id, off, start, hwm); err != nil {
		return nil, err
	}
	// The HWM above is answered only if no later epoch had committed
	// anything when it was read: a quorum confirms this leadership after
	// that instant (readindex.go), and this replica still leads at the
	// same epoch afterwards (its own fence did not move meanwhile).
	if err := l.confirm(ctx); err != nil {
		return nil, err
	}
	if again, err := h.readableLeader(); err != nil || again != l {
		if err == nil {
			err = l.endedErr()
		}
		return nil, err
	}
	maxRecords, maxBytes := readBounds(m.GetMaxRecords(), m.GetMaxBytes())
	recs, err := h.readCommitted(off, hwm, maxRecords, maxBytes)
	if err != nil {
		return nil, err
	}
	return &tenurev1.ReadResponse{Records: recs, HighWaterMark: hwm, LogStart: start}, nil
}

// checkReadOffset refuses offsets a read cannot start at.
func checkReadOffset(rangeID string, off, start, hwm uint64) error {
	// Below the log start the records were committed and then deleted on
	// purpose: say so and where the log starts now, which is where a
	// reader that wants what is left begins.
	if off < start {
		return belowLogStartf(start, "range %q: offset %d is below the log start %d: records below it were deleted by retention", rangeID, off, start)
	}
	if off > hwm {
		return outOfRangef("range %q: offset %d is beyond the high-water mark %d (only committed records are read)", rangeID, off, hwm)
	}
	return nil
}

// readCommitted reads records in [off, hwm), bounded.
func (h *hosted) readCommitted(off, hwm uint64, maxRecords, maxBytes int) ([]*tenurev1.Record, error) {
	n := min(uint64(maxRecords), hwm-off)
	if n == 0 {
		return nil, nil
	}
	recs, err := h.r.Read(off, int(n), maxBytes)
	if errors.Is(err, logstore.ErrBelowLogStart) {
		// Retention moved the log start past off after the caller checked
		// it (a slow tail, or a read racing a retention pass).
		if start := h.r.LogStart(); off < start {
			return nil, checkReadOffset(h.id, off, start, hwm)
		}
	}
	if err != nil {
		err = fmt.Errorf("range %q: read %d records from %d: %w", h.id, n, off, err)
		if errors.Is(err, logstore.ErrCorrupt) {
			// A committed record of this copy is damaged: no reader can get
			// past it here, while the other replicas hold it intact. Stop
			// leading (quarantined: haltLocked), so the range moves to them.
			h.halt(err)
		}
		return nil, err
	}
	return recs, nil
}

// Tail streams committed records from an offset as the HWM passes them. It
// ends when the client goes away, with DeadlineExceeded when the client's
// deadline passes, with FailedPrecondition when this replica stops leading
// or loses its lease or a quorum's answers show a later epoch (naming its
// leader), and with Unavailable when it cannot confirm its leadership with
// a quorum (every tailConfirmEvery).
func (s *Replica) Tail(ctx context.Context, req *connect.Request[tenurev1.TailRequest], stream *connect.ServerStream[tenurev1.TailResponse]) error {
	return toConnect(s.tail(ctx, req.Msg, stream))
}

func (s *Replica) tail(ctx context.Context, m *tenurev1.TailRequest, stream *connect.ServerStream[tenurev1.TailResponse]) error {
	h, err := s.lookup(m.GetRangeId())
	if err != nil {
		return err
	}
	l, err := h.readableLeader()
	if err != nil {
		return err
	}
	next := m.GetOffset()
	if err := checkReadOffset(h.id, next, h.r.LogStart(), h.r.HWM()); err != nil {
		return err
	}
	wait := time.NewTimer(tailWait)
	defer wait.Stop()
	confirmed := time.Now()
	for {
		changed := h.r.Changed()
		// Recheck every round: a tail served by a deposed leader would
		// keep streaming a log that is no longer the range's.
		if l, err = h.readableLeader(); err != nil {
			return err
		}
		// Its own state cannot tell a leader that it was deposed
		// without a fence: ask a quorum, as a read does.
		if time.Since(confirmed) >= tailConfirmEvery {
			if err := l.confirm(ctx); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return err
			}
			confirmed = time.Now()
		}
		if hwm := h.r.HWM(); hwm > next {
			recs, err := h.readCommitted(next, hwm, wire.MaxReadRecords, wire.MaxBatchBytes)
			if err != nil {
				return err
			}
			if len(recs) == 0 {
				return fmt.Errorf("range %q: store read nothing at %d below the HWM %d", h.id, next, hwm)
			}
			if err := stream.Send(&tenurev1.TailResponse{Records: recs, HighWaterMark: hwm}); err != nil {
				return err
			}
			next += uint64(len(recs))
			continue
		}
		wait.Reset(tailWait)
		select {
		case <-changed:
		case <-wait.C:
		case <-l.ctx.Done():
		case <-ctx.Done():
			// The caller's deadline (Connect-Timeout-Ms, grpc-timeout) or
			// its going away: say which. A nil here ended the stream as if
			// the tail were complete, which a client without a deadline
			// of its own (curl) could not tell from a clean end.
			return ctx.Err()
		}
	}
}
