package lease

import (
	"context"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// This file holds membership changes (docs/design.md "Leases and failure
// detection": range membership is kept here). A replica set changes one
// replica at a time, and each change stays "in flight" (membersRecord.Change,
// with the voters before it) until the promoter completes it: while it is in
// flight a promotion needs a fenced quorum of the old voters and of the new.
// One step at a time keeps every quorum of the old set intersecting every
// quorum of the new; the in-flight record makes a promotion that runs before
// the new set has taken effect safe whichever set committed a record.

// applyStep returns the members after one step, or why the step does not
// apply to cur. It is pure: the caller compares and swaps.
func applyStep(cur membersRecord, step tenurev1.MembershipStep, r *tenurev1.Replica) (membersRecord, error) {
	id := r.GetId()
	if err := wire.ValidateReplicaID(id); err != nil {
		return cur, invalidf("%v", err)
	}
	if inc := r.GetIncarnation(); inc != "" {
		if err := validateIncarnation(inc); err != nil {
			return cur, err
		}
	}
	i := slices.IndexFunc(cur.Replicas, func(x replicaRecord) bool { return x.ID == id })
	next := cur
	next.Replicas = slices.Clone(cur.Replicas)
	switch step {
	case tenurev1.MembershipStep_MEMBERSHIP_STEP_ADD_LEARNER:
		if i >= 0 {
			return cur, failedf("replica %s is already a member", id)
		}
		if r.GetAddress() == "" {
			return cur, invalidf("replica %s: an address is needed to add it", id)
		}
		if err := wire.ValidateAddress(r.GetAddress()); err != nil {
			return cur, invalidf("replica %s: %v", id, err)
		}
		if len(cur.Replicas)+1 > wire.MaxReplicas {
			return cur, failedf("a range has at most %d members", wire.MaxReplicas)
		}
		// A new member always starts as a learner: it counts for nothing
		// until it holds the log, so adding it cannot make a quorum that
		// lacks committed records.
		next.Replicas = append(next.Replicas, replicaRecord{ID: id, Address: r.GetAddress(), Incarnation: r.GetIncarnation(), Learner: true})
	case tenurev1.MembershipStep_MEMBERSHIP_STEP_PROMOTE_LEARNER:
		if i < 0 {
			return cur, failedf("replica %s is not a member", id)
		}
		if !cur.Replicas[i].Learner {
			return cur, failedf("replica %s is already a voter", id)
		}
		next.Replicas[i].Learner = false
	case tenurev1.MembershipStep_MEMBERSHIP_STEP_REMOVE:
		if i < 0 {
			return cur, failedf("replica %s is not a member", id)
		}
		if !cur.Replicas[i].Learner && cur.voters() == 1 {
			return cur, failedf("replica %s is the range's only voter; add another before removing it", id)
		}
		next.Replicas = slices.Delete(next.Replicas, i, i+1)
		if next.PreferredReplicaID == id {
			next.PreferredReplicaID = ""
		}
	case tenurev1.MembershipStep_MEMBERSHIP_STEP_SET_INCARNATION:
		if i < 0 {
			return cur, failedf("replica %s is not a member", id)
		}
		inc := r.GetIncarnation()
		if inc == "" {
			return cur, invalidf("replica %s: set-incarnation needs an incarnation", id)
		}
		switch have := cur.Replicas[i].Incarnation; {
		case have == inc:
			// A retry, or a second promoter recording the same answer.
		case have != "":
			// Never replaced: a member with another disk is not the member.
			return cur, failedf("replica %s already has incarnation %s recorded, not %s: a replaced disk comes back only by removing and adding the replica again", id, have, inc)
		}
		next.Replicas[i].Incarnation = inc
	default:
		return cur, invalidf("unknown membership step %v", step)
	}
	return next, nil
}

// voters counts the members that are not learners.
func (m membersRecord) voters() int {
	n := 0
	for _, r := range m.Replicas {
		if !r.Learner {
			n++
		}
	}
	return n
}

func (s *Service) changeMembership(ctx context.Context, req *tenurev1.ChangeMembershipRequest) (*tenurev1.ChangeMembershipResponse, error) {
	step := req.GetStep()
	info, err := s.swapMembers(ctx, req.GetRangeId(), req.GetExpectedRevision(), func(cur membersRecord, epoch uint64) (membersRecord, error) {
		if step != tenurev1.MembershipStep_MEMBERSHIP_STEP_SET_INCARNATION && cur.Change != nil {
			// One change at a time: a second step before the first took
			// effect could move the voters two replicas away from a set
			// some promotion still needs a quorum of.
			return cur, failedf("a membership change is in flight (%s %s since epoch %d); it must complete first",
				stepName(cur.Change.Step), cur.Change.ReplicaID, cur.Change.Epoch)
		}
		next, err := applyStep(cur, step, req.GetReplica())
		if err != nil {
			return cur, err
		}
		if step != tenurev1.MembershipStep_MEMBERSHIP_STEP_SET_INCARNATION {
			next.Change = &changeRecord{
				Step: step, ReplicaID: req.GetReplica().GetId(), Old: cur.Replicas,
				Epoch: epoch, StartedUnixMs: time.Now().UnixMilli(),
			}
		}
		return next, nil
	})
	if err != nil {
		return nil, err
	}
	return &tenurev1.ChangeMembershipResponse{Range: info}, nil
}

func (s *Service) completeMembershipChange(ctx context.Context, req *tenurev1.CompleteMembershipChangeRequest) (*tenurev1.CompleteMembershipChangeResponse, error) {
	info, err := s.swapMembers(ctx, req.GetRangeId(), req.GetExpectedRevision(), func(cur membersRecord, epoch uint64) (membersRecord, error) {
		if cur.Change == nil {
			return cur, failedf("no membership change is in flight")
		}
		if epoch <= cur.Change.Epoch {
			// The new set takes effect only with a leader adopted under it,
			// at an epoch granted after the step.
			return cur, failedf("the change %s %s was made at epoch %d and the range is still at epoch %d: it has not taken effect",
				stepName(cur.Change.Step), cur.Change.ReplicaID, cur.Change.Epoch, epoch)
		}
		next := cur
		next.Change = nil
		return next, nil
	})
	if err != nil {
		return nil, err
	}
	return &tenurev1.CompleteMembershipChangeResponse{Range: info}, nil
}

// swapMembers reads a range's members and epoch, applies change to them, and
// writes the result by compare-and-swap on the members' revision (Aborted if
// it moved since expected, or since the read).
func (s *Service) swapMembers(ctx context.Context, id string, expected int64, change func(cur membersRecord, epoch uint64) (membersRecord, error)) (*tenurev1.RangeInfo, error) {
	if err := wire.ValidateRangeID(id); err != nil {
		return nil, err
	}
	if expected <= 0 {
		return nil, invalidf("expected_revision %d: pass the membership_revision read from GetRange", expected)
	}
	snap, err := s.readRange(ctx, id)
	if err != nil {
		return nil, err
	}
	if snap.members == nil {
		return nil, rangeNotFound(id)
	}
	if snap.members.ModRevision != expected {
		return nil, abortedf("range %q: membership revision is now %d, not %d; re-read and retry", id, snap.members.ModRevision, expected)
	}
	cur, err := decodeMembers(string(snap.members.Key), snap.members.Value)
	if err != nil {
		return nil, err
	}
	var epoch uint64
	if snap.epoch != nil {
		if epoch, err = parseEpoch(string(snap.epoch.Key), snap.epoch.Value); err != nil {
			return nil, err
		}
	}
	next, err := change(cur, epoch)
	if err != nil {
		return nil, err
	}
	return s.putMembers(ctx, id, expected, next)
}

// putMembers writes next if the members key's revision is still expected,
// and answers the range as written.
func (s *Service) putMembers(ctx context.Context, id string, expected int64, next membersRecord) (*tenurev1.RangeInfo, error) {
	if err := wire.ValidateReplicas(next.proto()); err != nil {
		return nil, err
	}
	resp, err := s.kv.Txn(ctx).If(
		// The membership revision is the members key's mod revision, so this
		// compare is exactly "nobody changed the set since the caller read it".
		clientv3.Compare(clientv3.ModRevision(s.keys.members(id)), "=", expected),
	).Then(
		clientv3.OpPut(s.keys.members(id), mustJSON(next)),
		clientv3.OpGet(s.keys.members(id)),
		clientv3.OpGet(s.keys.epoch(id)),
		clientv3.OpGet(s.keys.lease(id)),
		clientv3.OpGet(s.keys.retention(id)),
	).Else(
		clientv3.OpGet(s.keys.members(id)),
	).Commit()
	if err != nil {
		return nil, err
	}
	if !resp.Succeeded {
		now := txnKV(resp, 0)
		if now == nil {
			return nil, rangeNotFound(id)
		}
		return nil, abortedf("range %q: membership revision is now %d, not %d; re-read and retry", id, now.ModRevision, expected)
	}
	return s.rangeInfo(ctx, id, rangeSnap{members: txnKV(resp, 1), epoch: txnKV(resp, 2), lease: txnKV(resp, 3), retention: txnKV(resp, 4)}, ttlCache{})
}

// deleteRange removes the range's members, lease and retention keys. The epoch key
// stays as a tombstone: CreateRange of the same id continues from it, so no
// epoch of the new range equals one of the old, and a replica still holding
// the old data (it missed the delete) is fenced for the new range at an epoch
// above everything it holds, with a generation above the one it stored, and
// drops the old data instead of offering it as a log.
func (s *Service) deleteRange(ctx context.Context, req *tenurev1.DeleteRangeRequest) (*tenurev1.DeleteRangeResponse, error) {
	id := req.GetRangeId()
	if err := wire.ValidateRangeID(id); err != nil {
		return nil, err
	}
	resp, err := s.kv.Txn(ctx).Then(
		clientv3.OpDelete(s.keys.members(id)),
		clientv3.OpDelete(s.keys.lease(id)),
		clientv3.OpDelete(s.keys.retention(id)),
	).Commit()
	if err != nil {
		return nil, err
	}
	existed := resp.Responses[0].GetResponseDeleteRange().GetDeleted() > 0
	return &tenurev1.DeleteRangeResponse{Existed: existed}, nil
}

// setReplicas changes members' addresses and nothing else. A raw overwrite
// of the set ({r1,r2,r3} -> {r1,r2,r4} in one step) made the quorums before
// and after it disjoint: a promotion fencing {r2, r4} then led from r2 and
// lost what {r1, r3} had acknowledged. Who the members are changes only one
// step at a time, through ChangeMembership.
func (s *Service) setReplicas(ctx context.Context, req *tenurev1.SetReplicasRequest) (*tenurev1.SetReplicasResponse, error) {
	if err := wire.ValidateReplicas(req.GetReplicas()); err != nil {
		return nil, err
	}
	if err := wire.ValidateAddresses(req.GetReplicas()); err != nil {
		return nil, err
	}
	info, err := s.swapMembers(ctx, req.GetRangeId(), req.GetExpectedRevision(), func(cur membersRecord, _ uint64) (membersRecord, error) {
		want := req.GetReplicas()
		if err := sameMembers(cur, want); err != nil {
			return cur, err
		}
		next := cur
		next.Replicas = slices.Clone(cur.Replicas)
		for i := range next.Replicas {
			for _, w := range want {
				if w.GetId() == next.Replicas[i].ID {
					next.Replicas[i].Address = w.GetAddress()
				}
			}
		}
		return next, nil
	})
	if err != nil {
		return nil, err
	}
	return &tenurev1.SetReplicasResponse{Range: info}, nil
}

// sameMembers reports, as a FailedPrecondition, how want differs from cur in
// anything but addresses.
func sameMembers(cur membersRecord, want []*tenurev1.Replica) error {
	byID := make(map[string]replicaRecord, len(cur.Replicas))
	for _, r := range cur.Replicas {
		byID[r.ID] = r
	}
	refuse := func(format string, args ...any) error {
		return failedf("SetReplicas changes members' addresses only: %s; change membership one replica at a time with `tenurectl range add-replica/remove-replica/replace-replica`", fmt.Sprintf(format, args...))
	}
	if len(want) != len(cur.Replicas) {
		return refuse("the set has %d members, the request names %d", len(cur.Replicas), len(want))
	}
	for _, w := range want {
		have, ok := byID[w.GetId()]
		switch {
		case !ok:
			return refuse("%s is not a member", w.GetId())
		case w.GetLearner() != have.Learner:
			return refuse("%s's role would change", w.GetId())
		case w.GetIncarnation() != "" && w.GetIncarnation() != have.Incarnation:
			return refuse("%s's incarnation would change", w.GetId())
		}
	}
	return nil
}

// changeRecord is a membership step in flight, as stored.
type changeRecord struct {
	Step          tenurev1.MembershipStep `json:"step"`
	ReplicaID     string                  `json:"replica_id"`
	Old           []replicaRecord         `json:"old_replicas"`
	Epoch         uint64                  `json:"epoch"`
	StartedUnixMs int64                   `json:"started_unix_ms"`
}

func (c *changeRecord) proto() *tenurev1.MembershipChange {
	if c == nil {
		return nil
	}
	return &tenurev1.MembershipChange{
		Step: c.Step, ReplicaId: c.ReplicaID, OldReplicas: membersRecord{Replicas: c.Old}.proto(),
		Epoch: c.Epoch, StartedUnixMs: c.StartedUnixMs,
	}
}

// stepName is a step as people read it: "add-learner".
func stepName(s tenurev1.MembershipStep) string {
	switch s {
	case tenurev1.MembershipStep_MEMBERSHIP_STEP_ADD_LEARNER:
		return "add-learner"
	case tenurev1.MembershipStep_MEMBERSHIP_STEP_PROMOTE_LEARNER:
		return "promote-learner"
	case tenurev1.MembershipStep_MEMBERSHIP_STEP_REMOVE:
		return "remove"
	case tenurev1.MembershipStep_MEMBERSHIP_STEP_SET_INCARNATION:
		return "set-incarnation"
	}
	return s.String()
}

// validateIncarnation checks an incarnation's shape: 32 lowercase hex digits.
func validateIncarnation(inc string) error {
	if len(inc) != 32 {
		return invalidf("incarnation %q: want 32 hex digits", inc)
	}
	for _, c := range inc {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return invalidf("incarnation %q: want 32 lowercase hex digits", inc)
		}
	}
	return nil
}

// membersInfo fills a RangeInfo's membership fields from the members key.
func membersInfo(info *tenurev1.RangeInfo, m membersRecord, kv *mvccpb.KeyValue) {
	info.Replicas = m.proto()
	info.MembershipRevision = kv.ModRevision
	info.PreferredReplicaId = m.PreferredReplicaID
	info.Change = m.Change.proto()
	// The create revision changes only when the range is deleted and
	// created again: it is the range's generation.
	info.Generation = uint64(kv.CreateRevision)
}
