package promoter

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// A promoter that dies between fencing and adopting leaves the range fenced
// at its epoch with no leader, and the lease on its own session. The next
// promoter does not know a leader to probe; the expiry of that session's
// lease is what must trigger the promotion.
func TestPromoterDiesBeforeAdopting(t *testing.T) {
	c := newCluster(t, 3)
	c.createRange("r", "r1")
	a := c.newPromoter("pa", false, func(cfg *Config) { cfg.SessionTTL = 2 * time.Second })
	ctx, cancel := context.WithCancel(context.Background())
	a.testHookStep = func(step string) {
		if step == "plan" {
			cancel() // the promoter "dies" right after deciding
		}
	}
	if _, err := a.promote(ctx, "r", 0, "", "initial"); err == nil {
		t.Fatal("the interrupted promotion succeeded")
	}
	for _, id := range []string{"r1", "r2", "r3"} {
		if st := c.status(id, "r"); st.GetFencedEpoch() != 1 || st.GetEpoch() != 0 {
			t.Fatalf("%s: fenced %d, acting at %d; want fenced at 1 and not acting", id, st.GetFencedEpoch(), st.GetEpoch())
		}
	}
	// pa's session is never renewed (its keep-alive loop never ran) and
	// expires; pb, elected, promotes on that expiry.
	c.newPromoter("pb", true)
	if leader, epoch := c.leader("r", 2, 20*time.Second); leader == "" || epoch < 2 {
		t.Fatalf("leader %q at %d, want one at epoch >= 2", leader, epoch)
	}
}

// A grant of ours whose answer we never saw (it applied, but the call timed
// out, as a batched grant can under load) leaves the range at an epoch held
// by our own live session, with no leader and no promotion running. Our
// session never expires, so no lease event will come: the refresh must
// notice the orphaned grant and promote from it.
func TestOrphanedOwnGrantIsPromoted(t *testing.T) {
	c := newCluster(t, 3)
	c.createRange("r", "r1")
	p := c.newPromoter("p1", true)
	if leader, _ := c.leader("r", 1, 20*time.Second); leader == "" {
		t.Fatal("no first leader")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	session, err := p.openSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The grant the promoter lost track of: epoch 2 on its own session,
	// nothing fenced, nothing adopted.
	if _, err := c.lease.Client.GrantEpoch(ctx, connect.NewRequest(&tenurev1.GrantEpochRequest{
		RangeId: "r", PreviousEpoch: 1, HolderId: "p1", SessionId: session,
	})); err != nil {
		t.Fatal(err)
	}
	if leader, epoch := c.leader("r", 3, 20*time.Second); leader == "" || epoch < 3 {
		t.Fatalf("leader %q at %d, want one at epoch >= 3", leader, epoch)
	}
}
