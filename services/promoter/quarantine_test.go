package promoter

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// flipStateByte damages range id's state on a stopped replica's disk: the
// last byte of its s/ value flipped in Badger, as a disk's damage would.
func flipStateByte(t testing.TB, dir, id string) {
	t.Helper()
	db, err := badger.Open(badger.DefaultOptions(filepath.Join(dir, "badger")).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(txn *badger.Txn) error {
		item, err := txn.Get([]byte("s/" + id))
		if err != nil {
			return err
		}
		v, err := item.ValueCopy(nil)
		if err != nil {
			return err
		}
		v[len(v)-1] ^= 0x40
		return txn.Set([]byte("s/"+id), v)
	}); err != nil {
		t.Fatal(err)
	}
}

// fencedReplica is tr's answer of replica id.
func fencedReplica(tr *tenurev1.Transition, id string) *tenurev1.FencedReplica {
	for _, f := range tr.GetReplicas() {
		if f.GetReplicaId() == id {
			return f
		}
	}
	return nil
}

// Three replicas; r3's copy of range q is damaged on disk while it is down.
// At restart r3 quarantines q (and only q): a promotion of q fences r1 and
// r2, reads r3's FailedPrecondition as "not fenced" and promotes on the two
// others; with r2 down too no promotion of q succeeds, because r3's copy
// never counts as a known (empty) history; and r3's other range, ok, is
// fenced, counted and can lead. Nothing acknowledged is lost.
func TestQuarantinedReplicaIsNotCounted(t *testing.T) {
	c := newCluster(t, 3)
	c.createRange("q", "r1")
	c.createRange("ok", "r1")
	p := c.newPromoter("p1", false)
	ctx := context.Background()
	for _, id := range []string{"q", "ok"} {
		if _, err := p.promote(ctx, id, 0, "r1", "initial"); err != nil {
			t.Fatal(err)
		}
	}
	var acks, okAcks []acked
	for i := range 10 {
		a, err := c.appendOne("q", fmt.Sprintf("q%d", i), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		acks = append(acks, a)
	}
	for i := range 5 {
		a, err := c.appendOne("ok", fmt.Sprintf("ok%d", i), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		okAcks = append(okAcks, a)
	}
	for _, id := range []string{"q", "ok"} {
		waitFor(t, "r3 to catch up on "+id, 10*time.Second, func() bool {
			l, f := c.status("r1", id), c.status("r3", id)
			return l != nil && f != nil && f.GetLogEnd() == l.GetLogEnd() && f.GetHighWaterMark() == l.GetHighWaterMark()
		})
	}

	r3 := c.byID["r3"]
	c.stop(r3)
	flipStateByte(t, r3.dir, "q")
	c.start(r3)
	if st := c.status("r3", "q"); st == nil || !strings.Contains(st.GetHalted(), "quarantined") {
		t.Fatalf("r3's status of q = %v, want halted as quarantined", st)
	}

	tr, err := p.promote(ctx, "q", -1, "r2", "test: promote around the quarantined copy")
	if err != nil {
		t.Fatalf("promotion of q with r1 and r2 up: %v", err)
	}
	if tr.GetLeaderId() != "r2" {
		t.Fatalf("q's leader = %s, want r2", tr.GetLeaderId())
	}
	if f := fencedReplica(tr, "r3"); f == nil || f.GetFenced() || f.GetCounted() || !strings.Contains(f.GetError(), "quarantined") {
		t.Fatalf("r3 in the transition: %v; want not fenced, not counted, the error naming the quarantine", f)
	}
	for _, id := range []string{"r1", "r2"} {
		if f := fencedReplica(tr, id); f == nil || !f.GetCounted() {
			t.Fatalf("%s in the transition: %v; want counted", id, f)
		}
	}
	c.checkAcked("q", acks)

	// With r2 down, r1 and the quarantined r3 are no quorum: r3 never
	// counts as a fenced replica with a known (empty) history.
	c.stop(c.byID["r2"])
	if tr, err := p.promote(ctx, "q", -1, "", "test: r1 and the quarantined r3 alone"); err == nil {
		t.Fatalf("q promoted with r2 down (leader %s at epoch %d): the quarantined r3 was counted", tr.GetLeaderId(), tr.GetEpoch())
	}
	// r3's other range is fine: it is counted and leads.
	okTr, err := p.promote(ctx, "ok", -1, "r3", "test: r3's healthy range")
	if err != nil || okTr.GetLeaderId() != "r3" {
		t.Fatalf("promotion of ok to r3 with r2 down: %v, %v; want r3 to lead", okTr, err)
	}
	a, err := c.appendOne("ok", "ok-after", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.checkAcked("ok", append(okAcks, a))

	c.start(c.byID["r2"])
	if _, err := p.promote(ctx, "q", -1, "", "test: r2 back"); err != nil {
		t.Fatalf("promotion of q with r2 back: %v", err)
	}
	c.checkAcked("q", acks)
}
