package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestMovedReplicasFollowAgain is the runbook of a replica that moved: it
// restarts with its data directory on another port, the operator records
// the new address with range set-address, and the promoter brings it back
// to following the range, with the records it missed. Done for a follower,
// then for the leader (whose stop fails the range over first). Before
// set-address, this took a raw SetReplicas call through the Connect API.
func TestMovedReplicasFollowAgain(t *testing.T) {
	c := newTestCluster(t)
	leader := c.createRange("moving", "r1")
	c.mustCtl("", "produce", "moving", "a", "b")

	move := func(id string) {
		t.Helper()
		tr := c.byID[id]
		old := tr.listen
		c.stop(tr)
		tr.listen = "127.0.0.1:0" // another port
		c.start(tr)
		out := c.mustCtl("", "range", "set-address", "moving", id+"=http://"+tr.listen)
		if want := fmt.Sprintf("range moving: %s http://%s -> http://%s\n", id, old, tr.listen); !strings.HasPrefix(out, want) {
			t.Fatalf("set-address printed %q, want it to begin %q", out, want)
		}
	}
	// following waits until id follows (or leads) the range at its
	// current epoch with every record the leader has.
	following := func(id string) {
		t.Helper()
		waitFor(t, id+" to catch up at its new address", 30*time.Second, func() bool {
			code, out, _ := c.ctl("", "status", "moving", "--json")
			var st []statusJSON
			if code != exitOK || json.Unmarshal([]byte(out), &st) != nil || len(st) != 1 || st[0].Leader == "" {
				return false
			}
			var lead, moved *replicaStatusJSON
			for i, r := range st[0].Replicas {
				if r.ID == st[0].Leader {
					lead = &st[0].Replicas[i]
				}
				if r.ID == id {
					moved = &st[0].Replicas[i]
				}
			}
			return lead != nil && moved != nil && moved.Error == "" && moved.Epoch == st[0].Epoch &&
				moved.LogEnd == lead.LogEnd && moved.HighWaterMark == lead.HighWaterMark
		})
	}

	follower := c.others(leader)[0]
	move(follower)
	c.mustCtl("", "produce", "moving", "c")
	following(follower)

	move(leader) // its stop fails the range over
	c.mustCtl("", "produce", "moving", "d")
	following(leader)

	if out, want := c.mustCtl("", "consume", "moving"), "1\ta\n2\tb\n3\tc\n"; !strings.HasPrefix(out, want) || !strings.HasSuffix(out, "\td\n") {
		t.Errorf("consume after both moves = %q, want a, b, c, then d", out)
	}
}
