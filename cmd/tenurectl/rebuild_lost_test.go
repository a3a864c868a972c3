package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// TestRebuildALostCopy wipes a member's data directory while it is down (a
// replaced disk) and starts it again, empty, under its id: status shows it
// lost (INCARNATION MISMATCH) and names 'tenurectl range rebuild', and
// that rebuild brings it back: removed, added as a learner, caught up, a
// voter holding the range's whole log. Before, the rebuild failed at once
// with "replica status: want one range" (the replica answers a lost range
// with no range status, only a lost-range entry), so the one command the
// README gives for a damaged copy did not work on a replaced disk.
func TestRebuildALostCopy(t *testing.T) {
	c := newTestCluster(t)
	c.createRange("wiped", "r1")
	c.mustCtl("", "produce", "wiped", "a", "b", "c")
	waitFor(t, "r3 to hold the log", 20*time.Second, func() bool {
		r3, leader := c.replicaJSON("wiped", "r3")
		l, _ := c.replicaJSON("wiped", leader)
		return l.LogEnd > 0 && r3.LogEnd == l.LogEnd && r3.HighWaterMark == l.HighWaterMark
	})
	r3 := c.byID["r3"]
	c.stop(r3)
	if err := os.RemoveAll(r3.dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(r3.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	c.start(r3)
	// The promoter's reconcile loop fences it under the member's recorded
	// incarnation, which the new one refuses: the range is lost on it.
	var out string
	waitFor(t, "status to show r3 lost", 20*time.Second, func() bool {
		_, out, _ = c.ctl("", "status", "wiped")
		return strings.Contains(out, "INCARNATION MISMATCH")
	})
	wantLines(t, "status of the wiped member", out, "tenurectl range rebuild wiped --replica r3")
	// And r3 itself reports the range among its lost ones (what a fence
	// naming the old incarnation leaves), which is what rebuild reads.
	rc := tenurev1connect.NewReplicaServiceClient(transport.NewHTTPClient(), "http://"+r3.listen, transport.ClientOptions()...)
	waitFor(t, "r3 to report the range lost", 20*time.Second, func() bool {
		st, err := rc.GetStatus(t.Context(), connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: "wiped"}))
		return err == nil && len(st.Msg.GetLostRanges()) == 1 && len(st.Msg.GetRanges()) == 0
	})

	var rebuilt, stderr string
	waitFor(t, "range rebuild of the lost copy to be accepted", 30*time.Second, func() bool {
		var code int
		code, rebuilt, stderr = c.ctl("", "range", "rebuild", "wiped", "--replica", "r3", "--catch-up-lag", "0")
		if code != exitOK && !strings.Contains(stderr, "epoch-start record") {
			t.Fatalf("range rebuild of a lost copy: status %d\nstdout:\n%s\nstderr:\n%s", code, rebuilt, stderr)
		}
		return code == exitOK
	})
	if !strings.Contains(stderr, "lost") {
		t.Errorf("range rebuild's stderr does not say the copy was lost:\n%s", stderr)
	}
	wantLines(t, "range rebuild of a lost copy", rebuilt,
		"remove: remove r3: epoch",
		"add-learner: add-learner r3: epoch",
		"catch-up: r3 caught up",
		"promote-learner: promote-learner r3: epoch",
		"members:")

	c.mustCtl("", "produce", "wiped", "d")
	waitFor(t, "the rebuilt r3 to follow with the whole log", 20*time.Second, func() bool {
		r3, leader := c.replicaJSON("wiped", "r3")
		l, _ := c.replicaJSON("wiped", leader)
		return r3.Error == "" && r3.Role == "follower" && !r3.Learner && r3.LogEnd == l.LogEnd && r3.HighWaterMark == l.HighWaterMark
	})
}
