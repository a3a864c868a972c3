package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// testMembership adds a replica to a two-replica range, removes it again
// and deletes the range, through the commands an operator types.
func testMembership(t *testing.T, c *testCluster) {
	r1, r2, r3 := c.byID["r1"], c.byID["r2"], c.byID["r3"]
	c.mustCtl("", "range", "create", "grow", "--replicas", "r1=http://"+r1.listen+",r2=http://"+r2.listen, "--preferred", "r1")
	c.waitLeader("grow", 1)
	c.mustCtl("", "produce", "grow", "a", "b", "c")

	// The first promotion's leader may not have committed its epoch-start
	// record yet: the refusal says so, and a retry goes through.
	var out string
	waitFor(t, "add-replica to be accepted", 20*time.Second, func() bool {
		code, stdout, stderr := c.ctl("", "range", "add-replica", "grow", "r3=http://"+r3.listen, "--catch-up-lag", "0")
		if code != exitOK && !strings.Contains(stderr, "epoch-start record") {
			t.Fatalf("range add-replica: status %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
		}
		out = stdout
		return code == exitOK
	})
	wantLines(t, "range add-replica", out,
		"add-learner: add-learner r3: epoch",
		"catch-up: r3 caught up",
		"promote-learner: promote-learner r3: epoch",
		"done:",
		"members: r1, r2, r3")

	code, _, stderr := c.ctl("", "range", "add-replica", "grow", "r3=http://"+r3.listen)
	if code != exitFail || !strings.Contains(stderr, "membership change refused") || !strings.Contains(stderr, "already a voter") {
		t.Errorf("adding r3 again: status %d, stderr:\n%s\nwant status 1 and 'already a voter'", code, stderr)
	}

	code, stdout, stderr := c.ctl("", "range", "remove-replica", "grow", "r3", "--json")
	if code != exitOK {
		t.Fatalf("range remove-replica --json: status %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	var phases []string
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var ph struct {
			Phase string `json:"phase"`
			Done  bool   `json:"done"`
		}
		if err := json.Unmarshal([]byte(line), &ph); err != nil {
			t.Fatalf("remove-replica --json line %q: %v", line, err)
		}
		phases = append(phases, ph.Phase)
	}
	if strings.Join(phases, " ") != "remove drop done" {
		t.Errorf("remove-replica phases = %v, want [remove drop done]", phases)
	}

	out = c.mustCtl("", "transitions", "grow", "--verbose")
	wantLines(t, "transitions", out, "membership step: remove r3")

	out = c.mustCtl("", "range", "delete", "grow")
	wantLines(t, "range delete", out, "deleted range grow")
	out = c.mustCtl("", "range", "delete", "grow")
	wantLines(t, "range delete again", out, "range grow does not exist (already deleted)")

	for _, cmd := range [][]string{{"range", "add-replica"}, {"range", "remove-replica"}, {"range", "replace-replica"}, {"range", "delete"}} {
		code, help, _ := c.ctl("", append(cmd, "--help")...)
		if code != exitOK || !strings.Contains(help, "Usage: tenurectl "+strings.Join(cmd, " ")) {
			t.Errorf("tenurectl %s --help: status %d, stdout:\n%s", strings.Join(cmd, " "), code, help)
		}
	}
	code, _, stderr = c.ctl("", "range", "replace-replica", "grow", "--remove", "r1")
	if code != exitUsage || !strings.Contains(stderr, "--add ID=URL are both required") {
		t.Errorf("replace-replica without --add: status %d, stderr:\n%s", code, stderr)
	}
	code, _, stderr = c.ctl("", "promote", "grow", "--to", "r1", "--preferred", "r2")
	if code != exitUsage || !strings.Contains(stderr, "--to r1 and --preferred r2 disagree") {
		t.Errorf("promote --to r1 --preferred r2: status %d, stderr:\n%s", code, stderr)
	}
}

// An unsafe promotion's report leads with the offsets it may have lost.
func TestWriteTransitionUnsafe(t *testing.T) {
	var out strings.Builder
	writeTransition(&out, &tenurev1.Transition{RangeId: "orders", PreviousEpoch: 5, Epoch: 6, LeaderId: "r3", Unsafe: true,
		HighestHwmSeen: 16, PossiblyLostFrom: 6, CommittedBound: 6})
	if first, _, _ := strings.Cut(out.String(), "\n"); first != "UNSAFE PROMOTION: offsets 6 to 15 (10 records) may have been acknowledged and are NOT on the new leader" {
		t.Errorf("first line = %q", first)
	}
	out.Reset()
	writeTransition(&out, &tenurev1.Transition{RangeId: "orders", Epoch: 6, LeaderId: "r3", Unsafe: true, HighestHwmSeen: 6, PossiblyLostFrom: 6})
	if !strings.HasPrefix(out.String(), "UNSAFE PROMOTION: no acknowledged record is known to be lost") {
		t.Errorf("report = %q", out.String())
	}
	out.Reset()
	writeTransition(&out, &tenurev1.Transition{RangeId: "orders", Epoch: 6, LeaderId: "r3"})
	if strings.Contains(out.String(), "UNSAFE") {
		t.Errorf("a safe promotion's report mentions UNSAFE: %q", out.String())
	}
}
