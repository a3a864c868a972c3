package replica

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

const (
	// fetchBackoffMin and fetchBackoffMax bound the wait between failed
	// fetches: short enough that a follower adopted before its leader
	// starts fetching promptly, long enough not to spin on a dead leader.
	fetchBackoffMin = 10 * time.Millisecond
	fetchBackoffMax = 500 * time.Millisecond
	// fetchSlack is how much longer than the long poll a fetch may take
	// before the follower gives up on it (network and a full batch read).
	fetchSlack = 5 * time.Second
	// diskFullBackoffMin and diskFullBackoffMax bound the wait between
	// fetches while this replica's disk is full (logstore.ErrDiskFull):
	// each fetch then takes a batch it cannot store, so it is not repeated
	// at fetch speed, yet a disk that has room again is noticed within
	// about 2 s.
	diskFullBackoffMin = 200 * time.Millisecond
	diskFullBackoffMax = 2 * time.Second
)

// errStaleAnswer: the log moved under a fetch (a Truncate command while the
// fetch was in flight); the answer is for a position this follower no longer
// holds, so it is dropped and the next fetch starts from the new log end.
var errStaleAnswer = errors.New("log moved during the fetch")

// storeError marks a failure of this replica's own store while following:
// unlike a leader's refusal or a network error it will not go away by
// fetching again, so the range stops.
type storeError struct{ err error }

func (e *storeError) Error() string { return e.err.Error() }
func (e *storeError) Unwrap() error { return e.err }

// follower is one fetch loop: this range following one leader at one epoch.
type follower struct {
	h             *hosted
	epoch         uint64
	leaderID      string
	leaderAddress string
	client        tenurev1connect.ReplicaServiceClient
	// sess is the fetch session to the leader replica, shared with every
	// range this replica follows there.
	sess *fetchSession

	// ctx is cancelled, with the reason, when following ends (a fence, a
	// halt, Close).
	ctx    context.Context
	cancel context.CancelCauseFunc

	// Only the loop's own goroutine touches these. stream is the open
	// FetchStream (nil: open one on the next fetch); unary is set once the
	// leader answered Unimplemented to FetchStream (an older replica).
	stream       *connect.BidiStreamForClient[tenurev1.FetchStreamRequest, tenurev1.FetchStreamResponse]
	streamCancel context.CancelFunc
	unary        bool

	// startWant is the highest log start the leader answered; advancing is
	// set while a goroutine of its own raises this replica's log start
	// toward it (advanceLogStart). AdvanceLogStart syncs Badger and the
	// journal and deletes keys, several milliseconds on a busy disk: run
	// inline, every retention pass on the leader stalled the fetch loop,
	// and with it the commit of appends this follower acknowledges (the
	// retention soak, bench/soak_test.go, lost a quarter of its throughput
	// to it with a pass every 20 ms).
	startWant atomic.Uint64
	advancing atomic.Bool
}

// startFollowerLocked starts the fetch loop for the leader in h.st.
// h.mu is held exclusively.
func (h *hosted) startFollowerLocked() {
	ctx, cancel := context.WithCancelCause(h.gen.ctx)
	f := &follower{
		h:             h,
		epoch:         h.st.Epoch,
		leaderID:      h.st.LeaderID,
		leaderAddress: h.st.LeaderAddress,
		client:        tenurev1connect.NewReplicaServiceClient(h.s.httpClient(), h.st.LeaderAddress, transport.ClientOptions(transport.ForReplica(h.st.LeaderID))...),
		sess:          h.s.session(h.st.LeaderID, h.st.LeaderAddress),
		ctx:           ctx,
		cancel:        cancel,
	}
	h.follow = f
	h.goLoop(f.run)
}

// run fetches until following ends. Errors from the leader or the network
// back off (bounded, with jitter) and retry; a safety violation or a failure
// of the local store stops the range.
func (f *follower) run() {
	defer f.closeStream()
	f.sess.following.Add(1)
	defer f.sess.following.Add(-1)
	log := f.h.log.With("epoch", f.epoch, "leader", f.leaderID)
	var bo backoff
	diskFull := backoff{min: diskFullBackoffMin, max: diskFullBackoffMax}
	fails := failureLog{every: fetchFailureLogEvery}
	for f.ctx.Err() == nil {
		// A leader address refusing connections is probed by one of this
		// replica's fetch loops at a time (see refusals).
		if d := f.h.s.refused.hold(f.leaderAddress, time.Now()); d > 0 {
			if !sleepCtx(f.ctx, d) {
				return
			}
			continue
		}
		err := f.step()
		if f.ctx.Err() != nil {
			return
		}
		f.h.s.refused.observe(f.leaderAddress, err, time.Now())
		var se *storeError
		switch {
		case err == nil:
			bo.reset()
			diskFull.reset()
			if d := fails.succeeded(time.Now()); d > 0 {
				log.Info("fetching again", "after", d.Round(time.Millisecond))
			}
			continue
		case errors.Is(err, errSafety), errors.As(err, &se):
			f.h.halt(err)
			return
		case errors.Is(err, errStaleAnswer):
			continue
		case errors.Is(err, logstore.ErrDiskFull):
			// Not a failure of the store, nor of the leader: this disk is
			// below its reserve (the store logged it once). Fetch again
			// later, not at fetch speed: the lag shows in status and
			// metrics meanwhile.
			if !sleepCtx(f.ctx, diskFull.next()) {
				return
			}
			continue
		}
		// Not every retry is logged: a follower adopted before its leader
		// retries until the leader serves, and a flaky link fails one
		// fetch in a few, each with its own offset in the message.
		if ok, n := fails.failed(time.Now()); ok {
			log.Info("fetch failed; retrying with backoff", "err", err, "unlogged_failures", n)
		}
		if !sleepCtx(f.ctx, bo.next()) {
			return
		}
	}
}

// step is one fetch round trip: fetch from the durable log end, check and
// apply the answer, then raise the HWM over what is durable.
func (f *follower) step() error {
	r := f.h.r
	end := r.LogEnd()
	// The leader counts fetch_offset toward the commit, so report only a
	// log end that is durable here.
	if err := r.WaitDurable(f.ctx, end); err != nil {
		return &storeError{fmt.Errorf("wait durable to %d: %w", end, err)}
	}
	lastEpoch, err := f.position(end)
	if err != nil {
		return err
	}
	wait := f.h.s.cfg.FetchWait
	a, pre, err := f.fetch(&tenurev1.FetchRequest{
		RangeId:          f.h.id,
		Epoch:            f.epoch,
		ReplicaId:        f.h.s.cfg.ID,
		Incarnation:      f.h.s.incarnation,
		FetchOffset:      end,
		LastFetchedEpoch: lastEpoch,
		MaxBytes:         wire.MaxBatchBytes,
		MaxWaitMs:        uint32(wait / time.Millisecond),
	}, wait+fetchSlack)
	if err != nil {
		return fmt.Errorf("fetch from %s at %s (offset %d, epoch %d): %w", f.leaderID, f.leaderAddress, end, f.epoch, err)
	}
	var newEnd uint64
	if pre != nil {
		// The session checked and wrote it with other ranges' answers.
		newEnd, err = pre.end, pre.err
	} else {
		if err := validateFetchAnswer(f.epoch, end, lastEpoch, a); err != nil {
			return fmt.Errorf("answer from leader %s: %w", f.leaderID, err)
		}
		newEnd, err = f.apply(end, a)
	}
	// A full disk refused the records (apply wrote nothing): the HWM and
	// the log start still follow the leader below, since retention is what
	// frees this replica's space, and then the loop backs off (run).
	var full error
	if errors.Is(err, logstore.ErrDiskFull) {
		full, err = err, nil
	}
	if err != nil || a.GetDiverging() != nil {
		return err
	}
	// The HWM covers only what is durable here: a crash must not leave an
	// HWM above records that did not survive it.
	if err := r.WaitDurable(f.ctx, newEnd); err != nil {
		return &storeError{fmt.Errorf("wait durable to %d: %w", newEnd, err)}
	}
	if err := f.raiseHWM(min(a.GetHighWaterMark(), newEnd)); err != nil {
		return err
	}
	f.followLogStart(a.GetLogStart())
	return full
}

// followLogStart has this replica's log start follow the leader's, capped
// at its own HWM: a follower never applies retention on its own (its log
// start follows the leader's), and only records committed here are
// removed. A leader older than log starts sends 0, which moves nothing.
// The advance runs beside the fetch loop (advanceLogStart), which goes on
// fetching meanwhile.
func (f *follower) followLogStart(leaderStart uint64) {
	for {
		want := f.startWant.Load()
		if leaderStart <= want || f.startWant.CompareAndSwap(want, leaderStart) {
			break
		}
	}
	if f.logStartBehind() && f.advancing.CompareAndSwap(false, true) {
		// Counted in the store generation's loops, as the fetch loop is:
		// a reopen waits for it before closing the store.
		f.h.goLoop(f.advanceLogStart)
	}
}

// logStartBehind reports whether this replica's log start is below the
// leader's, as far as its own HWM allows it to follow.
func (f *follower) logStartBehind() bool {
	r := f.h.r
	// The store clamps to the HWM as well; the check here only saves a
	// call when nothing would move.
	return min(f.startWant.Load(), r.HWM()) > r.LogStart()
}

// advanceLogStart raises the log start until it has caught up with the
// leader's (as far as the HWM allows) or following ends, then clears
// f.advancing. One runs at a time per fetch loop. A store failure stops
// the range, as it did the fetch loop's own.
func (f *follower) advanceLogStart() {
	r := f.h.r
	for f.ctx.Err() == nil {
		if !f.logStartBehind() {
			f.advancing.Store(false)
			// A raise between the check and the store would otherwise be
			// left to the next answer: look once more, and go on only if
			// no other goroutine took over meanwhile.
			if !f.logStartBehind() || !f.advancing.CompareAndSwap(false, true) {
				return
			}
			continue
		}
		leaderStart := f.startWant.Load()
		// Only what is committed here: the HWM, not the leader's start,
		// when this replica has not yet learned the leader's HWM up there.
		to := min(leaderStart, r.HWM())
		start, err := r.AdvanceLogStart(to)
		if err == nil && start < to {
			// The store held it lower (its durable end): looping would
			// spin; the next answer tries again.
			break
		}
		if err != nil {
			if errors.Is(err, logstore.ErrDiskFull) {
				// The index could not write for want of space (the
				// advance indexes what waits first): a state, not a
				// failure, and deleting is what gives space back. The
				// next answer tries again.
				f.advancing.Store(false)
				return
			}
			if f.ctx.Err() == nil {
				f.h.halt(&storeError{fmt.Errorf("advance the log start to %d (leader's %d): %w", to, leaderStart, err)})
			}
			return // advancing stays set: this loop is over
		}
	}
	f.advancing.Store(false)
}

// fetch is one long poll, answered within timeout: a message on the loop's
// FetchStream, opened on first use and after any failure, or a unary Fetch
// to a leader without FetchStream.
func (f *follower) fetch(req *tenurev1.FetchRequest, timeout time.Duration) (*tenurev1.FetchResponse, *applied, error) {
	// The leader's fetch session, shared with every range this replica
	// follows there, unless the leader has none (an older replica): then
	// this loop's own FetchStream, or unary Fetch for the oldest. A range
	// followed alone on its leader keeps its own FetchStream: that is
	// already the one stream to the leader, with the same single message
	// per pull and per answer, and it saves the session's hand-off from
	// its receiving goroutine to this one: measured one in flight, 9%
	// fewer records/s and 15% more CPU per record through the session.
	if f.sess.following.Load() > 1 && f.sess.usable() {
		f.closeStream()
		r := f.sess.fetch(f.ctx, f, req)
		if !errors.Is(r.err, errNoSession) {
			return r.a, r.applied, r.err
		}
	}
	if f.unary {
		ctx, cancel := context.WithTimeout(f.ctx, timeout)
		defer cancel()
		f.h.s.metrics.fetchSent.Inc()
		resp, err := f.client.Fetch(ctx, connect.NewRequest(req))
		if err != nil {
			return nil, nil, err
		}
		f.h.s.metrics.fetchReceived.Inc()
		return resp.Msg, nil, nil
	}
	if f.stream == nil {
		ctx, cancel := context.WithCancel(f.ctx)
		f.stream, f.streamCancel = f.client.FetchStream(ctx), cancel
	}
	// The timeout ends the whole stream: a long poll not answered in time
	// leaves the stream in an unknown state, so the next fetch opens a new one.
	timer := time.AfterFunc(timeout, f.streamCancel)
	err := f.stream.Send(&tenurev1.FetchStreamRequest{Fetch: req})
	if err == nil {
		f.h.s.metrics.fetchSent.Inc()
	}
	var m *tenurev1.FetchStreamResponse
	if err == nil || errors.Is(err, io.EOF) {
		// A Send on a stream the leader ended fails with io.EOF; the
		// leader's reason (its error, or Unimplemented) is what Receive
		// returns.
		m, err = f.stream.Receive()
	}
	// A leader that crashed or was cut off ends the body mid-stream:
	// say so (Unavailable), not "internal: protocol error".
	err = transport.LostStream(err)
	if !timer.Stop() && err != nil {
		err = fmt.Errorf("no answer within %v: %w", timeout, err)
	}
	if err == nil {
		f.h.s.metrics.fetchReceived.Inc()
		if m.GetFetch() == nil {
			err = errors.New("fetch stream answer carries no fetch answer")
		}
	}
	if err != nil {
		f.closeStream()
		if connect.CodeOf(err) == connect.CodeUnimplemented {
			f.h.log.Info("leader has no FetchStream; fetching with unary calls", "epoch", f.epoch, "leader", f.leaderID)
			f.unary = true
			return f.fetch(req, timeout)
		}
		return nil, nil, err
	}
	return m.GetFetch(), nil, nil
}

// closeStream ends the loop's FetchStream, if one is open.
func (f *follower) closeStream() {
	if f.stream == nil {
		return
	}
	f.streamCancel()
	_ = f.stream.CloseRequest()
	_ = f.stream.CloseResponse()
	f.stream, f.streamCancel = nil, nil
}

// position reads the epoch of the record at end-1, the other half of the
// pair the leader checks, and confirms the log still ends at end: the pair
// must describe one log, or the leader could count an offset we no longer
// hold.
func (f *follower) position(end uint64) (lastEpoch uint64, err error) {
	h, r := f.h, f.h.r
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.follow != f {
		return 0, context.Cause(f.ctx)
	}
	if r.LogEnd() != end {
		return 0, errStaleAnswer
	}
	return r.LastEpoch(), nil
}

// apply writes the records of a checked answer, or truncates on a
// divergence. It holds h.mu shared and rechecks that this loop still follows
// at its epoch, so nothing is written after a fence has been recorded.
func (f *follower) apply(end uint64, a *tenurev1.FetchResponse) (newEnd uint64, err error) {
	h, r := f.h, f.h.r
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.follow != f {
		return 0, context.Cause(f.ctx)
	}
	if r.LogEnd() != end {
		return 0, errStaleAnswer
	}
	if d := a.GetDiverging(); d != nil {
		hwm := r.HWM()
		target, ok := followerTruncateTarget(d, r.History(), end, hwm)
		if !ok {
			return 0, safetyf("range %q: leader %s at epoch %d answers that our log diverges at %d (its epoch %d ends at %d), below our HWM %d: a committed record disagrees; not truncating, not fetching",
				h.id, f.leaderID, f.epoch, target, d.GetEpoch(), d.GetEndOffset(), hwm)
		}
		if target >= end {
			// Nothing of ours to cut, yet the leader disagrees with our
			// position. A correct leader never answers that to a
			// consistent follower: when its covering epoch is our last
			// record's epoch it diverges only if that epoch ends before
			// our log end (a cut below end), and when it is an older epoch
			// our history has a later epoch starting below end (a cut
			// there). So our history and our records disagree (or our
			// history is unknown and the leader denies a record at our
			// HWM), or the leader's history is wrong. Neither changes by
			// fetching again: this epoch's leader answers from a history
			// that is fixed below its own epoch, and our pair is read
			// from the same store. Retrying used to spin here forever,
			// with the range reported FOLLOWER and counted by nobody; it
			// stops instead, with the reason in its status, until a
			// restart (which reconciles the journal with the log) and a
			// new fence.
			journaled := "unknown (empty history)"
			if hist := r.History(); len(hist) > 0 {
				journaled = fmt.Sprintf("epoch %d from offset %d", hist[len(hist)-1].Epoch, hist[len(hist)-1].Start)
			}
			return 0, safetyf("range %q: leader %s at epoch %d answers that our log diverges (its epoch %d ends at %d) but our history (last entry %s) leaves nothing to cut at our log end %d (last record's epoch %d, HWM %d): our history and records, or the leader's, are inconsistent; not fetching",
				h.id, f.leaderID, f.epoch, d.GetEpoch(), d.GetEndOffset(), journaled, end, r.LastEpoch(), hwm)
		}
		removed, err := r.Truncate(target)
		if err != nil {
			return 0, &storeError{fmt.Errorf("truncate to %d on divergence: %w", target, err)}
		}
		n := h.cuts.add(fetchTruncation{epoch: f.epoch, leader: f.leaderID, from: end, to: target, removed: removed, at: time.Now()})
		h.log.Info("truncated on divergence", "epoch", f.epoch, "leader", f.leaderID, "diverging_epoch", d.GetEpoch(), "leader_end", d.GetEndOffset(), "from", end, "to", target, "removed", removed, "hwm", hwm, "fetch_truncations", n)
		return target, nil
	}
	if a.GetBelowLogStart() {
		return f.resetToLogStart(end, a.GetLogStart())
	}
	recs := a.GetRecords()
	if len(recs) == 0 {
		return end, nil
	}
	if err := r.AppendRecords(recs); err != nil {
		return appendFailed(len(recs), end, err)
	}
	return end + uint64(len(recs)), nil
}

// appendFailed is apply's answer to n records at end that the store
// refused or failed to write.
func appendFailed(n int, end uint64, err error) (newEnd uint64, _ error) {
	if errors.Is(err, logstore.ErrDiskFull) {
		// Refused before anything was journaled or written: the log
		// still ends at end, and the same records are fetched again
		// once space is back (step).
		return end, fmt.Errorf("append %d records at %d: %w", n, end, err)
	}
	return 0, &storeError{fmt.Errorf("append %d records at %d: %w", n, end, err)}
}

// applied is an answer the fetch session applied for the loop (queueApply):
// the log end after it, or apply's error.
type applied struct {
	end uint64
	err error
}

// queueApply queues the records of a plain answer to req (records, no
// divergence, not below the log start) after the checks validateFetchAnswer
// and apply make, and holding h.mu shared as apply does, so that a fetch
// session that received answers for several ranges at once writes them in
// one group commit and one WAL sync (fetchSession.deliver) rather than one
// or two per range. It returns what commits the store's queue (unless
// another finish did), waits for the write, releases h.mu and reports as
// apply would. It returns nil, having done nothing, for
// anything else, which the fetch loop checks and applies itself as before:
// another kind of answer, one that fails a check (the loop fails it the
// same way), records the store refuses (nothing was queued, so the loop
// meets the same refusal), and a range whose h.mu is held or wanted
// exclusively (a fence or a cut in progress: the session's receiver never
// waits for one).
func (f *follower) queueApply(req *tenurev1.FetchRequest, a *tenurev1.FetchResponse) (finish func() applied) {
	recs := a.GetRecords()
	if len(recs) == 0 || a.GetDiverging() != nil || a.GetBelowLogStart() {
		return nil
	}
	end := req.GetFetchOffset()
	if validateFetchAnswer(f.epoch, end, req.GetLastFetchedEpoch(), a) != nil {
		return nil
	}
	h, r := f.h, f.h.r
	if !h.mu.TryRLock() {
		return nil
	}
	// apply's own checks: still this loop's range, and the log still ends
	// where the pull was made.
	if h.follow != f || r.LogEnd() != end {
		h.mu.RUnlock()
		return nil
	}
	wait, err := r.QueueRecords(recs)
	if err != nil {
		h.mu.RUnlock()
		return nil
	}
	return func() applied {
		defer h.mu.RUnlock()
		// The first finish commits every range's queued records; the
		// others find them written.
		r.CommitQueued()
		if err := wait(); err != nil {
			newEnd, err := appendFailed(len(recs), end, err)
			return applied{end: newEnd, err: err}
		}
		return applied{end: end + uint64(len(recs))}
	}
}

// resetToLogStart acts on a below_log_start answer: the leader cannot serve
// this log, which ends at end, because it lacks records below its log start
// leaderStart, or our last epoch precedes its trimmed history. Everything
// below leaderStart is committed and was deleted there on purpose. h.mu is
// held shared by the caller (apply).
func (f *follower) resetToLogStart(end, leaderStart uint64) (newEnd uint64, err error) {
	h, r := f.h, f.h.r
	hwm := r.HWM()
	if hwm > leaderStart {
		// Our committed prefix runs past the leader's log start, yet the
		// leader cannot continue our log: a fetch from at or above its
		// start under an epoch its history still covers is always
		// decided, so our last epoch precedes its whole kept history,
		// and our committed records at leaderStart and above are under
		// epochs its log does not have there. A committed record
		// disagrees; resetting would discard it. Stop, as a divergence
		// below the HWM does.
		return 0, safetyf("range %q: leader %s at epoch %d answers that our log (end %d, last epoch %d) is below its log start %d, but our HWM %d is above that: a committed record disagrees; not resetting, not fetching",
			h.id, f.leaderID, f.epoch, end, r.LastEpoch(), leaderStart, hwm)
	}
	// hwm <= leaderStart: every record we hold at or above leaderStart is
	// above our HWM, so cutting them never removes a committed record, and
	// every record below it is committed (deleted on the leader by
	// retention) and goes with the reset.
	var removed uint64
	if end > leaderStart {
		// ResetTo takes a log wholly below the start; cut to it first
		// (never below our HWM, which is at or below it).
		if removed, err = r.Truncate(leaderStart); err != nil {
			return 0, &storeError{fmt.Errorf("truncate to the leader's log start %d: %w", leaderStart, err)}
		}
		// A cut at fetch time like a divergence's: status counts it.
		h.cuts.add(fetchTruncation{epoch: f.epoch, leader: f.leaderID, from: end, to: leaderStart, removed: removed, at: time.Now()})
	}
	start := r.LogStart()
	if err := r.ResetTo(leaderStart); err != nil {
		return 0, &storeError{fmt.Errorf("reset to the leader's log start %d: %w", leaderStart, err)}
	}
	n := h.resets.Add(1)
	h.log.Info("reset to the leader's log start: the records this replica lacks were committed and deleted by retention",
		"epoch", f.epoch, "leader", f.leaderID, "leader_log_start", leaderStart,
		"old_log_start", start, "old_log_end", end, "old_hwm", hwm, "truncated_above_start", removed, "log_start_resets", n)
	return leaderStart, nil
}

// fetchTruncation is one truncation a fetch loop made on a divergence.
type fetchTruncation struct {
	epoch    uint64 // the epoch the follower fetched at
	leader   string // whose answer it followed
	from, to uint64 // the log end before, and the offset cut to
	removed  uint64 // records removed
	at       time.Time
}

// fetchTruncations counts a range's fetch-time truncations since the
// replica opened it, for status: otherwise a cut shows only as a log line,
// and a follower that keeps losing tails looks like any other. It has its
// own lock because fetch loops truncate holding h.mu only shared.
type fetchTruncations struct {
	mu      sync.Mutex
	count   uint64
	records uint64
	last    fetchTruncation
}

// add records t and returns how many truncations there have been.
func (c *fetchTruncations) add(t fetchTruncation) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.count++
	c.records += t.removed
	c.last = t
	return c.count
}

// report fills st's fetch truncation fields.
func (c *fetchTruncations) report(st *tenurev1.RangeStatus) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st.FetchTruncations, st.FetchTruncatedRecords = c.count, c.records
	if c.count == 0 {
		return
	}
	st.LastFetchTruncationFrom, st.LastFetchTruncationTo = c.last.from, c.last.to
	st.LastFetchTruncationEpoch, st.LastFetchTruncationLeader = c.last.epoch, c.last.leader
	st.LastFetchTruncationUnixMs = c.last.at.UnixMilli()
}

// raiseHWM raises the HWM to to, capped at the durable log end.
func (f *follower) raiseHWM(to uint64) error {
	h, r := f.h, f.h.r
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.follow != f {
		return context.Cause(f.ctx)
	}
	// A Truncate command may have cut the log since the records were
	// written; the HWM never covers what the log does not durably hold.
	to = min(to, r.DurableEnd(), r.LogEnd())
	if to <= r.HWM() {
		return nil
	}
	if err := r.SetHWM(to); err != nil {
		return &storeError{fmt.Errorf("raise HWM to %d: %w", to, err)}
	}
	return nil
}

// backoff is a bounded exponential backoff with jitter.
// fetchFailureLogEvery is how often at most a fetch loop logs a failure.
const fetchFailureLogEvery = 5 * time.Second

// failureLog rate-limits a loop's failure log: the first failure after a
// quiet spell is logged at once, later ones at most once per every, each
// with the count of failures not logged since the last one. A run of
// failures that lasted at least every is closed by one line on success.
type failureLog struct {
	every    time.Duration
	last     time.Time // when a failure was last logged
	unlogged int       // failures since then
	since    time.Time // when the current run of failures began; zero: none
}

// failed records a failure at now and says whether to log it, and how many
// failures were not logged before it.
func (l *failureLog) failed(now time.Time) (bool, int) {
	if l.since.IsZero() {
		l.since = now
	}
	if !l.last.IsZero() && now.Sub(l.last) < l.every {
		l.unlogged++
		return false, 0
	}
	n := l.unlogged
	l.last, l.unlogged = now, 0
	return true, n
}

// succeeded ends a run of failures at now. It returns how long the run
// lasted if that was at least every (worth a line), else 0.
func (l *failureLog) succeeded(now time.Time) time.Duration {
	var d time.Duration
	if !l.since.IsZero() && now.Sub(l.since) >= l.every {
		d = now.Sub(l.since)
	}
	l.since = time.Time{}
	return d
}

type backoff struct {
	cur time.Duration
	// min and max bound cur; zero means fetchBackoffMin and fetchBackoffMax.
	min, max time.Duration
}

func (b *backoff) reset() { b.cur = 0 }

// next returns a wait drawn from [cur/2, cur] and doubles cur up to the cap,
// so followers of a dead leader do not retry in lockstep.
func (b *backoff) next() time.Duration {
	lo, hi := fetchBackoffMin, fetchBackoffMax
	if b.min > 0 {
		lo, hi = b.min, b.max
	}
	b.cur = min(max(b.cur*2, lo), hi)
	return b.cur/2 + rand.N(b.cur/2+1)
}

// sleepCtx sleeps for d or until ctx is done; false if ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
