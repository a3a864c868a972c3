package replica_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/dgraph-io/badger/v4"
	"github.com/prometheus/client_golang/prometheus"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// otherRange is a second range the quarantine test replicates beside
// rangeID, to show the replica's other ranges are unaffected.
const otherRange = "other-0"

// electRange is elect for any range id.
func (c *cluster) electRange(id string, epoch uint64, leader *node, followers ...*node) {
	c.t.Helper()
	var bound uint64
	for _, n := range append([]*node{leader}, followers...) {
		a, err := n.rc.Fence(ctxT(c.t), connect.NewRequest(&tenurev1.FenceRequest{RangeId: id, Epoch: epoch, FencerId: "driver"}))
		if err != nil {
			c.t.Fatalf("Fence(%s, %s, %d) = %v", n.id, id, epoch, err)
		}
		bound = max(bound, a.Msg.GetHighWaterMark())
	}
	for _, n := range append([]*node{leader}, followers...) {
		role := tenurev1.Role_ROLE_FOLLOWER
		if n == leader {
			role = tenurev1.Role_ROLE_LEADER
		}
		if _, err := n.rc.Adopt(ctxT(c.t), connect.NewRequest(&tenurev1.AdoptRequest{
			RangeId: id, Epoch: epoch, Role: role, LeaderId: leader.id, LeaderAddress: leader.url,
			Replicas: replicas(c.nodes...), CommittedBound: bound,
		})); err != nil {
			c.t.Fatalf("Adopt(%s, %s, %d, %s) = %v", n.id, id, epoch, role, err)
		}
	}
}

// rangeStatus is n's status of range id.
func (c *cluster) rangeStatus(n *node, id string) *tenurev1.RangeStatus {
	c.t.Helper()
	resp, err := n.rc.GetStatus(ctxT(c.t), connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: id}))
	if err != nil {
		c.t.Fatalf("GetStatus(%s, %s) = %v", n.id, id, err)
	}
	return resp.Msg.GetRanges()[0]
}

// flipStoredValue flips the last byte of key's value in the Badger
// database of a stopped node, as a disk's damage would.
func flipStoredValue(t testing.TB, dir string, key []byte) {
	t.Helper()
	db, err := badger.Open(badger.DefaultOptions(filepath.Join(dir, "badger")).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(txn *badger.Txn) error {
		item, err := txn.Get(key)
		if err != nil {
			return err
		}
		v, err := item.ValueCopy(nil)
		if err != nil {
			return err
		}
		v[len(v)-1] ^= 0x40
		return txn.Set(key, v)
	}); err != nil {
		t.Fatal(err)
	}
}

// gauge reads an unlabelled gauge from reg.
func gauge(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}

// A follower's copy of one range is damaged on disk (its state fails its
// checksum) while the replica is down. At restart that range is HALTED with
// the reason (status, metric, log), refuses fences with FailedPrecondition
// naming the quarantine and reports no history, while the replica's other
// range resumes following and takes new records. Dropping the quarantined
// copy and fencing again hosts it empty, and it catches up from the leader.
// Before quarantine the damage failed the replica's start for every range.
func TestQuarantinedRangeIsHaltedOthersServe(t *testing.T) {
	c := newCluster(t, 2)
	r1, r2 := c.node(1), c.node(2)
	c.elect(1, r1, r2)
	c.electRange(otherRange, 1, r1, r2)
	c.mustAppend(r1, values("a", 5)...)
	if _, err := r1.lc.Append(ctxT(t), connect.NewRequest(&tenurev1.AppendRequest{RangeId: otherRange, Records: values("o", 3)})); err != nil {
		t.Fatal(err)
	}
	c.waitCaughtUp(r1, r2)

	c.stop(r2)
	flipStoredValue(t, r2.dir, []byte("s/"+rangeID))
	reg := prometheus.NewRegistry()
	r2.metrics = reg
	c.start(r2)

	st := c.rangeStatus(r2, rangeID)
	if !strings.Contains(st.GetHalted(), "quarantined") || !strings.Contains(st.GetHalted(), "corrupt") {
		t.Fatalf("status of the damaged range: halted = %q, want the quarantine and its reason", st.GetHalted())
	}
	if n := gauge(t, reg, "tenure_replica_quarantined_ranges"); n != 1 {
		t.Fatalf("tenure_replica_quarantined_ranges = %v, want 1", n)
	}
	if !strings.Contains(c.logs.String(), "range HALTED: quarantined") {
		t.Fatal("no log line at startup names the quarantined range")
	}
	// A fence must never count it as a fenced replica with a known history.
	_, err := c.fence(r2, 2)
	wantCode(t, "Fence of the quarantined range", err, connect.CodeFailedPrecondition)
	if !strings.Contains(err.Error(), "quarantined") {
		t.Fatalf("fence refusal %v does not name the quarantine", err)
	}
	_, err = r2.rc.GetEpochHistory(ctxT(t), connect.NewRequest(&tenurev1.GetEpochHistoryRequest{RangeId: rangeID}))
	wantCode(t, "GetEpochHistory of the quarantined range", err, connect.CodeFailedPrecondition)
	_, err = r2.rc.Adopt(ctxT(t), connect.NewRequest(&tenurev1.AdoptRequest{RangeId: rangeID, Epoch: 1, Role: tenurev1.Role_ROLE_FOLLOWER,
		LeaderId: r1.id, LeaderAddress: r1.url, Replicas: replicas(c.nodes...)}))
	wantCode(t, "Adopt of the quarantined range", err, connect.CodeFailedPrecondition)

	// The other range on the same replica resumed following and serves.
	if st := c.rangeStatus(r2, otherRange); st.GetHalted() != "" || st.GetRole() != tenurev1.Role_ROLE_FOLLOWER {
		t.Fatalf("the other range after the restart: %v, want a follower, not halted", st)
	}
	if _, err := r1.lc.Append(ctxT(t), connect.NewRequest(&tenurev1.AppendRequest{RangeId: otherRange, Records: values("p", 2)})); err != nil {
		t.Fatalf("append to the other range = %v", err)
	}
	waitUntil(t, 10*time.Second, "the other range's follower to take the new records", func() bool {
		return c.rangeStatus(r2, otherRange).GetLogEnd() == c.rangeStatus(r1, otherRange).GetLogEnd()
	})

	// The way out: drop the damaged copy; a fence then hosts it empty,
	// and it catches up from the leader like a new member.
	if a, err := c.drop(r2, 2); err != nil || !a.GetExisted() {
		t.Fatalf("DropRange of the quarantined range = %v, %v", a, err)
	}
	if n := gauge(t, reg, "tenure_replica_quarantined_ranges"); n != 0 {
		t.Fatalf("tenure_replica_quarantined_ranges after the drop = %v, want 0", n)
	}
	if a := c.mustFence(r2, 2); a.GetLogEnd() != 0 || len(a.GetHistory()) != 0 {
		t.Fatalf("fence after the drop = %v, want an empty range", a)
	}
	c.elect(3, r1, r2)
	c.waitCaughtUp(r1, r2)
	c.sameLogs(c.storeLog(r1), r2)
}
