package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

const membershipHelpTail = `
Each step is a promotion of its own (a new epoch, a recorded and traced
transition naming the step), made only while no other membership change is
in flight and only once the current leader's own epoch-start record is
committed. While a step is in flight every promotion needs a fenced quorum of
the voters before it AND of the voters after it, so no acknowledged record
can fall between them. A step whose promotion fails stays in flight: the next
successful promotion completes it, or run the same command again.

Progress is printed as each phase ends; with --json, one JSON object
(ChangeReplicasResponse) per phase, one per line.
`

const addReplicaHelp = `
Add a replica to a range: it joins as a learner (fetches, never counts toward
the HWM, a quorum or the candidate), catches up to within --catch-up-lag
records of the leader's log end, then becomes a voter. The replica's
incarnation (its data directory's id) is recorded with it: an answer from
another disk under the same id never counts.
` + membershipHelpTail

func runRangeAddReplica(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "range add-replica", "RANGE ID=URL [--catch-up-lag N] [--catch-up-timeout D]", addReplicaHelp)
	o := addClusterFlags(e, fs)
	lag, timeout := addCatchUpFlags(fs)
	positional, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(positional) != 2 {
		return usagef("want RANGE and ID=URL, got %d arguments", len(positional))
	}
	add, err := parseReplica("the replica to add", positional[1], o.tls())
	if err != nil {
		return err
	}
	return changeReplicas(ctx, e, o, &tenurev1.ChangeReplicasRequest{RangeId: positional[0], Add: add,
		CatchUpLag: *lag, CatchUpTimeoutMs: timeout.Milliseconds()}, *timeout)
}

const removeReplicaHelp = `
Remove a replica (voter or learner) from a range. The step's promotion fences
it and never adopts it, so it stops serving the range; removing the leader
hands leadership to another voter in the same step. Then the removed replica
drops its copy of the range (best effort: reported if it cannot be reached).
` + membershipHelpTail

func runRangeRemoveReplica(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "range remove-replica", "RANGE ID", removeReplicaHelp)
	o := addClusterFlags(e, fs)
	positional, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(positional) != 2 {
		return usagef("want RANGE and ID, got %d arguments", len(positional))
	}
	return changeReplicas(ctx, e, o, &tenurev1.ChangeReplicasRequest{RangeId: positional[0], RemoveReplicaId: positional[1]}, 0)
}

const replaceReplicaHelp = `
Replace a replica: add the new one (learner, catch-up, voter), then remove
the old one, one step at a time. The range keeps its size but for the time
of the catch-up, when the learner is an extra member that never counts.
` + membershipHelpTail

func runRangeReplaceReplica(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "range replace-replica", "RANGE --remove ID --add ID=URL [--catch-up-lag N] [--catch-up-timeout D]", replaceReplicaHelp)
	o := addClusterFlags(e, fs)
	remove := fs.String("remove", "", "the member to remove (required)")
	addFlag := fs.String("add", "", "the replica to add, ID=URL (required)")
	lag, timeout := addCatchUpFlags(fs)
	positional, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(positional) != 1 {
		return usagef("want exactly one RANGE, got %d arguments", len(positional))
	}
	if *remove == "" || *addFlag == "" {
		return usagef("--remove ID and --add ID=URL are both required")
	}
	add, err := parseReplica("--add", *addFlag, o.tls())
	if err != nil {
		return err
	}
	if add.GetId() == *remove {
		return usagef("--add and --remove name the same replica %s", *remove)
	}
	return changeReplicas(ctx, e, o, &tenurev1.ChangeReplicasRequest{RangeId: positional[0], Add: add, RemoveReplicaId: *remove,
		CatchUpLag: *lag, CatchUpTimeoutMs: timeout.Milliseconds()}, *timeout)
}

func addCatchUpFlags(fs *flag.FlagSet) (*uint64, *time.Duration) {
	lag := fs.Uint64("catch-up-lag", 64, "the learner becomes a voter once at most this many records behind the leader")
	timeout := new(5 * time.Minute)
	fs.Var(durationFlag{d: timeout}, "catch-up-timeout", "how long the learner may take to catch up")
	return lag, timeout
}

// durationFlag is a duration flag that refuses a negative value, and zero
// unless zeroOK, as it is parsed: a usage error, rather than a request the
// server refuses or reads as its default (--catch-up-timeout -1s reached
// the promoter).
type durationFlag struct {
	d      *time.Duration
	zeroOK bool
}

func (f durationFlag) String() string {
	if f.d == nil {
		return ""
	}
	return f.d.String()
}

func (f durationFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return errors.New("want a duration such as 30s or 5m")
	case d < 0 || (d == 0 && !f.zeroOK):
		if f.zeroOK {
			return errors.New("want 0 or a positive duration")
		}
		return errors.New("want a positive duration")
	}
	*f.d = d
	return nil
}

// parseReplica parses one "ID=URL"; what names it in errors.
func parseReplica(what, s string, tls bool) (*tenurev1.Replica, error) {
	rs, err := parseReplicas(what, s, tls)
	if err != nil {
		return nil, err
	}
	if len(rs) != 1 {
		return nil, usagef("%s: %q: want one ID=URL", what, s)
	}
	return rs[0], nil
}

// changeStreamSlack bounds a membership change beyond its catch-up: the
// step promotions and the waits for their epoch-start records.
const changeStreamSlack = 2 * time.Minute

// changeReplicas runs one ChangeReplicas call and prints each phase as it
// arrives.
func changeReplicas(ctx context.Context, e *env, o clusterOpts, req *tenurev1.ChangeReplicasRequest, catchUp time.Duration) error {
	c := newClients(o)
	defer c.close()
	cctx, cancel := context.WithTimeout(ctx, catchUp+changeStreamSlack)
	defer cancel()
	stream, err := c.promoter.ChangeReplicas(cctx, connect.NewRequest(req))
	if err != nil {
		return membershipErr(c, req.GetRangeId(), err)
	}
	defer stream.Close()
	for stream.Receive() {
		msg := stream.Msg()
		if *o.json {
			b, err := protoJSON.Marshal(msg)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "%s\n", b)
			continue
		}
		writePhase(e.stdout, msg)
	}
	if err := stream.Err(); err != nil {
		return membershipErr(c, req.GetRangeId(), err)
	}
	return nil
}

// writePhase prints one phase of a membership change.
func writePhase(w io.Writer, msg *tenurev1.ChangeReplicasResponse) {
	fmt.Fprintf(w, "%-16s %s\n", msg.GetPhase()+":", msg.GetDetail())
	if tr := msg.GetTransition(); tr != nil {
		fmt.Fprintf(w, "%-16s epoch %d -> %d, leader %s, committed bound %d, trace %s\n", "", tr.GetPreviousEpoch(), tr.GetEpoch(),
			tr.GetLeaderId(), tr.GetCommittedBound(), orDash(tr.GetTraceId()))
	}
	if msg.GetDone() {
		fmt.Fprintf(w, "%-16s %s\n", "members:", describeMembership(msg.GetRange()))
	}
}

// describeMembership lists a range's members, learners marked.
func describeMembership(r *tenurev1.RangeInfo) string {
	var parts []string
	for _, m := range r.GetReplicas() {
		s := m.GetId()
		if m.GetLearner() {
			s += " (learner)"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

func membershipErr(c *clients, rangeID string, err error) error {
	if connect.CodeOf(err) == connect.CodeNotFound {
		if missing := c.missingRange(context.Background(), rangeID); missing != nil {
			return missing
		}
	}
	switch connect.CodeOf(err) {
	case connect.CodeFailedPrecondition, connect.CodeInvalidArgument, connect.CodeNotFound:
		return fmt.Errorf("membership change refused: %s", connectMessage(err))
	case connect.CodeDeadlineExceeded:
		return fmt.Errorf("membership change did not finish: %s; 'tenurectl status %s' shows the range", connectMessage(err), rangeID)
	case connect.CodeUnavailable, connect.CodeAborted, connect.CodeDataLoss:
		if connect.IsWireError(err) {
			return fmt.Errorf("membership change did not finish: %s; 'tenurectl status %s' shows the change in flight", connectMessage(err), rangeID)
		}
	}
	return c.promoterErr(err)
}

const rangeDeleteHelp = `
Delete a range: the promoter grants it a new epoch, fences every member at it
(so none acts under an older epoch again), has each drop its copy of the
range, and deletes the range from the lease service. Idempotent: deleting a
range that is already gone succeeds and says so.

A member that cannot be reached keeps its copy; it drops it when it is fenced
for a range created again under the same id (a later generation), and nobody
fences it for the deleted one. A range created again under the id starts
above every epoch the deleted one granted.
`

func runRangeDelete(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "range delete", "RANGE", rangeDeleteHelp)
	o := addClusterFlags(e, fs)
	positional, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(positional) != 1 {
		return usagef("want exactly one RANGE, got %d arguments", len(positional))
	}
	c := newClients(o)
	defer c.close()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := c.promoter.DeleteRange(cctx, connect.NewRequest(&tenurev1.PromoterServiceDeleteRangeRequest{RangeId: positional[0]}))
	if err != nil {
		if connect.CodeOf(err) == connect.CodeFailedPrecondition || connect.CodeOf(err) == connect.CodeInvalidArgument {
			return fmt.Errorf("delete refused: %s", connectMessage(err))
		}
		return c.promoterErr(err)
	}
	if *o.json {
		return writeProtoJSON(e.stdout, resp.Msg)
	}
	if !resp.Msg.GetExisted() {
		fmt.Fprintf(e.stdout, "range %s does not exist (already deleted)\n", positional[0])
		return nil
	}
	fmt.Fprintf(e.stdout, "deleted range %s\n", positional[0])
	fmt.Fprintf(e.stdout, "dropped by:  %s\n", orDash(strings.Join(resp.Msg.GetDropped(), ", ")))
	for _, u := range resp.Msg.GetUnreachable() {
		fmt.Fprintf(e.stdout, "not dropped: %s\n", u)
	}
	return nil
}
