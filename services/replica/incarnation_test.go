package replica_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

var incarnationPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)

// A replica's incarnation is made once, at its data directory's first
// start, answered in every fence and status, and read back unchanged at
// every restart; a store written before incarnations gets a new one, and a
// damaged one refuses the start rather than silently becoming a stranger.
func TestIncarnationIsTheDataDirectorys(t *testing.T) {
	c := newCluster(t, 1)
	n := c.node(1)
	inc := n.r.Incarnation()
	if !incarnationPattern.MatchString(inc) {
		t.Fatalf("Incarnation() = %q, want 32 lowercase hex digits", inc)
	}
	if got := c.mustFence(n, 1).GetIncarnation(); got != inc {
		t.Fatalf("Fence answered incarnation %q, want %q", got, inc)
	}
	batch, err := n.rc.FenceRanges(ctxT(t), connect.NewRequest(&tenurev1.FenceRangesRequest{Fences: []*tenurev1.FenceRequest{{RangeId: rangeID, Epoch: 2}}}))
	if err != nil || batch.Msg.GetResults()[0].GetFence().GetIncarnation() != inc {
		t.Fatalf("FenceRanges = %v, %v; want incarnation %q", batch, err, inc)
	}
	st, err := n.rc.GetStatus(ctxT(t), connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{}))
	if err != nil || st.Msg.GetIncarnation() != inc {
		t.Fatalf("GetStatus = %v, %v; want incarnation %q", st, err, inc)
	}

	c.restart(n)
	if got := n.r.Incarnation(); got != inc {
		t.Fatalf("Incarnation() after a restart = %q, want %q", got, inc)
	}
	if got := c.mustFence(n, 3).GetIncarnation(); got != inc {
		t.Fatalf("Fence after a restart answered incarnation %q, want %q", got, inc)
	}

	// A store from before incarnations: the file is missing, the range is
	// still there.
	c.stop(n)
	path := filepath.Join(n.dir, "incarnation")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	c.start(n)
	got := n.r.Incarnation()
	if !incarnationPattern.MatchString(got) || got == inc {
		t.Fatalf("Incarnation() of a store without one = %q, want a new one (not %q)", got, inc)
	}
	if c.status(n).GetFencedEpoch() != 3 {
		t.Fatalf("the store's range did not survive getting an incarnation")
	}
	if !strings.Contains(c.logs.String(), "holds a store but no incarnation") {
		t.Fatalf("no log line says the store got an incarnation")
	}

	c.stop(n)
	if err := os.WriteFile(path, []byte("not-an-incarnation\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.tryStart(n); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("start with a damaged incarnation = %v, want a refusal", err)
	}
	// Emptied (a zero-length file), and the refusal says where the right
	// value is: the membership, as this replica's incarnation. (It said
	// "restore it or wipe the directory": from nowhere, and wiping throws
	// away every copy the directory holds.)
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err = c.tryStart(n)
	if err == nil {
		t.Fatal("start with an empty incarnation file succeeded")
	}
	for _, want := range []string{"damaged", "Nothing was changed", "replica " + n.id + "'s incarnation", "tenurectl range show RANGE --json"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "wipe the directory") {
		t.Errorf("refusal %q still advises wiping the directory", err)
	}
	if err := os.WriteFile(path, []byte(got+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.start(n)
	if n.r.Incarnation() != got || c.status(n).GetFencedEpoch() != 3 {
		t.Fatalf("restored incarnation: Incarnation() = %q, fenced epoch %d; want %q and 3", n.r.Incarnation(), c.status(n).GetFencedEpoch(), got)
	}
}
