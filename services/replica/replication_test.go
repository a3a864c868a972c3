package replica_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// Three replicas: append, replicate, commit, read back; every replica holds
// the same log, byte for byte.
func TestReplicateCommitAndRead(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)

	var sent [][]byte
	for i := 0; i < 5; i++ {
		vals := values("batch"+string(rune('a'+i)), 10)
		a := c.mustAppend(r1, vals...)
		// Offset 0 is epoch 1's epoch-start record.
		if want := uint64(1 + 10*i); a.GetBaseOffset() != want || a.GetEpoch() != 1 {
			t.Fatalf("Append %d = base %d epoch %d, want base %d epoch 1", i, a.GetBaseOffset(), a.GetEpoch(), want)
		}
		// Acknowledged means committed: the HWM has passed the batch.
		if a.GetHighWaterMark() < a.GetBaseOffset()+10 {
			t.Fatalf("Append %d acknowledged at HWM %d, before its end %d", i, a.GetHighWaterMark(), a.GetBaseOffset()+10)
		}
		sent = append(sent, vals...)
	}

	got := c.readAll(r1)
	if len(got) != 1+len(sent) {
		t.Fatalf("Read returned %d records, want %d", len(got), 1+len(sent))
	}
	if !got[0].GetEpochStart() || len(got[0].GetValue()) != 0 || got[0].GetEpoch() != 1 {
		t.Fatalf("record 0 = %v, want epoch 1's empty epoch-start record", got[0])
	}
	for i, v := range sent {
		r := got[i+1]
		if r.GetOffset() != uint64(i+1) || r.GetEpoch() != 1 || r.GetEpochStart() || !bytes.Equal(r.GetValue(), v) {
			t.Fatalf("record %d = %v, want value %q at epoch 1", i+1, r, v)
		}
	}
	c.waitCaughtUp(r1, r2, r3)
	c.sameLogs(c.storeLog(r1), r2, r3)
	for _, n := range c.nodes {
		h := c.history(n).GetHistory()
		if len(h) != 1 || h[0].GetEpoch() != 1 || h[0].GetStartOffset() != 0 {
			t.Fatalf("%s history = %v, want [(1, 0)]", n.id, h)
		}
	}

	st := c.status(r1)
	if st.GetRole() != tenurev1.Role_ROLE_LEADER || st.GetEpoch() != 1 || st.GetFencedEpoch() != 1 || !st.GetLeaseValid() || len(st.GetFollowers()) != 2 {
		t.Fatalf("leader status = %v", st)
	}
	for _, f := range st.GetFollowers() {
		if f.GetFetchOffset() != st.GetLogEnd() || f.GetLag() != 0 || f.GetLastFetchUnixMs() == 0 {
			t.Fatalf("follower progress = %v, want caught up at %d", f, st.GetLogEnd())
		}
	}
	if fs := c.status(r2); fs.GetRole() != tenurev1.Role_ROLE_FOLLOWER || fs.GetLeaderId() != "r1" || fs.GetLeaderAddress() != r1.url {
		t.Fatalf("follower status = %v", fs)
	}
}

// A follower stopped and restarted on the same data directory resumes
// following and catches up.
func TestFollowerRestartCatchesUp(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("before", 20)...)
	c.waitCaughtUp(r1, r2, r3)

	c.stop(r3)
	// r1 and r2 are a quorum: appends still commit.
	for i := 0; i < 3; i++ {
		c.mustAppend(r1, values("while-down", 50)...)
	}
	c.start(r3)
	if st := c.status(r3); st.GetRole() != tenurev1.Role_ROLE_FOLLOWER || st.GetEpoch() != 1 || st.GetFencedEpoch() != 1 {
		t.Fatalf("restarted follower status = %v, want following at epoch 1", st)
	}
	c.waitCaughtUp(r1, r2, r3)
	c.sameLogs(c.storeLog(r1), r2, r3)
}

// An append is acknowledged only once a quorum holds it: with both
// followers down it does not complete; with one back it does.
func TestAppendWaitsForQuorum(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("first", 3)...)

	c.stop(r2)
	c.stop(r3)
	done := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go func() {
		_, err := c.append(ctx, r1, []byte("needs-a-quorum"))
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("append with no follower completed: %v", err)
	case <-time.After(700 * time.Millisecond):
	}
	if st := c.status(r1); st.GetHighWaterMark() != st.GetLogEnd()-1 {
		t.Fatalf("leader HWM %d, log end %d: the lone record must not commit", st.GetHighWaterMark(), st.GetLogEnd())
	}
	c.start(r2)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("append after a follower came back = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("append did not complete after a follower came back")
	}
}

// A fence fails the appends still waiting, naming the fence.
func TestFenceFailsWaitingAppends(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("committed", 2)...)
	r2.gate.block()
	r3.gate.block()
	done := make(chan error, 1)
	go func() {
		_, err := c.append(ctxT(t), r1, []byte("uncommitted"))
		done <- err
	}()
	waitUntil(t, 5*time.Second, "the append to be written", func() bool { return c.status(r1).GetLogEnd() == 4 })
	c.mustFence(r1, 2)
	select {
	case err := <-done:
		wantCode(t, "waiting append after the fence", err, connect.CodeFailedPrecondition)
		if !bytes.Contains([]byte(err.Error()), []byte("fenced at epoch 2")) {
			t.Fatalf("waiting append failed with %q, want it to name the fence at epoch 2", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiting append not failed by the fence")
	}
	_, err := c.append(ctxT(t), r1, []byte("after"))
	wantCode(t, "append after the fence", err, connect.CodeFailedPrecondition)
}

// A leader's status says how long it has waited for each follower's next
// fetch: near 0 for one that fetches (its long poll is held), growing for
// one that cannot reach the leader, and back near 0 when it can again.
func TestStatusShowsAFollowerThatStoppedFetching(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("a", 2)...)
	c.waitCaughtUp(r1, r2, r3)

	waiting := func(id string) uint64 {
		for _, f := range c.status(r1).GetFollowers() {
			if f.GetReplicaId() == id {
				return f.GetFetchWaitingMs()
			}
		}
		t.Fatalf("leader status has no progress of %s", id)
		return 0
	}
	r2.gate.block()
	waitUntil(t, 10*time.Second, "r2's fetches waited for 1.5s", func() bool { return waiting("r2") >= 1500 })
	// r3 still fetches: the leader holds its long poll (300ms) and it
	// fetches again at once after each answer.
	if w := waiting("r3"); w >= 1000 {
		t.Fatalf("leader waited %dms for r3's next fetch, want it fetching (under 1s)", w)
	}
	r2.gate.open()
	waitUntil(t, 10*time.Second, "r2 fetching again", func() bool { return waiting("r2") < 1000 })
}
