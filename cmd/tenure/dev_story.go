package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/trace"

	"github.com/tenurelog/tenure/internal/table"
	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/pkg/telemetry"
	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// devStepTimeout bounds every wait of the story: a first leader, a
// promotion, a rejoin. Each takes well under a second on a healthy machine;
// the rest is headroom for a loaded one.
const devStepTimeout = 20 * time.Second

// devRPCTimeout bounds one call of the story.
const devRPCTimeout = 5 * time.Second

// errStoryRangeExists: the story's range is already in etcd, so the data
// directory is one an earlier tenure dev kept. The story is skipped and the
// cluster serves what the directory holds.
var errStoryRangeExists = errors.New("the story's range already exists")

// story is the scripted walk through a failover that tenure dev prints.
type story struct {
	c       *devCluster
	w       io.Writer
	rangeID string
	records int
	n       int // the step being printed

	acked []ackedRecord
	// inDoubt is the record the old leader wrote but could not commit, and
	// oldLogEnd its log end just before it was killed.
	inDoubt   *ackedRecord
	oldLogEnd uint64
}

func joinIDs(rs []*devReplica) string {
	ids := make([]string, len(rs))
	for i, r := range rs {
		ids[i] = r.id
	}
	return strings.Join(ids, ", ")
}

// inDoubtWait bounds the append the paused followers cannot acknowledge.
// With the wait before it, the followers stay paused well within their
// lease sessions' TTL (devLeaseTTL).
const inDoubtWait = 500 * time.Millisecond

// appendInDoubt stages the case tenure exists for: a leader that wrote a
// record no quorum holds, then dies. With its followers paused, the leader
// writes the record to its own log but cannot commit it, so the append is
// not acknowledged. The followers are paused only after their in-flight
// long polls (at most the fetch wait) have been answered, so none carries
// the record away.
func (s *story) appendInDoubt(ctx context.Context, leader *devReplica, followers []*devReplica) error {
	for _, f := range followers {
		if err := f.pause(); err != nil {
			return err
		}
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(devFetchWait + 200*time.Millisecond):
	}
	value := "in-doubt"
	cctx, cancel := context.WithTimeout(ctx, inDoubtWait)
	resp, err := s.logClient(leader.url()).Append(cctx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: s.rangeID, Records: [][]byte{[]byte(value)}}))
	cancel()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err == nil {
		// A follower took it after all: it is committed, and the story
		// goes on with it as one more acknowledged record.
		s.acked = append(s.acked, ackedRecord{offset: resp.Msg.GetBaseOffset(), value: value})
		s.say("append %q was acknowledged at offset %d after all (a follower had fetched it)", value, resp.Msg.GetBaseOffset())
		return nil
	}
	st, serr := s.status(ctx, leader)
	if serr != nil {
		return fmt.Errorf("status of %s: %w", leader.id, serr)
	}
	s.oldLogEnd = st.GetLogEnd()
	s.inDoubt = &ackedRecord{offset: st.GetLogEnd() - 1, value: value}
	s.say("append %q: no acknowledgement within %v (%s)", value, inDoubtWait, connect.CodeOf(err))
	s.say("%s wrote it at offset %d (log end %d) but its high-water mark stays %d: no follower holds it, so it is not committed",
		leader.id, s.inDoubt.offset, st.GetLogEnd(), st.GetHighWaterMark())
	return nil
}

// checkInDoubtGone reads the old leader's log position where the in-doubt
// record was, from the new leader: an epoch-start record of the new epoch
// (or a later record), never the record no quorum held.
func (s *story) checkInDoubtGone(ctx context.Context, old *devReplica, leaderID string) error {
	cctx, cancel := context.WithTimeout(ctx, devRPCTimeout)
	defer cancel()
	resp, err := s.logClient(s.c.replica(leaderID).url()).Read(cctx, connect.NewRequest(&tenurev1.ReadRequest{RangeId: s.rangeID, Offset: s.inDoubt.offset, MaxRecords: 1}))
	if err != nil {
		return fmt.Errorf("read offset %d from %s: %w", s.inDoubt.offset, leaderID, err)
	}
	recs := resp.Msg.GetRecords()
	if len(recs) != 1 {
		return fmt.Errorf("read offset %d from %s: got %d records", s.inDoubt.offset, leaderID, len(recs))
	}
	if string(recs[0].GetValue()) == s.inDoubt.value && !recs[0].GetEpochStart() {
		s.say("offset %d still holds %q: a follower had it before the kill, so the new leader kept and committed it (allowed: a failed append's outcome is unknown)", s.inDoubt.offset, s.inDoubt.value)
		return nil
	}
	what := fmt.Sprintf("%q (epoch %d)", recs[0].GetValue(), recs[0].GetEpoch())
	if recs[0].GetEpochStart() {
		what = fmt.Sprintf("epoch %d's epoch-start record", recs[0].GetEpoch())
	}
	s.say("the in-doubt record is gone: %s cut its log back to %d when it first fetched, and offset %d is now %s (the histories agree);",
		old.id, s.inDoubt.offset, s.inDoubt.offset, what)
	s.say("it was never acknowledged, so no acknowledged record was lost, and no two replicas disagree about an offset")
	return nil
}

type ackedRecord struct {
	offset uint64
	value  string
}

func (s *story) step(format string, args ...any) {
	s.n++
	fmt.Fprintf(s.w, "\n[%d] %s\n", s.n, fmt.Sprintf(format, args...))
}

func (s *story) say(format string, args ...any) {
	fmt.Fprintf(s.w, "    %s\n", fmt.Sprintf(format, args...))
}

func (s *story) logClient(url string) tenurev1connect.LogServiceClient {
	return tenurev1connect.NewLogServiceClient(s.c.http, url, transport.ClientOptions()...)
}

// run tells the story: create a range, see its first leader, append, kill
// the leader, watch the promotion, append and read again, bring the old
// leader back, and compare every replica's epoch history.
func (s *story) run(ctx context.Context) error {
	members := make([]*tenurev1.Replica, 0, len(s.c.replicas))
	names := make([]string, 0, len(s.c.replicas))
	for _, r := range s.c.replicas {
		members = append(members, &tenurev1.Replica{Id: r.id, Address: r.url()})
		names = append(names, r.id)
	}
	preferred := s.c.replicas[0].id

	s.step("create range %q on replicas %s (preferred leader %s)", s.rangeID, strings.Join(names, ", "), preferred)
	cctx, cancel := context.WithTimeout(ctx, devRPCTimeout)
	_, err := s.c.leaseClient.CreateRange(cctx, connect.NewRequest(&tenurev1.CreateRangeRequest{RangeId: s.rangeID, Replicas: members, PreferredReplicaId: preferred}))
	cancel()
	if connect.CodeOf(err) == connect.CodeAlreadyExists {
		// A kept --data-dir from an earlier run (or an older tenure's):
		// its range holds records the story would not account for, and
		// the story's kill and cut would be staged on someone's data.
		return errStoryRangeExists
	}
	if err != nil {
		return fmt.Errorf("create range %s: %w", s.rangeID, err)
	}
	s.say("stored in etcd at epoch 0: no leader yet. The promoter sees the new range and promotes one.")

	s.step("wait for the first leader")
	created := time.Now()
	leader, epoch, err := s.waitLeader(ctx, 1, "")
	if err != nil {
		return err
	}
	s.say("%s leads at epoch %d, %v after the range was created", leader, epoch, since(created))

	s.step("append %d records to the leader %s, one at a time", s.records, leader)
	if err := s.appendRecords(ctx, leader, "before-failover", s.records); err != nil {
		return err
	}

	old := s.c.replica(leader)
	var followers []*devReplica
	for _, r := range s.c.replicas {
		if r != old {
			followers = append(followers, r)
		}
	}
	s.step("pause the followers (SIGSTOP %s) and append one more record to %s", joinIDs(followers), old.id)
	if err := s.appendInDoubt(ctx, old, followers); err != nil {
		return err
	}

	oldPid := old.cmd.Process.Pid
	s.step("kill the leader: SIGKILL %s (pid %d), then resume the followers (SIGCONT)", old.id, oldPid)
	err = old.kill()
	for _, f := range followers {
		if rerr := f.resume(); err == nil {
			err = rerr
		}
	}
	if err != nil {
		return err
	}
	killed := time.Now()
	s.say("%s is gone: no shutdown ran, its lease session is left to expire, its connections are refused", old.id)
	s.say("its log still holds the in-doubt record, on disk, in epoch 1")

	s.step("watch the promotion")
	next, nextEpoch, err := s.waitLeader(ctx, epoch+1, old.id)
	if err != nil {
		return err
	}
	served := time.Since(killed)
	tr, err := s.transition(ctx, nextEpoch)
	if err != nil {
		return err
	}
	if nextEpoch > epoch+1 {
		// A slow machine can make the promoter act twice (a new leader
		// that misses probes before its lease is bound to it): each
		// promotion takes a new epoch, and fencing keeps every one safe.
		s.say("%d promotions since the kill (epochs %d to %d); the last one, which stands, is shown", nextEpoch-epoch, epoch+1, nextEpoch)
	}
	s.printTransition(ctx, tr, killed, served)

	s.step("append %d more records to the new leader %s, and read everything back", s.records, next)
	if err := s.appendRecords(ctx, next, "after-failover", s.records); err != nil {
		return err
	}
	if err := s.readBack(ctx, next); err != nil {
		return err
	}

	s.step("epoch histories while %s is down (%s's read from its journal file on disk, its log end from before the kill)", old.id, old.id)
	if err := s.printHistories(ctx, next); err != nil {
		return err
	}

	s.step("restart %s on the same port and data: the promoter fences it at epoch %d and makes it follow %s", old.id, nextEpoch, next)
	restarted := time.Now()
	if err := old.start(s.c.self); err != nil {
		return err
	}
	if err := old.waitReady(ctx, replicaClient(s.c.http, old.url())); err != nil {
		return err
	}
	s.c.readyReplica(old)
	end, err := s.waitFollower(ctx, old, next, nextEpoch)
	if err != nil {
		return err
	}
	s.say("%s (pid %d) follows %s at epoch %d and holds the whole log (log end %d), %v after the restart",
		old.id, old.cmd.Process.Pid, next, nextEpoch, end, since(restarted))
	// The pids printed at start-up are stale for the restarted replica:
	// whoever kills a replica next needs the current ones.
	s.say("replica processes now: %s", replicaPids(s.c.replicas, map[string]int{old.id: oldPid}))

	s.step("epoch histories, side by side")
	if err := s.printHistories(ctx, next); err != nil {
		return err
	}
	if s.inDoubt != nil {
		if err := s.checkInDoubtGone(ctx, old, next); err != nil {
			return err
		}
	}

	s.step("transition records of range %q, newest first (tenurectl transitions %s)", s.rangeID, s.rangeID)
	return s.printTransitions(ctx)
}

// replicaPids lists each running replica's pid, "r1 pid 4242, ...", and
// for one in was the pid it had before a restart.
func replicaPids(rs []*devReplica, was map[string]int) string {
	parts := make([]string, 0, len(rs))
	for _, r := range rs {
		switch {
		case r.cmd == nil:
			parts = append(parts, r.id+" down")
		case was[r.id] != 0:
			parts = append(parts, fmt.Sprintf("%s pid %d (restarted; was %d)", r.id, r.cmd.Process.Pid, was[r.id]))
		default:
			parts = append(parts, fmt.Sprintf("%s pid %d", r.id, r.cmd.Process.Pid))
		}
	}
	return strings.Join(parts, ", ")
}

// waitLeader waits until a replica other than not leads the range at an
// epoch of at least minEpoch with a valid lease, answering as such.
func (s *story) waitLeader(ctx context.Context, minEpoch uint64, not string) (string, uint64, error) {
	var id string
	var epoch uint64
	err := waitUntil(ctx, devStepTimeout, fmt.Sprintf("a leader of range %s at epoch %d or later", s.rangeID, minEpoch), func() bool {
		for _, r := range s.c.replicas {
			if r.id == not || r.cmd == nil {
				continue
			}
			st, err := s.status(ctx, r)
			if err == nil && st.GetRole() == tenurev1.Role_ROLE_LEADER && st.GetEpoch() >= minEpoch && st.GetLeaseValid() {
				id, epoch = r.id, st.GetEpoch()
				return true
			}
		}
		return false
	})
	if err != nil {
		var seen []string
		for _, r := range s.c.replicas {
			if r.cmd == nil {
				seen = append(seen, r.id+" down")
				continue
			}
			st, serr := s.status(ctx, r)
			if serr != nil {
				seen = append(seen, fmt.Sprintf("%s: %v", r.id, serr))
				continue
			}
			seen = append(seen, fmt.Sprintf("%s %s at epoch %d (fenced %d, lease valid %v)", r.id,
				strings.ToLower(strings.TrimPrefix(st.GetRole().String(), "ROLE_")), st.GetEpoch(), st.GetFencedEpoch(), st.GetLeaseValid()))
		}
		log := filepath.Join(s.c.dir, "dev.log")
		return "", 0, fmt.Errorf("%w; replicas: %s; the end of the promoter's log %s:\n%s", err, strings.Join(seen, "; "), log, tailOf(log, 12))
	}
	return id, epoch, nil
}

func (s *story) status(ctx context.Context, r *devReplica) (*tenurev1.RangeStatus, error) {
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := replicaClient(s.c.http, r.url()).GetStatus(cctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: s.rangeID}))
	if err != nil {
		return nil, err
	}
	if len(resp.Msg.GetRanges()) != 1 {
		return nil, fmt.Errorf("replica %s does not host range %s", r.id, s.rangeID)
	}
	return resp.Msg.GetRanges()[0], nil
}

// appendRecords appends n records to the leader, one per call, and prints
// each acknowledgement. A new leader may refuse its first appends until its
// lease is bound to it; those are retried within devStepTimeout.
func (s *story) appendRecords(ctx context.Context, leaderID, prefix string, n int) error {
	lc := s.logClient(s.c.replica(leaderID).url())
	for i := range n {
		value := fmt.Sprintf("%s-%d", prefix, i+1)
		var resp *connect.Response[tenurev1.AppendResponse]
		var lastErr error
		err := waitUntil(ctx, devStepTimeout, fmt.Sprintf("an acknowledged append to %s", leaderID), func() bool {
			cctx, cancel := context.WithTimeout(ctx, devRPCTimeout)
			defer cancel()
			resp, lastErr = lc.Append(cctx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: s.rangeID, Records: [][]byte{[]byte(value)}}))
			return lastErr == nil
		})
		if err != nil {
			return fmt.Errorf("%w (last error: %v)", err, lastErr)
		}
		s.acked = append(s.acked, ackedRecord{offset: resp.Msg.GetBaseOffset(), value: value})
		s.say("append %-18q acknowledged at offset %d (epoch %d, high-water mark %d)", value, resp.Msg.GetBaseOffset(), resp.Msg.GetEpoch(), resp.Msg.GetHighWaterMark())
	}
	return nil
}

// readBack reads the whole committed log from the leader and checks that
// every acknowledged record sits at its offset with its bytes.
func (s *story) readBack(ctx context.Context, leaderID string) error {
	cctx, cancel := context.WithTimeout(ctx, devRPCTimeout)
	defer cancel()
	resp, err := s.logClient(s.c.replica(leaderID).url()).Read(cctx, connect.NewRequest(&tenurev1.ReadRequest{RangeId: s.rangeID}))
	if err != nil {
		return fmt.Errorf("read range %s from %s: %w", s.rangeID, leaderID, err)
	}
	byOffset := map[uint64]*tenurev1.Record{}
	var line []string
	for _, rec := range resp.Msg.GetRecords() {
		byOffset[rec.GetOffset()] = rec
		if rec.GetEpochStart() {
			line = append(line, fmt.Sprintf("%d:<epoch %d starts>", rec.GetOffset(), rec.GetEpoch()))
		} else {
			line = append(line, fmt.Sprintf("%d:%s", rec.GetOffset(), rec.GetValue()))
		}
	}
	s.say("read from %s, offsets 0..%d (high-water mark %d):", leaderID, resp.Msg.GetHighWaterMark()-1, resp.Msg.GetHighWaterMark())
	for len(line) > 0 {
		k := min(4, len(line))
		s.say("  %s", strings.Join(line[:k], "  "))
		line = line[k:]
	}
	for _, a := range s.acked {
		rec := byOffset[a.offset]
		if rec == nil || string(rec.GetValue()) != a.value {
			return fmt.Errorf("acknowledged record %q at offset %d is not in the log read from %s: an invariant is broken", a.value, a.offset, leaderID)
		}
	}
	s.say("all %d acknowledged records are there, each at the offset it was acknowledged at", len(s.acked))
	if s.inDoubt != nil {
		if rec := byOffset[s.inDoubt.offset]; rec != nil && string(rec.GetValue()) != s.inDoubt.value {
			s.say("offset %d, where the dead leader wrote %q, is the new epoch's: that record was never acknowledged", s.inDoubt.offset, s.inDoubt.value)
		}
	}
	return nil
}

// transition waits for the transition record of epoch.
func (s *story) transition(ctx context.Context, epoch uint64) (*tenurev1.Transition, error) {
	var tr *tenurev1.Transition
	err := waitUntil(ctx, devStepTimeout, fmt.Sprintf("the transition record of epoch %d", epoch), func() bool {
		trs, err := s.listTransitions(ctx)
		for _, t := range trs {
			if t.GetEpoch() == epoch {
				tr = t
			}
		}
		return err == nil && tr != nil
	})
	return tr, err
}

func (s *story) listTransitions(ctx context.Context) ([]*tenurev1.Transition, error) {
	cctx, cancel := context.WithTimeout(ctx, devRPCTimeout)
	defer cancel()
	resp, err := s.c.promoterClient.ListTransitions(cctx, connect.NewRequest(&tenurev1.ListTransitionsRequest{RangeId: s.rangeID}))
	if err != nil {
		return nil, err
	}
	return resp.Msg.GetTransitions(), nil
}

func (s *story) printTransition(ctx context.Context, tr *tenurev1.Transition, killed time.Time, served time.Duration) {
	s.say("epoch %d -> %d: %s leads (reason: %s)", tr.GetPreviousEpoch(), tr.GetEpoch(), tr.GetLeaderId(), tr.GetReason())
	detected := time.UnixMilli(tr.GetStartedUnixMs()).Sub(killed)
	s.say("promotion started %v after the kill and took %v; %s served as leader %v after the kill",
		max(detected, 0).Round(time.Millisecond), usDuration(tr.GetDurationUs()), tr.GetLeaderId(), served.Round(time.Millisecond))
	var candEnd uint64
	for _, r := range tr.GetReplicas() {
		if r.GetReplicaId() == tr.GetLeaderId() {
			candEnd = r.GetLogEnd()
		}
	}
	s.say("committed bound %d: the highest HWM a fenced replica reported (followers learn it a fetch late);", tr.GetCommittedBound())
	s.say("the new leader keeps its whole log up to log end %d, so every acknowledged record survives", candEnd)
	s.say("fence answers (only fenced replicas with a known history count):")
	tw := table.New(s.w, 2)
	fmt.Fprintf(tw, "      REPLICA\tFENCED\tLOG END\tHWM\tLAST EPOCH\tNOTE\n")
	for _, r := range tr.GetReplicas() {
		if !r.GetFenced() {
			fmt.Fprintf(tw, "      %s\tno\t-\t-\t-\t%s\n", r.GetReplicaId(), firstLine(r.GetError()))
			continue
		}
		note := ""
		switch {
		case r.GetReplicaId() == tr.GetLeaderId():
			note = "candidate: the most complete log"
		case !r.GetHistoryKnown():
			note = "history unknown: not counted"
		}
		fmt.Fprintf(tw, "      %s\tyes\t%d\t%d\t%d\t%s\n", r.GetReplicaId(), r.GetLogEnd(), r.GetHighWaterMark(), r.GetLastEpoch(), note)
	}
	tw.Flush()
	if len(tr.GetTruncations()) == 0 {
		s.say("truncations: none (every fenced replica's log is a prefix of the candidate's)")
	}
	for _, t := range tr.GetTruncations() {
		s.say("truncation: %s cut from log end %d to %d (its tail diverged from the candidate's)", t.GetReplicaId(), t.GetFromOffset(), t.GetToOffset())
	}
	var steps []string
	for _, t := range tr.GetTimings() {
		steps = append(steps, fmt.Sprintf("%s %v", t.GetStep(), usDuration(t.GetDurationUs())))
	}
	s.say("step timings: %s", strings.Join(steps, ", "))
	s.say("trace id: %s", traceNote(ctx, tr.GetTraceId()))
}

// traceExportWait bounds how long the story waits for this process's
// exporter to deliver the promotion's spans.
const traceExportWait = 5 * time.Second

// traceNote is the trace id and whether it can be looked up. A trace is
// called exported only once this process's exporter delivered spans of it
// (the promoter's, which start the trace) and none failed: an OTLP
// endpoint nobody listens on used to be reported as exported.
func traceNote(ctx context.Context, id string) string {
	if id == "" {
		return "none (tracing is off: OTEL_SDK_DISABLED)"
	}
	tid, err := trace.TraceIDFromHex(id)
	if err != nil {
		return fmt.Sprintf("%s (not a trace id: %v)", id, err)
	}
	to := "the OTLP endpoint"
	if exp, err := telemetry.ExporterFromEnv(os.Getenv); err == nil && exp.Endpoint != "" {
		to = exp.Endpoint
	}
	cctx, cancel := context.WithTimeout(ctx, traceExportWait)
	defer cancel()
	for {
		te, err := telemetry.Flush(cctx, tid)
		switch {
		case errors.Is(err, telemetry.ErrNoExporter):
			return id + " (not exported: set OTEL_EXPORTER_OTLP_ENDPOINT to a collector to see it; README's compose quickstart sends it to the stack's Jaeger)"
		case te.Failed > 0:
			return fmt.Sprintf("%s (NOT exported: %d of its spans could not be sent to %s: %v)", id, te.Failed, to, te.Err)
		case te.Exported > 0:
			return fmt.Sprintf("%s (exported to %s: 'tenurectl trace %s' draws it from Jaeger and links its page in Jaeger's UI)", id, to, id)
		case err != nil && cctx.Err() == nil:
			return fmt.Sprintf("%s (NOT exported: flushing spans to %s failed: %v)", id, to, err)
		}
		select {
		case <-cctx.Done():
			return fmt.Sprintf("%s (NOT exported: none of its spans reached %s within %v)", id, to, traceExportWait)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitFollower waits until r follows leaderID at epoch and has caught up
// with the leader's log end; it returns that log end.
func (s *story) waitFollower(ctx context.Context, r *devReplica, leaderID string, epoch uint64) (uint64, error) {
	var end uint64
	err := waitUntil(ctx, devStepTimeout, fmt.Sprintf("%s to follow %s at epoch %d and catch up", r.id, leaderID, epoch), func() bool {
		st, err := s.status(ctx, r)
		if err != nil || st.GetRole() != tenurev1.Role_ROLE_FOLLOWER || st.GetLeaderId() != leaderID || st.GetEpoch() != epoch {
			return false
		}
		lst, err := s.status(ctx, s.c.replica(leaderID))
		if err != nil || st.GetLogEnd() != lst.GetLogEnd() {
			return false
		}
		end = st.GetLogEnd()
		return true
	})
	return end, err
}

// historyView is one replica's column in the side-by-side histories.
type historyView struct {
	id, role string
	history  []journal.EpochStart
	logEnd   string
	hwm      string
}

// printHistories prints every replica's epoch history side by side, and
// each one's divergence point against the leader's: the offset below which
// both hold records of the same leaderships. A down replica's history comes
// from its journal file (read only).
func (s *story) printHistories(ctx context.Context, leaderID string) error {
	var views []historyView
	var leader []journal.EpochStart
	for _, r := range s.c.replicas {
		v := historyView{id: r.id}
		if r.cmd == nil {
			v.role, v.logEnd, v.hwm = "down", "?", "?"
			if s.oldLogEnd > 0 {
				v.logEnd = strconv.FormatUint(s.oldLogEnd, 10)
			}
			in, err := journal.Inspect(filepath.Join(r.dataDir, "journal", s.rangeID+".journal"))
			if err != nil {
				return fmt.Errorf("read %s's journal: %w", r.id, err)
			}
			v.history = in.Entries
		} else {
			cctx, cancel := context.WithTimeout(ctx, devRPCTimeout)
			resp, err := replicaClient(s.c.http, r.url()).GetEpochHistory(cctx, connect.NewRequest(&tenurev1.GetEpochHistoryRequest{RangeId: s.rangeID}))
			cancel()
			if err != nil {
				return fmt.Errorf("epoch history of %s: %w", r.id, err)
			}
			st, err := s.status(ctx, r)
			if err != nil {
				return fmt.Errorf("status of %s: %w", r.id, err)
			}
			v.role = strings.ToLower(strings.TrimPrefix(st.GetRole().String(), "ROLE_"))
			v.logEnd, v.hwm = fmt.Sprint(resp.Msg.GetLogEnd()), fmt.Sprint(resp.Msg.GetHighWaterMark())
			for _, e := range resp.Msg.GetHistory() {
				v.history = append(v.history, journal.EpochStart{Epoch: e.GetEpoch(), Start: e.GetStartOffset()})
			}
		}
		if r.id == leaderID {
			leader = v.history
		}
		views = append(views, v)
	}
	writeHistories(s.w, views, leader, leaderID)
	return nil
}

// writeHistories renders views as a table, one column per replica and one
// row per epoch (the start offset of that epoch, or - if the replica never
// wrote under it), then each divergence point against the leader's history.
func writeHistories(w io.Writer, views []historyView, leader []journal.EpochStart, leaderID string) {
	seen := map[uint64]bool{}
	var epochs []uint64
	for _, v := range views {
		for _, e := range v.history {
			if !seen[e.Epoch] {
				seen[e.Epoch] = true
				epochs = append(epochs, e.Epoch)
			}
		}
	}
	slices.Sort(epochs)
	tw := table.New(w, 3)
	fmt.Fprint(tw, "    \t")
	for _, v := range views {
		fmt.Fprintf(tw, "%s (%s)\t", v.id, v.role)
	}
	fmt.Fprintln(tw)
	for _, ep := range epochs {
		fmt.Fprintf(tw, "    epoch %d starts at\t", ep)
		for _, v := range views {
			cell := "-"
			for _, e := range v.history {
				if e.Epoch == ep {
					cell = fmt.Sprint(e.Start)
				}
			}
			fmt.Fprintf(tw, "%s\t", cell)
		}
		fmt.Fprintln(tw)
	}
	for _, row := range []struct {
		name string
		cell func(historyView) string
	}{{"log end", func(v historyView) string { return v.logEnd }}, {"high-water mark", func(v historyView) string { return v.hwm }}} {
		fmt.Fprintf(tw, "    %s\t", row.name)
		for _, v := range views {
			fmt.Fprintf(tw, "%s\t", row.cell(v))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	for _, v := range views {
		if v.id == leaderID {
			continue
		}
		fmt.Fprintf(w, "    %s vs leader %s: %s\n", v.id, leaderID, divergenceText(leader, v.history, v.logEnd))
	}
}

// divergenceText explains the divergence point of a replica's history
// against the leader's.
func divergenceText(leader, h []journal.EpochStart, logEnd string) string {
	p, ok := journal.DivergencePoint(leader, h)
	switch {
	case !ok:
		return "no divergence point (a history is unknown): reconciled by the fetch check alone"
	case p == math.MaxUint64:
		return "identical histories: the same leaderships wrote the same stretches"
	}
	text := fmt.Sprintf("diverge at offset %d: below it both hold the same leaderships' records", p)
	if end, err := strconv.ParseUint(logEnd, 10, 64); err == nil && end > p {
		return text + fmt.Sprintf("; its records %d..%d are another epoch's and are cut when it fetches", p, end-1)
	}
	return text + "; it holds nothing beyond it, so it only catches up"
}

func (s *story) printTransitions(ctx context.Context) error {
	trs, err := s.listTransitions(ctx)
	if err != nil {
		return fmt.Errorf("list transitions: %w", err)
	}
	tw := table.New(s.w, 2)
	fmt.Fprintf(tw, "    EPOCH\tLEADER\tCOMMITTED\tTRUNCATIONS\tDURATION\tREASON\n")
	for _, tr := range trs {
		fmt.Fprintf(tw, "    %d\t%s\t%d\t%d\t%v\t%s\n", tr.GetEpoch(), tr.GetLeaderId(), tr.GetCommittedBound(), len(tr.GetTruncations()), usDuration(tr.GetDurationUs()), firstLine(tr.GetReason()))
	}
	return tw.Flush()
}

func usDuration(us int64) time.Duration {
	d := time.Duration(us) * time.Microsecond
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(100 * time.Microsecond)
	}
	return d
}

func since(t time.Time) time.Duration { return time.Since(t).Round(time.Millisecond) }

// firstLine shortens an error for a table cell.
func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 90 {
		s = s[:87] + "..."
	}
	return s
}

// warnMovedReplicas says which replicas the ranges of a reused data
// directory record at another address than the one they now listen on: the
// ports moved (--base-port, a port taken) or the scheme did (--insecure or
// not). Such a range cannot reach that member until its address is
// recorded again, so the operator is told how, rather than left with
// ranges that never get a leader.
func warnMovedReplicas(ctx context.Context, out io.Writer, c *devCluster) {
	type moved struct{ id, recorded string }
	var order []moved
	ranges := map[moved][]string{}
	after := ""
	for {
		lctx, cancel := context.WithTimeout(ctx, devRPCTimeout)
		resp, err := c.leaseClient.ListRanges(lctx, connect.NewRequest(&tenurev1.ListRangesRequest{AfterRangeId: after}))
		cancel()
		if err != nil {
			fmt.Fprintf(out, "  could not list the ranges to check their replicas' addresses: %v\n", err)
			return
		}
		for _, rg := range resp.Msg.GetRanges() {
			after = rg.GetRangeId()
			for _, m := range rg.GetReplicas() {
				r := c.replica(m.GetId())
				if r == nil || m.GetAddress() == r.url() {
					continue
				}
				k := moved{m.GetId(), m.GetAddress()}
				if ranges[k] == nil {
					order = append(order, k)
				}
				ranges[k] = append(ranges[k], rg.GetRangeId())
			}
		}
		if !resp.Msg.GetMore() {
			break
		}
	}
	for _, k := range order {
		fmt.Fprintf(out, "  %s now listens at %s, but ranges %s record it at %s: run tenure dev with the earlier run's --base-port and --insecure, or 'tenurectl range set-address RANGE %s=%s' for each\n",
			k.id, c.replica(k.id).url(), strings.Join(ranges[k], ", "), k.recorded, k.id, c.replica(k.id).url())
	}
}
