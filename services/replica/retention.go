package replica

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// This file is retention (README "Retention"): the leader of a range removes
// committed records that fall outside the range's policy, by advancing the
// log start. Followers never apply a policy of their own: they follow the
// leader's log start from its fetch answers (follower.go), so every replica
// of a range removes the same prefix, and only what its leader (which holds
// the whole committed log) removed.
//
// How a leader learns the policy, and when it changes:
//   - Adopt carries it: the promoter reads it with the range (the grant's
//     own answer, or GetRange), so a new leader applies it from its first pass.
//   - Every RetentionInterval, the replica reads the policies of all the
//     ranges it leads from the lease service (Config.Policies), in one
//     GetRanges call per wire.MaxRangesPerBatch ranges: `tenurectl range
//     set` takes effect within one interval, with no promotion.
//   - A leader that knows no policy (an Adopt from an older promoter and no
//     lease service, or none answered yet) removes nothing: applying the
//     defaults to a range whose real policy is longer would delete records
//     its operator meant to keep.

// Applying a size limit early. Between two passes a range grows by its
// write rate times the interval: 30 s of appends at 40 MB/s is 1.2 GB, which
// makes a max_bytes of less than that meaningless, and no one interval fits
// every rate (the retention soak, bench/soak_test.go: 8 MiB at ~40 MB/s
// overshot to 1.8x with a pass every 250 ms). So a leader also checks,
// whenever it looks at its commit point (leader.advance: three atomic loads),
// whether a range's stored bytes passed its size limit by retentionSlack,
// and if so the retention loop applies that range's policy at once
// (retentionQueue), without re-reading it from the lease service. A range
// then holds at most max_bytes + slack + what is indexed during one pass,
// whatever the write rate.

// DefaultRetentionInterval is how often a leader applies its ranges'
// policies unless Config.RetentionInterval says otherwise. Kafka checks every
// 5 minutes (log.retention.check.interval.ms); 30 s keeps a range within a
// few percent of a small size limit under load, and a pass over ranges
// within their policy costs two in-memory lookups each.
const DefaultRetentionInterval = 30 * time.Second

// policyRefreshTimeout bounds one pass's reads of the lease service.
const policyRefreshTimeout = 5 * time.Second

// PolicySource is the lease service's word on many ranges at once. Package
// lease's Keeper implements it (one GetRanges call).
type PolicySource interface {
	// GetRanges answers each of rangeIDs (at most wire.MaxRangesPerBatch)
	// in order: its RangeInfo, or its own error.
	GetRanges(ctx context.Context, rangeIDs []string) ([]*tenurev1.GetRangeResult, error)
}

// retentionSlack is how far past its size limit a range may grow before its
// leader applies the limit without waiting for the interval: an eighth of
// the limit, at least 1 MiB. Every early pass costs a few syncs of Badger
// and the journal (AdvanceLogStart) on the leader and on each follower: the
// eighth bounds them to eight per limit's worth of appends, the floor to
// one per MiB (a limit of a few KiB would otherwise cost a pass per batch).
func retentionSlack(maxBytes uint64) uint64 { return max(maxBytes/8, 1<<20) }

// retentionQueue holds the ranges due an early pass (checkRetentionSize)
// until the retention loop takes them: at most one entry per hosted range.
type retentionQueue struct {
	// kick wakes the retention loop; nil when there is none
	// (RetentionInterval < 0: nothing is ever removed), and then nothing
	// is queued.
	kick chan struct{}
	mu   sync.Mutex
	due  map[*hosted]struct{}
}

func newRetentionQueue(loop bool) retentionQueue {
	if !loop {
		return retentionQueue{}
	}
	return retentionQueue{kick: make(chan struct{}, 1), due: map[*hosted]struct{}{}}
}

// add queues h and wakes the loop, without waiting for it.
func (q *retentionQueue) add(h *hosted) {
	if q.kick == nil {
		return
	}
	q.mu.Lock()
	q.due[h] = struct{}{}
	q.mu.Unlock()
	select {
	case q.kick <- struct{}{}:
	default: // a wake is pending: it takes h too
	}
}

// take empties the queue and returns what it held.
func (q *retentionQueue) take() []*hosted {
	q.mu.Lock()
	defer q.mu.Unlock()
	hs := make([]*hosted, 0, len(q.due))
	for h := range q.due {
		hs = append(hs, h)
		delete(q.due, h)
	}
	return hs
}

// retentionLoop applies every led range's policy each interval, and a
// range's at once when its leader queued it (checkRetentionSize), until
// the replica closes. One pass at a time.
func (s *Replica) retentionLoop(interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			s.retentionPass(time.Now())
			s.retained.log(s.log, interval)
		case <-s.retentionDue.kick:
			now := time.Now()
			for _, h := range s.retentionDue.take() {
				if s.ctx.Err() != nil {
					return
				}
				h.applyRetention(now)
			}
		}
	}
}

// checkRetentionSize queues the range for an early pass when its indexed
// bytes passed its size limit by retentionSlack: counted from the limit,
// or from what the last pass left when that was more (a pass the HWM held
// back is tried again only once another slack's worth has been indexed,
// not at every commit). Indexed bytes, not StoredBytes: a pass can cut
// only batches Badger holds (RetainBytes), so a pass run for bytes still
// waiting for the index would cut nothing and record them as left, and
// the index commit that stores them would then not make a pass due. The
// leadership calls it whenever it looks at its commit point and after each
// index commit of its range (IndexGrown); it costs three atomic loads when
// nothing is due.
func (h *hosted) checkRetentionSize() {
	if !h.hasSizeLimit() {
		return // no policy learned, or no size limit: the interval's passes only
	}
	p := h.retention.Load()
	from := max(p.GetMaxBytes(), h.retentionLeft.Load())
	if held := h.retentionHeld.Load(); held > 0 && h.r.HWM() >= held {
		// What the last pass left was uncommitted then and is committed
		// now (one batch larger than the limit, whose index commit made
		// the pass due before the HWM passed it): count from the limit,
		// or the range stays over it until another slack's worth is
		// indexed or the interval passes.
		from = p.GetMaxBytes()
	}
	if h.r.IndexedBytes() > from+retentionSlack(p.GetMaxBytes()) {
		h.s.retentionDue.add(h)
	}
}

// hasSizeLimit reports whether the range's policy, once learned, limits
// its size.
func (h *hosted) hasSizeLimit() bool {
	p := h.retention.Load()
	return p != nil && p.GetMaxBytes() > 0
}

// retentionPass refreshes the policies of the ranges this replica leads and
// applies each once.
func (s *Replica) retentionPass(now time.Time) {
	hs, err := s.hostedRanges()
	if err != nil {
		return // closed
	}
	var leading []*hosted
	for _, h := range hs {
		h.mu.RLock()
		ok := h.halted == nil && h.acting() != nil
		h.mu.RUnlock()
		if ok {
			leading = append(leading, h)
		}
	}
	if len(leading) == 0 {
		return
	}
	s.refreshPolicies(leading)
	for _, h := range leading {
		if s.ctx.Err() != nil {
			return
		}
		h.applyRetention(now)
	}
}

// refreshPolicies reads the policies of hs from the lease service, one
// batched call per wire.MaxRangesPerBatch ranges. A range the lease service
// does not answer keeps the policy it had: a lease service that is down
// for a while stops no retention, and changes none.
func (s *Replica) refreshPolicies(hs []*hosted) {
	if s.cfg.Policies == nil {
		return
	}
	for from := 0; from < len(hs); from += wire.MaxRangesPerBatch {
		chunk := hs[from:min(from+wire.MaxRangesPerBatch, len(hs))]
		ids := make([]string, len(chunk))
		for i, h := range chunk {
			ids[i] = h.id
		}
		ctx, cancel := context.WithTimeout(s.ctx, policyRefreshTimeout)
		results, err := s.cfg.Policies.GetRanges(ctx, ids)
		cancel()
		if err != nil {
			if s.ctx.Err() == nil {
				s.log.Warn("retention: could not read the ranges' policies from the lease service; keeping the ones known", "ranges", len(ids), "err", err)
			}
			continue
		}
		for i, h := range chunk {
			if i >= len(results) || results[i].GetRangeId() != h.id {
				break // a malformed answer: keep what is known
			}
			p := results[i].GetRange().GetRetention()
			if p == nil {
				continue // an error for this range, or a lease service without retention
			}
			if err := wire.ValidateRetention(p); err != nil {
				h.log.Warn("retention: the lease service answered an invalid policy; keeping the one known", "err", err)
				continue
			}
			h.setRetention(p)
		}
	}
}

// setRetention records the policy the range's leadership applies.
func (h *hosted) setRetention(p *tenurev1.RetentionPolicy) {
	if old := h.retention.Swap(p); old != nil && (old.GetMaxBytes() != p.GetMaxBytes() || old.GetMaxAgeMs() != p.GetMaxAgeMs()) {
		h.log.Info("retention policy changed", "max_bytes", p.GetMaxBytes(), "max_age_ms", p.GetMaxAgeMs(),
			"was_max_bytes", old.GetMaxBytes(), "was_max_age_ms", old.GetMaxAgeMs())
	}
}

// retainer is what retentionTarget reads of a range's log.
type retainer interface {
	LogStart() uint64
	HWM() uint64
	RetainBytes(limit uint64) uint64
	RetainSince(t time.Time) uint64
}

// retentionTarget is the log start policy p asks for at now: the larger of
// the size limit's and the age limit's starts (a record goes when it is
// outside either), never below the current start and never above the HWM;
// and wanted, the same before the HWM bounds it (applyRetention keeps it
// when the HWM held the pass back). Pure but for r's reads, so a table can
// test it.
func retentionTarget(r retainer, p *tenurev1.RetentionPolicy, now time.Time) (target, wanted uint64) {
	wanted = r.LogStart()
	if b := p.GetMaxBytes(); b > 0 {
		wanted = max(wanted, r.RetainBytes(b))
	}
	if p.GetMaxAgeMs() > 0 {
		wanted = max(wanted, r.RetainSince(now.Add(-wire.RetentionAge(p))))
	}
	// Only committed records are ever removed: everything at or above the
	// HWM may still be needed by a promotion or cut by a truncation, and a
	// deleted uncommitted record could be an acknowledged one's only copy
	// once the leader fails. AdvanceLogStart clamps to it as well; the
	// bound is stated here too, where the target is chosen.
	return min(wanted, r.HWM()), wanted
}

// applyRetention advances the range's log start as its policy asks, while
// this replica leads it. It does not hold h.mu across the store's work: a
// log start at or below the HWM removes committed records only, which is
// right whatever role the range takes meanwhile (a fence does not wait for
// a deletion).
func (h *hosted) applyRetention(now time.Time) {
	p := h.retention.Load()
	if p == nil {
		return // no policy learned yet: remove nothing (see the file comment)
	}
	// Still leading (the refresh took a round trip): a range fenced or
	// dropped since is left to its next leader.
	h.mu.RLock()
	leading := h.halted == nil && !h.dropped && h.acting() != nil
	h.mu.RUnlock()
	if !leading {
		return
	}
	// What this pass leaves, for checkRetentionSize, however it ends.
	defer func() { h.retentionLeft.Store(h.r.IndexedBytes()) }()
	from := h.r.LogStart()
	target, wanted := retentionTarget(h.r, p, now)
	if wanted > target {
		h.retentionHeld.Store(wanted)
	} else {
		h.retentionHeld.Store(0)
	}
	if target <= from {
		return
	}
	start, err := h.r.AdvanceLogStart(target)
	if err != nil {
		// Closing or dropped meanwhile: nothing to say.
		if !errors.Is(err, logstore.ErrClosed) && !errors.Is(err, logstore.ErrDropped) && h.s.ctx.Err() == nil {
			h.log.Warn("retention: advancing the log start failed; retried next interval", "from", from, "to", target, "err", err)
		}
		return
	}
	if start > from {
		// Debug: under steady load every range with a policy advances at
		// every pass, and a line each at Info was the bulk of a replica's
		// log (a 40-minute soak of 160 ranges: thousands of them per
		// replica, growing with ranges x passes). The retention loop logs
		// one summary per interval instead (retentionTally).
		h.log.Debug("retention advanced the log start", "from", from, "to", start, "hwm", h.r.HWM(),
			"stored_bytes", h.r.StoredBytes(), "max_bytes", p.GetMaxBytes(), "max_age_ms", p.GetMaxAgeMs())
		h.s.retained.add(h.id, start-from)
	}
}

// retentionTally is what retention removed since it was last logged:
// the ranges whose log start advanced (at most one entry per hosted range)
// and the records removed, early passes included.
type retentionTally struct {
	mu       sync.Mutex
	ranges   map[string]struct{}
	advances int
	records  uint64
}

func (t *retentionTally) add(id string, records uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ranges == nil {
		t.ranges = map[string]struct{}{}
	}
	t.ranges[id] = struct{}{}
	t.advances++
	t.records += records
}

// log writes one line for what was removed since the last call, if
// anything, and starts counting again.
func (t *retentionTally) log(log *slog.Logger, interval time.Duration) {
	t.mu.Lock()
	ranges, advances, records := len(t.ranges), t.advances, t.records
	clear(t.ranges)
	t.advances, t.records = 0, 0
	t.mu.Unlock()
	if advances > 0 {
		log.Info("retention advanced log starts", "ranges", ranges, "advances", advances, "records_removed", records, "interval", interval)
	}
}

// retentionInForce is the policy status reports: the one a leader applies,
// nil elsewhere (followers follow the leader's log start). h.mu is held.
func (h *hosted) retentionInForceLocked() *tenurev1.RetentionPolicy {
	if h.lead == nil {
		return nil
	}
	return h.retention.Load()
}

// validateAdoptRetention checks the policy an Adopt carries, if any.
func validateAdoptRetention(m *tenurev1.AdoptRequest) error {
	if p := m.GetRetention(); p != nil {
		if err := wire.ValidateRetention(p); err != nil {
			return invalidf("adopt retention: %v", err)
		}
	}
	return nil
}
