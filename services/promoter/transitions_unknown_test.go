package promoter

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// ListTransitions of a range that does not exist answers NotFound: it
// answered an empty list, which a caller with a mistyped id read as "never
// promoted". A range with records still answers them.
func TestListTransitionsOfAnUnknownRangeIsNotFound(t *testing.T) {
	c := newCluster(t, 3)
	c.createRange("r", "r1")
	p := c.newPromoter("p1", true)
	c.leader("r", 1, 20*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	waitFor(t, "the first promotion's record", 10*time.Second, func() bool {
		resp, err := handler{p}.ListTransitions(ctx, connect.NewRequest(&tenurev1.ListTransitionsRequest{RangeId: "r"}))
		return err == nil && len(resp.Msg.GetTransitions()) > 0
	})
	_, err := handler{p}.ListTransitions(ctx, connect.NewRequest(&tenurev1.ListTransitionsRequest{RangeId: "no-such-range"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("ListTransitions of an unknown range = %v; want NotFound", err)
	}
}
