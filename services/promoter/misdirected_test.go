package promoter

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// An address that reaches another replica (a restarted container back at
// an address another replica had) must not let one replica's fence answer
// count as two members toward the quorum. Here r3's listed address is r2's:
// with r1 down only r2 can answer, so no quorum of two may form.
func TestFenceAnswerFromTheWrongReplicaDoesNotCount(t *testing.T) {
	c := newCluster(t, 3)
	members := c.members()
	members[2].Address = members[1].Address // "r3" is reached at r2's address
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const rangeID = "misdirected"
	if _, err := c.lease.Client.CreateRange(ctx, connect.NewRequest(&tenurev1.CreateRangeRequest{RangeId: rangeID, Replicas: members})); err != nil {
		t.Fatal(err)
	}
	c.stop(c.byID["r1"])
	p := c.newPromoter("p1", false)

	tr, err := p.promote(ctx, rangeID, -1, "", "test: r3's address reaches r2")
	if err == nil {
		t.Fatalf("promoted with r1 down and r3's address reaching r2: %v; r2 was counted twice", tr)
	}
	if connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "no quorum") || !strings.Contains(err.Error(), "misdirected") {
		t.Fatalf("promote = %v, want Unavailable: no quorum, with r3's answer refused as misdirected", err)
	}
	// r2 was fenced once, as itself.
	st, err := c.replicaClient(members[1].GetAddress()).GetStatus(ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: rangeID}))
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Msg.GetReplicaId(); got != "r2" {
		t.Fatalf("status at r2's address is from %s", got)
	}
}

// A range whose members' addresses are swapped (r1 listed at r2's address
// and r2 at r1's) cannot be fenced: r1 and r2 refuse every call meant for
// the other as misdirected. The promoter must wait, as for refused
// connections, not grant an epoch per attempt (a user saw 0 -> 36 in 16 s),
// and say why; once the addresses are corrected it promotes.
func TestSwappedAddressesSpendNoEpochs(t *testing.T) {
	c := newCluster(t, 3)
	members := c.members()
	members[0].Address, members[1].Address = members[1].Address, members[0].Address
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const rangeID = "swap"
	if _, err := c.lease.Client.CreateRange(ctx, connect.NewRequest(&tenurev1.CreateRangeRequest{RangeId: rangeID, Replicas: members})); err != nil {
		t.Fatal(err)
	}
	// Retries at most 100ms apart: each would grant an epoch if not held.
	p := c.newPromoter("p1", true, func(cfg *Config) { cfg.RetryMax = 100 * time.Millisecond })

	waitFor(t, "the promoter to report the misdirection", 20*time.Second, func() bool {
		st := promotionOf(p, rangeID)
		return st != nil && strings.Contains(st.GetLastError(), "misdirected")
	})
	// The first attempt waits for the first probes of the addresses, so
	// not even it is granted an epoch.
	held := c.rangeEpoch(rangeID)
	if held != 0 {
		t.Errorf("epoch %d before the range ever had a leader, want 0: an attempt was granted one before the probes saw the misdirection", held)
	}
	time.Sleep(3 * time.Second) // thirty retries' worth
	if now := c.rangeEpoch(rangeID); now != held {
		t.Fatalf("epoch moved from %d to %d in 3s while r1's and r2's addresses reach each other: each attempt spent an epoch", held, now)
	}
	st := promotionOf(p, rangeID)
	for _, want := range []string{"are misdirected", "r1's address " + members[0].GetAddress() + " answers as replica r2", "r2's address " + members[1].GetAddress() + " answers as replica r1"} {
		if !strings.Contains(st.GetLastError(), want) {
			t.Errorf("status last error %q does not say %q", st.GetLastError(), want)
		}
	}
	if st.GetState() != "no-quorum" {
		t.Errorf("status state %q, want no-quorum (held, nothing granted)", st.GetState())
	}

	// Correct the addresses: the promoter promotes.
	rng, err := c.lease.Client.GetRange(ctx, connect.NewRequest(&tenurev1.GetRangeRequest{RangeId: rangeID}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.lease.Client.SetReplicas(ctx, connect.NewRequest(&tenurev1.SetReplicasRequest{
		RangeId: rangeID, Replicas: c.members(), ExpectedRevision: rng.Msg.GetRange().GetMembershipRevision()})); err != nil {
		t.Fatal(err)
	}
	c.leader(rangeID, held+1, 20*time.Second)
}

// A leader whose address comes to answer as another replica (here an
// operator's SetReplicas gives r-leader the address of another member) is
// unreachable: the replica there refuses every call meant for the leader.
// The promoter must fail the range over to a reachable member, as for a dead
// leader. Before, nothing noticed: the probe of the address read the other
// replica's status, the leader's own lease stayed live, and the range
// refused every append until the address was corrected.
func TestLeaderAddressAnsweringAsAnotherReplicaFailsOver(t *testing.T) {
	c := newCluster(t, 3)
	const rangeID = "moved"
	c.createRange(rangeID, "r1")
	p := c.newPromoter("p1", true)
	leader, epoch := c.leader(rangeID, 1, 20*time.Second)

	members := c.members()
	other := ""
	for _, m := range members {
		if m.GetId() != leader {
			other = m.GetId()
			break
		}
	}
	for _, m := range members {
		if m.GetId() == leader {
			m.Address = c.byID[other].srv.URL()
		}
	}
	// The membership revision moves while the first leader records its
	// members' incarnations: re-read and retry, bounded.
	waitFor(t, "SetReplicas to give "+leader+" the address of "+other, 10*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		rng, err := c.lease.Client.GetRange(ctx, connect.NewRequest(&tenurev1.GetRangeRequest{RangeId: rangeID}))
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.lease.Client.SetReplicas(ctx, connect.NewRequest(&tenurev1.SetReplicasRequest{
			RangeId: rangeID, Replicas: members, ExpectedRevision: rng.Msg.GetRange().GetMembershipRevision()}))
		if err != nil && connect.CodeOf(err) != connect.CodeAborted {
			t.Fatal(err)
		}
		return err == nil
	})
	next, nextEpoch := c.leader(rangeID, epoch+1, 30*time.Second)
	if next == leader {
		t.Fatalf("%s leads again at epoch %d; its address answers as %s", next, nextEpoch, other)
	}
	var reason string
	waitFor(t, "the transition record of epoch "+fmt.Sprint(nextEpoch), 10*time.Second, func() bool {
		trs, err := p.transitions(context.Background(), rangeID, 1)
		if err != nil || len(trs) == 0 || trs[0].GetEpoch() != nextEpoch {
			return false
		}
		reason = trs[0].GetReason()
		return true
	})
	if want := "leader " + leader + " unreachable: its address " + c.byID[other].srv.URL() + " answers as replica " + other; !strings.Contains(reason, want) {
		t.Errorf("transition reason %q does not say %q", reason, want)
	}
}
