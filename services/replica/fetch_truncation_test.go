package replica_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// A truncation a follower makes at fetch time is recorded: GetStatus counts
// it (how many, how many records) and names the last one (from, to, the
// epoch, the leader, when), and the log says the same in one line. Before,
// only the log line existed and nothing an operator or a checker polls
// showed a replica losing a tail.
func TestFetchTruncationsAreCounted(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("committed", 3)...)
	c.waitCaughtUp(r1, r2, r3)
	committed := c.status(r1).GetLogEnd()

	// A tail only r1 writes: no follower fetches it, so it never commits.
	r2.gate.block()
	r3.gate.block()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _, _ = c.append(ctx, r1, values("tail", 3)...) }()
	waitUntil(t, 10*time.Second, "r1 to write the tail", func() bool { return c.status(r1).GetLogEnd() == committed+3 })
	if st := c.status(r1); st.GetFetchTruncations() != 0 || st.GetLastFetchTruncationUnixMs() != 0 {
		t.Fatalf("r1 before any truncation: %v", st)
	}

	// Epoch 2 is led by r2; r1 follows and its fetch check cuts the tail.
	before := time.Now()
	for _, n := range []*node{r1, r2, r3} {
		c.mustFence(n, 2)
	}
	r2.gate.open()
	r3.gate.open()
	c.mustAdopt(r2, 2, tenurev1.Role_ROLE_LEADER, r2, committed)
	c.mustAdopt(r1, 2, tenurev1.Role_ROLE_FOLLOWER, r2, 0)
	c.mustAdopt(r3, 2, tenurev1.Role_ROLE_FOLLOWER, r2, 0)
	c.mustAppend(r2, []byte("epoch2"))
	c.waitCaughtUp(r2, r1, r3)

	st := c.status(r1)
	if st.GetFetchTruncations() != 1 || st.GetFetchTruncatedRecords() != 3 ||
		st.GetLastFetchTruncationFrom() != committed+3 || st.GetLastFetchTruncationTo() != committed ||
		st.GetLastFetchTruncationEpoch() != 2 || st.GetLastFetchTruncationLeader() != r2.id {
		t.Fatalf("r1 status after its fetch truncation: truncations %d (records %d), last from %d to %d at epoch %d following %q; want 1 (3), from %d to %d at 2 following r2",
			st.GetFetchTruncations(), st.GetFetchTruncatedRecords(), st.GetLastFetchTruncationFrom(), st.GetLastFetchTruncationTo(),
			st.GetLastFetchTruncationEpoch(), st.GetLastFetchTruncationLeader(), committed+3, committed)
	}
	if at := time.UnixMilli(st.GetLastFetchTruncationUnixMs()); at.Before(before.Add(-time.Second)) || at.After(time.Now().Add(time.Second)) {
		t.Fatalf("r1's last fetch truncation at %v, want between %v and now", at, before)
	}
	for _, n := range []*node{r2, r3} {
		if got := c.status(n).GetFetchTruncations(); got != 0 {
			t.Fatalf("%s counts %d fetch truncations, want 0 (it cut nothing)", n.id, got)
		}
	}
	var line string
	for _, l := range strings.Split(c.logs.String(), "\n") {
		if strings.Contains(l, "truncated on divergence") && strings.Contains(l, "replica=r1") {
			line = l
		}
	}
	for _, want := range []string{"range=" + rangeID, "epoch=2", "leader=r2", fmt.Sprintf("from=%d", committed+3), fmt.Sprintf("to=%d", committed), "removed=3", "fetch_truncations=1"} {
		if !strings.Contains(line, want) {
			t.Fatalf("r1's truncation log line %q lacks %q", line, want)
		}
	}
	c.sameLogs(c.storeLog(r2), r1, r3)
}
