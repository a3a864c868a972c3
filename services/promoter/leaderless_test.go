package promoter

import (
	"context"
	"testing"
	"time"
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
