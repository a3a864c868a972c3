package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/internal/table"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

const promoteHelp = `
Ask the elected promoter to promote the range now. It grants the next epoch,
fences every replica (the current leader too) and reads their logs in the
same round trip, picks the leader, truncates diverged replicas, adopts the
new leader and records the transition. The report is printed with the
promotion's trace id.

--to ID (or --preferred ID) is a planned handover: it ends with ID leading,
or fails saying why. The promoter first waits (its --handover-catch-up,
5s by default) until the leader reports ID fetching and holding every
committed record; then it fences the other replicas, so the leader can no
longer commit past ID, then the leader and ID, and promotes ID. Appends
the old leader had accepted but not acknowledged may be cut (their clients
saw no acknowledgement and retry); no acknowledged record is ever lost.
It is refused, with nothing changed, when ID is not a voter, does not
answer, or is not caught up in time (a live ID that does not host the range
yet, having been down when it was made, is brought in meanwhile). If the
fence finds ID short after all, the most complete log leads (the
transition's handover_refused says why) and the promoter tries again, at
most 3 promotions in all. Without --to the most complete log leads. When
ID already leads the range with a live lease, nothing is done (and that is
said); --force promotes anyway, at a new epoch.

--unsafe-accept-data-loss is for a range whose quorum is gone for good (the
disks of a majority are lost). It fences whatever answers and leads from the
most complete surviving log without a quorum: records acknowledged beyond
that log are lost. The report names the offsets that may have been
acknowledged and are not on the new leader ([possibly lost from, highest HWM
seen)). The promoter never does this on its own, and with the flag it
still promotes safely where it can: a range with a quorum answering gets an
ordinary promotion, nothing lost and nothing counted unsafe. With it, --to only
prefers a replica among the most complete survivors: nothing waits for a
catch-up when a quorum is gone.
`

func runPromote(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "promote", "RANGE [--to ID [--force]] [--reason TEXT] [--unsafe-accept-data-loss [--to ID]]", promoteHelp)
	o := addClusterFlags(e, fs)
	preferred := fs.String("preferred", "", "the same as --to")
	reason := fs.String("reason", "", `why, recorded in the transition (default "operator request")`)
	unsafe := fs.Bool("unsafe-accept-data-loss", false, "promote without a quorum, from the most complete surviving log: acknowledged records beyond it are LOST")
	to := fs.String("to", "", "planned handover: the replica to lead, once it holds every committed record (refused, naming why, when it cannot); with --unsafe-accept-data-loss only preferred among the most complete survivors")
	force := fs.Bool("force", false, "promote even when --to already leads the range (a new epoch for the same leader)")
	positional, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(positional) != 1 {
		return usagef("want exactly one RANGE, got %d arguments", len(positional))
	}
	if *to == "" && setFlag(fs, "to") {
		// An empty --to (an unset shell variable) ran an ordinary
		// promotion that moved the lease to whichever replica it chose.
		return usagef("--to needs a replica id")
	}
	if *to != "" {
		if *preferred != "" && *preferred != *to {
			return usagef("--to %s and --preferred %s disagree", *to, *preferred)
		}
		*preferred = *to
	}
	c := newClients(o)
	defer c.close()
	resp, err := promote(ctx, c, &tenurev1.PromoteRequest{RangeId: positional[0], PreferredReplicaId: *preferred, Reason: *reason, UnsafeAcceptDataLoss: *unsafe, Force: *force})
	if err != nil {
		if connect.CodeOf(err) == connect.CodeNotFound {
			if missing := c.missingRange(ctx, positional[0]); missing != nil {
				return missing
			}
		}
		switch connect.CodeOf(err) {
		case connect.CodeFailedPrecondition, connect.CodeInvalidArgument, connect.CodeNotFound:
			return fmt.Errorf("promotion refused: %s", connectMessage(err))
		case connect.CodeUnavailable:
			// Only the promoter's own answer: a connection this client
			// could not make or keep (a dial, a TLS mismatch) is explained
			// by promoterErr.
			if connect.IsWireError(err) {
				return fmt.Errorf("promotion did not complete: %s; the promoter retries failed promotions itself, 'tenurectl status %s' shows the range", connectMessage(err), positional[0])
			}
		case connect.CodeDataLoss:
			return fmt.Errorf("promotion stopped to protect committed records: %s\nThis means two replicas disagree about a committed record (a bug or a damaged disk); nothing was truncated. 'tenurectl epochs %s' shows the histories", connectMessage(err), positional[0])
		}
		return c.promoterErr(err)
	}
	if id := resp.Msg.GetAlreadyLeaderId(); id != "" {
		if *o.json {
			return writeProtoJSON(e.stdout, resp.Msg)
		}
		fmt.Fprintf(e.stdout, "%s already leads range %s at epoch %d; nothing done (--force to promote anyway)\n", id, positional[0], resp.Msg.GetAlreadyLeaderEpoch())
		return nil
	}
	tr := resp.Msg.GetTransition()
	if *o.json {
		return writeProtoJSON(e.stdout, tr)
	}
	writeTransition(e.stdout, tr)
	return nil
}

// promoteBusyWait bounds how long promote waits for another promotion of
// the same range (the promoter's own, say) to finish before running its own.
const promoteBusyWait = 10 * time.Second

// promote asks for a promotion. The promoter runs one promotion of a range
// at a time and refuses a second with Unavailable ("already running")
// before doing anything, so that refusal is safe to retry.
func promote(ctx context.Context, c *clients, req *tenurev1.PromoteRequest) (*connect.Response[tenurev1.PromoteResponse], error) {
	deadline := time.Now().Add(promoteBusyWait)
	for {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		resp, err := c.promoter.Promote(cctx, connect.NewRequest(req))
		cancel()
		busy := connect.CodeOf(err) == connect.CodeUnavailable && strings.Contains(err.Error(), "already running")
		if !busy || time.Now().After(deadline) {
			return resp, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// writeTransition prints one transition record in full.
func writeTransition(w io.Writer, tr *tenurev1.Transition) {
	if tr.GetUnsafe() {
		// First and loud: this is what the operator accepted.
		lost := tr.GetHighestHwmSeen() - min(tr.GetPossiblyLostFrom(), tr.GetHighestHwmSeen())
		if lost > 0 {
			fmt.Fprintf(w, "UNSAFE PROMOTION: offsets %d to %d (%s) may have been acknowledged and are NOT on the new leader\n",
				tr.GetPossiblyLostFrom(), tr.GetHighestHwmSeen()-1, plural(int(lost), "record"))
		} else {
			fmt.Fprintf(w, "UNSAFE PROMOTION: no acknowledged record is known to be lost (highest HWM seen %d)\n", tr.GetHighestHwmSeen())
		}
	}
	fmt.Fprintf(w, "range %s: epoch %d -> %d, leader %s (%s)\n", tr.GetRangeId(), tr.GetPreviousEpoch(), tr.GetEpoch(), tr.GetLeaderId(), tr.GetLeaderAddress())
	fmt.Fprintf(w, "reason:          %s\n", tr.GetReason())
	if to := tr.GetHandoverTo(); to != "" && tr.GetHandoverRefused() != "" {
		fmt.Fprintf(w, "handover to %s did not land: %s\n", to, tr.GetHandoverRefused())
	}
	if s := tr.GetMembershipStep(); s != "" {
		fmt.Fprintf(w, "membership step: %s\n", s)
	}
	fmt.Fprintf(w, "promoter:        %s, started %s, took %v\n", tr.GetPromoterId(), time.UnixMilli(tr.GetStartedUnixMs()).UTC().Format("2006-01-02 15:04:05.000Z"), micros(tr.GetDurationUs()))
	fmt.Fprintf(w, "committed bound: %d (the highest HWM a fenced replica reported)\n", tr.GetCommittedBound())
	trace := tr.GetTraceId()
	if trace == "" {
		trace = "none (the promoter exports no traces)"
	}
	fmt.Fprintf(w, "trace id:        %s\n", trace)
	fmt.Fprintln(w, "fence answers:")
	tw := table.New(w, 2)
	fmt.Fprintf(tw, "  REPLICA\tFENCED\tHISTORY\tLOG END\tHWM\tLAST EPOCH\tNOTE\n")
	for _, r := range tr.GetReplicas() {
		if !r.GetFenced() {
			fmt.Fprintf(tw, "  %s\tno\t-\t-\t-\t-\t%s\n", r.GetReplicaId(), oneLine(r.GetError()))
			continue
		}
		hist, note := "known", ""
		if !r.GetHistoryKnown() {
			hist = "unknown"
		}
		switch {
		case r.GetReplicaId() == tr.GetLeaderId():
			note = "new leader"
		case r.GetLearner():
			note = "learner (not counted)"
		case r.GetHalted() != "":
			note = "HALTED, not counted, not adopted: " + oneLine(r.GetHalted())
		case !r.GetCounted() && r.GetError() != "":
			note = "not counted: " + oneLine(r.GetError())
		}
		fmt.Fprintf(tw, "  %s\tyes\t%s\t%d\t%d\t%d\t%s\n", r.GetReplicaId(), hist, r.GetLogEnd(), r.GetHighWaterMark(), r.GetLastEpoch(), note)
	}
	tw.Flush()
	if len(tr.GetTruncations()) == 0 {
		fmt.Fprintln(w, "truncations:     none")
	} else {
		fmt.Fprintln(w, "truncations:")
		for _, t := range tr.GetTruncations() {
			fmt.Fprintf(w, "  %s: log end %d -> %d (%s removed)\n", t.GetReplicaId(), t.GetFromOffset(), t.GetToOffset(), plural(int(t.GetFromOffset()-t.GetToOffset()), "record"))
		}
	}
	var steps []string
	for _, s := range tr.GetTimings() {
		steps = append(steps, fmt.Sprintf("%s %v", s.GetStep(), micros(s.GetDurationUs())))
	}
	fmt.Fprintf(w, "timings:         %s\n", strings.Join(steps, ", "))
}

func oneLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 100 {
		s = s[:97] + "..."
	}
	return s
}

const transitionsHelp = `
List a range's leadership-transition records, newest first: each promotion's
epoch, new leader, committed bound, truncations, duration, reason and trace
id. --verbose prints each record in full (every replica's fence answer and
the step timings).
`

func runTransitions(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "transitions", "RANGE [--limit N] [--verbose]", transitionsHelp)
	o := addClusterFlags(e, fs)
	limit := fs.Uint("limit", 20, "at most this many, newest first (1-1000)")
	verbose := fs.Bool("verbose", false, "print every record in full")
	positional, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(positional) != 1 {
		return usagef("want exactly one RANGE, got %d arguments", len(positional))
	}
	if *limit < 1 || *limit > 1000 {
		return usagef("--limit %d: want 1 to 1000", *limit)
	}
	c := newClients(o)
	defer c.close()
	cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	resp, err := c.promoter.ListTransitions(cctx, connect.NewRequest(&tenurev1.ListTransitionsRequest{RangeId: positional[0], Limit: uint32(*limit)}))
	if err != nil {
		if connect.CodeOf(err) == connect.CodeInvalidArgument {
			return usagef("%s", connectMessage(err))
		}
		return c.promoterErr(err)
	}
	trs := resp.Msg.GetTransitions()
	if len(trs) == 0 {
		// No records is also what the promoter answers for no range.
		if missing := c.missingRange(ctx, positional[0]); missing != nil {
			return missing
		}
	}
	if *o.json {
		return writeProtoJSONList(e.stdout, trs)
	}
	if len(trs) == 0 {
		fmt.Fprintf(e.stdout, "no transitions recorded for range %s (it has never had a leader)\n", positional[0])
		return nil
	}
	if *verbose {
		for i, tr := range trs {
			if i > 0 {
				fmt.Fprintln(e.stdout)
			}
			writeTransition(e.stdout, tr)
		}
		return nil
	}
	tw := table.New(e.stdout, 2)
	fmt.Fprintf(tw, "EPOCH\tLEADER\tCOMMITTED\tTRUNCATED\tDURATION\tSTARTED\tTRACE\tREASON\n")
	for _, tr := range trs {
		var cut []string
		for _, t := range tr.GetTruncations() {
			cut = append(cut, fmt.Sprintf("%s:%d->%d", t.GetReplicaId(), t.GetFromOffset(), t.GetToOffset()))
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%v\t%s\t%s\t%s\n", tr.GetEpoch(), tr.GetLeaderId(), tr.GetCommittedBound(),
			orDash(strings.Join(cut, " ")), micros(tr.GetDurationUs()),
			time.UnixMilli(tr.GetStartedUnixMs()).UTC().Format("15:04:05.000"), orDash(tr.GetTraceId()), oneLine(tr.GetReason()))
	}
	return tw.Flush()
}
