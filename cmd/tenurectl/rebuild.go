package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

const rangeRebuildHelp = `
Rebuild one replica's copy of a range from its peers: for a copy the replica
quarantined (its stored data failed its checks at startup: 'tenurectl status'
shows the range HALTED on that replica, "quarantined"), or any halted copy.
Two membership changes, each the existing one:

  1. remove-replica: the replica leaves the range (the step's promotion
     counts only the other members; a quarantined copy answers no fence, so
     it was never counted anyway) and drops its copy of the range;
  2. add-replica: the same replica, with its same data directory, joins
     again as a learner, which fetches the whole log from the leader and
     never counts toward the HWM, a quorum or the candidate, catches up to
     within --catch-up-lag records, and only then becomes a voter.

Between the two the replica is no member, so at no moment does it count as a
voter with an empty log. The range has one member fewer until the learner
catches up: with three voters it then needs both others for every commit.

Refused unless the replica answers and its copy of the range is halted,
lost (its disk was replaced or wiped: status shows it "lost", INCARNATION
MISMATCH) or already dropped (a healthy copy is a working voter: --force
rebuilds it anyway). Re-run the same command after a failure: it goes on from where it
stopped (a removal done, a learner still catching up). After the removal the
range no longer lists the replica's address: give it as --replica ID=URL.

Progress is printed as each phase ends; with --json, one JSON object
(ChangeReplicasResponse) per phase, one per line.
`

// runRangeRebuild is remove then add of the same replica, through the
// promoter's ChangeReplicas (which refuses one call naming the same id to
// add and to remove). Why the emptied copy never counts as a voter: between
// the steps the replica is no member, so a fence cannot host the range on
// it (the replica asks the lease service first); after the add it is a
// learner, which no promotion counts, until its catch-up. A promotion at an
// epoch older than the removal's, which still lists it as a voter, could
// fence the emptied copy, but cannot reach a quorum: the removal's own
// promotion fenced a quorum of the old voters other than this replica (its
// halted copy answered none) at a higher epoch, and they refuse the older
// one, leaving fewer than a quorum to it with the emptied copy.
func runRangeRebuild(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "range rebuild", "RANGE --replica ID[=URL] [--force] [--catch-up-lag N] [--catch-up-timeout D]", rangeRebuildHelp)
	o := addClusterFlags(e, fs)
	replicaFlag := fs.String("replica", "", "the replica whose copy to rebuild, ID or ID=URL (required; the URL only once it is no longer a member)")
	force := fs.Bool("force", false, "rebuild even a copy that is not halted (a working voter)")
	lag, timeout := addCatchUpFlags(fs)
	positional, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(positional) != 1 {
		return usagef("want exactly one RANGE, got %d arguments", len(positional))
	}
	if *replicaFlag == "" {
		return usagef("--replica ID is required")
	}
	rangeID := positional[0]
	var target *tenurev1.Replica
	if strings.Contains(*replicaFlag, "=") {
		if target, err = parseReplica("--replica", *replicaFlag, o.tls()); err != nil {
			return err
		}
	} else {
		target = &tenurev1.Replica{Id: *replicaFlag}
	}

	c := newClients(o)
	rng, err := c.getRange(ctx, rangeID)
	if err != nil {
		c.close()
		return err
	}
	m := member(rng, target.GetId())
	if target.GetAddress() == "" {
		if m == nil {
			c.close()
			return fmt.Errorf("replica %s is not a member of range %s; if an earlier rebuild removed it, give its address: --replica %s=URL", target.GetId(), rangeID, target.GetId())
		}
		target.Address = m.GetAddress()
	}
	hosted, halted, err := c.copyState(ctx, target, rangeID)
	c.close()
	if err != nil {
		return err
	}
	if hosted && halted == "" && !*force && (m == nil || !m.GetLearner()) {
		return fmt.Errorf("replica %s's copy of range %s is not halted: it is a working member, and rebuilding it would take it out of the range until it catches up again; pass --force to rebuild it anyway", target.GetId(), rangeID)
	}
	if halted != "" {
		fmt.Fprintf(e.stderr, "replica %s's copy of range %s: %s\n", target.GetId(), rangeID, halted)
	}

	remove := &tenurev1.ChangeReplicasRequest{RangeId: rangeID, RemoveReplicaId: target.GetId()}
	switch {
	case m != nil && (!m.GetLearner() || halted != ""):
		// Step 1: remove it; the removal drops its copy.
		if err := changeReplicas(ctx, e, o, remove, 0); err != nil {
			return err
		}
	case m == nil && hosted && halted != "":
		// An earlier run removed it but its drop did not reach it. Only
		// the promoter drops a copy, and only a member's: make it a
		// member again, a learner (it never counts, and cannot even
		// start its catch-up: the halted copy answers no fence), then
		// remove it again, which drops the copy.
		fmt.Fprintf(e.stderr, "replica %s is no member of range %s but still holds its halted copy: adding it as a learner and removing it again, to drop the copy\n", target.GetId(), rangeID)
		err := changeReplicas(ctx, e, o, &tenurev1.ChangeReplicasRequest{RangeId: rangeID,
			Add: &tenurev1.Replica{Id: target.GetId(), Address: target.GetAddress()}, CatchUpTimeoutMs: 1000}, time.Second)
		if err != nil && !strings.Contains(err.Error(), "did not catch up") {
			return err
		}
		if err := changeReplicas(ctx, e, o, remove, 0); err != nil {
			return err
		}
	}
	c = newClients(o)
	hosted, halted, err = c.copyState(ctx, target, rangeID)
	c.close()
	if err != nil {
		return err
	}
	if hosted && halted != "" {
		// The removal's drop did not reach it. Adding it back now would
		// only stall: a halted copy answers no fence.
		return fmt.Errorf("replica %s was removed from range %s but still holds its halted copy (the drop did not reach it); re-run once it answers: tenurectl range rebuild %s --replica %s=%s",
			target.GetId(), rangeID, rangeID, target.GetId(), target.GetAddress())
	}
	// Step 2: add it back: learner, catch-up, voter.
	return changeReplicas(ctx, e, o, &tenurev1.ChangeReplicasRequest{RangeId: rangeID,
		Add:        &tenurev1.Replica{Id: target.GetId(), Address: target.GetAddress()},
		CatchUpLag: *lag, CatchUpTimeoutMs: timeout.Milliseconds()}, *timeout)
}

// member returns rng's member id, or nil.
func member(rng *tenurev1.RangeInfo, id string) *tenurev1.Replica {
	for _, r := range rng.GetReplicas() {
		if r.GetId() == id {
			return r
		}
	}
	return nil
}

// copyState asks replica r about its copy of rangeID: whether it hosts
// one, and why it is halted ("" when it is not). A copy the replica lost
// (its disk replaced or wiped) is not hosted, and halted says it is lost.
func (c *clients) copyState(ctx context.Context, r *tenurev1.Replica, rangeID string) (hosted bool, halted string, err error) {
	cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	resp, err := c.replica(r.GetAddress()).GetStatus(cctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: rangeID}))
	if connect.CodeOf(err) == connect.CodeNotFound {
		return false, "", nil
	}
	if err != nil {
		return false, "", fmt.Errorf("replica %s at %s does not answer (%v): the rebuild drops its copy, so it must be up", r.GetId(), r.GetAddress(), connectMessage(err))
	}
	if got := resp.Msg.GetReplicaId(); got != "" && got != r.GetId() {
		return false, "", fmt.Errorf("the replica at %s is %s, not %s", r.GetAddress(), got, r.GetId())
	}
	if l := lostRange(resp.Msg, rangeID); l != nil && len(resp.Msg.GetRanges()) == 0 {
		// Its disk lost the range (replaced or wiped: a fence named the
		// member's incarnation, not this one): it hosts nothing of it, like
		// a dropped copy, and the rebuild is what brings it back.
		return false, fmt.Sprintf("lost: its disk was replaced or wiped (the member is incarnation %s, the replica is %s); nothing of the range is left on it", orDash(l.GetMemberIncarnation()), orDash(resp.Msg.GetIncarnation())), nil
	}
	if len(resp.Msg.GetRanges()) != 1 {
		return false, "", fmt.Errorf("replica %s answered its status of range %s with %d ranges, want one", r.GetId(), rangeID, len(resp.Msg.GetRanges()))
	}
	return true, resp.Msg.GetRanges()[0].GetHalted(), nil
}
