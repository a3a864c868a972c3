package promoter

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// The divergence story end to end: the leader at epoch 1 writes a tail no
// follower receives, so it is never acknowledged; it is killed; a follower
// is promoted at epoch 2 and writes over the same offsets; the old leader
// rejoins, is truncated to exactly the divergence point by the fetch check,
// and ends byte-identical to the new leader. Committed records survive on
// all three.
func TestDivergentTailTruncatedOnRejoin(t *testing.T) {
	c := newCluster(t, 3)
	c.createRange("r", "r1")
	p := c.newPromoter("p1", true)
	if l, _ := c.leader("r", 1, 20*time.Second); l != "r1" {
		t.Fatalf("initial leader = %s, want r1", l)
	}
	var acks []acked
	for i := range 5 {
		a, err := c.appendOne("r", fmt.Sprintf("committed-%d", i), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		acks = append(acks, a)
	}
	committedEnd := acks[len(acks)-1].offset + 1
	waitFor(t, "followers to hold every committed record", 10*time.Second, func() bool {
		return c.logEnd("r2", "r") >= committedEnd && c.logEnd("r3", "r") >= committedEnd
	})

	// Partition both followers from the leader, then write a tail that only
	// the leader holds. Its appends cannot commit.
	c.byID["r2"].gate.Close()
	c.byID["r3"].gate.Close()
	// A long poll sent before the gate closed would still carry the tail:
	// let those end (they wait at most the cluster's fetch wait).
	time.Sleep(3 * c.fetchWait)
	r1 := c.log_(c.byID["r1"].srv.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := r1.Append(ctx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: "r", Records: [][]byte{[]byte("tail-0"), []byte("tail-1"), []byte("tail-2")}}))
	cancel()
	if err == nil {
		t.Fatal("an append with both followers partitioned was acknowledged")
	}
	tailEnd := c.logEnd("r1", "r")
	if tailEnd <= committedEnd {
		t.Fatalf("r1 log end %d: the tail was not written (committed end %d)", tailEnd, committedEnd)
	}

	c.stop(c.byID["r1"])
	c.byID["r2"].gate.Open()
	c.byID["r3"].gate.Open()
	newLeader, e2 := c.leader("r", 2, 20*time.Second)
	for i := range 5 {
		a, err := c.appendOne("r", fmt.Sprintf("epoch2-%d", i), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		acks = append(acks, a)
	}
	// The new leader's history starts epoch e2 where its log ended when it
	// was fenced: the committed end. That is the divergence point with r1.
	leaderHist := c.history(newLeader, "r")
	if n := len(leaderHist); n == 0 || leaderHist[n-1].GetEpoch() != e2 || leaderHist[n-1].GetStartOffset() != committedEnd {
		t.Fatalf("new leader %s history = %v, want it to end with (%d, %d)", newLeader, leaderHist, e2, committedEnd)
	}

	// r1 rejoins: the reconcile loop fences it at the current epoch and
	// adopts it as a follower; the fetch check truncates its tail.
	c.start(c.byID["r1"])
	waitFor(t, "r1 to converge on the new leader's log", 20*time.Second, func() bool {
		return c.logEnd("r1", "r") == c.logEnd(newLeader, "r") && fmt.Sprint(c.history("r1", "r")) == fmt.Sprint(c.history(newLeader, "r"))
	})

	// Byte for byte: make each replica leader in turn (a planned handover to
	// an equally complete replica goes to the preferred one) and read its log.
	var logs [][]*tenurev1.Record
	for _, id := range []string{"r1", "r2", "r3"} {
		// A fence answer that arrives after the quorum's grace does not
		// count, and then the preferred replica cannot win: retry (bounded).
		for attempt := 0; ; attempt++ {
			waitFor(t, id+" to catch up", 20*time.Second, func() bool { return c.logEnd(id, "r") == c.logEnd(newLeader, "r") })
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			resp, err := handler{p}.Promote(ctx, connect.NewRequest(&tenurev1.PromoteRequest{RangeId: "r", PreferredReplicaId: id, Reason: "read every log"}))
			cancel()
			if err != nil {
				t.Fatalf("Promote(preferred %s): %v", id, err)
			}
			if resp.Msg.GetAlreadyLeaderId() == id {
				newLeader = id // it leads already: nothing was done
				break
			}
			if tr := resp.Msg.GetTransition().GetTruncations(); len(tr) != 0 {
				t.Errorf("converged replicas were truncated: %v", tr)
			}
			newLeader = resp.Msg.GetTransition().GetLeaderId()
			if newLeader == id {
				break
			}
			if attempt == 5 {
				t.Fatalf("Promote(preferred %s) chose %s %d times", id, newLeader, attempt+1)
			}
		}
		recs := c.readAll("r")
		var ordered []*tenurev1.Record
		for o := uint64(0); o < uint64(len(recs)); o++ {
			ordered = append(ordered, recs[o])
		}
		logs = append(logs, ordered)
	}
	// Each handover appends its own epoch-start record: every later log is
	// the first one plus epoch-start records only.
	for i := 1; i < len(logs); i++ {
		if len(logs[i]) < len(logs[0]) {
			t.Fatalf("r%d holds %d committed records, r1 held %d", i+1, len(logs[i]), len(logs[0]))
		}
		for _, r := range logs[i][len(logs[0]):] {
			if !r.GetEpochStart() {
				t.Errorf("r%d offset %d: %q is not an epoch-start record", i+1, r.GetOffset(), r.GetValue())
			}
		}
		for o := range logs[0] {
			a, b := logs[0][o], logs[i][o]
			if a.GetEpoch() != b.GetEpoch() || !bytes.Equal(a.GetValue(), b.GetValue()) || a.GetEpochStart() != b.GetEpochStart() {
				t.Errorf("offset %d: r1 has (e%d %q), r%d has (e%d %q)", o, a.GetEpoch(), a.GetValue(), i+1, b.GetEpoch(), b.GetValue())
			}
		}
	}
	for _, r := range logs[0] {
		if bytes.HasPrefix(r.GetValue(), []byte("tail-")) {
			t.Errorf("the unacknowledged tail record %q at offset %d survived", r.GetValue(), r.GetOffset())
		}
	}
	c.checkAcked("r", acks)
}

func (c *cluster) status(id, rangeID string) *tenurev1.RangeStatus {
	tr := c.byID[id]
	if tr.srv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := c.replicaClient(tr.srv.URL()).GetStatus(ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: rangeID}))
	if err != nil || len(resp.Msg.GetRanges()) != 1 {
		return nil
	}
	return resp.Msg.GetRanges()[0]
}

func (c *cluster) logEnd(id, rangeID string) uint64 { return c.status(id, rangeID).GetLogEnd() }

func (c *cluster) history(id, rangeID string) []*tenurev1.EpochStart {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := c.replicaClient(c.byID[id].srv.URL()).GetEpochHistory(ctx, connect.NewRequest(&tenurev1.GetEpochHistoryRequest{RangeId: rangeID}))
	if err != nil {
		return nil
	}
	return resp.Msg.GetHistory()
}
