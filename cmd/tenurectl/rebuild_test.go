package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// flipLastBatch damages the last stored batch of range id on a stopped
// replica's disk (the last byte of its log key's value, a segment pointer
// or a batch, flipped in Badger): the record below the synced marker, which
// the store reads when it opens.
func flipLastBatch(t *testing.T, dir, id string) {
	t.Helper()
	db, err := badger.Open(badger.DefaultOptions(filepath.Join(dir, "badger")).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(txn *badger.Txn) error {
		prefix := []byte("l/" + id + "/")
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, Reverse: true})
		seek := append(append([]byte(nil), prefix...), 0xff)
		it.Seek(seek)
		if !it.Valid() {
			it.Close()
			t.Fatalf("no log key of %s", id)
		}
		key := it.Item().KeyCopy(nil)
		v, err := it.Item().ValueCopy(nil)
		it.Close()
		if err != nil {
			return err
		}
		v[len(v)-1] ^= 0x40
		return txn.Set(key, v)
	}); err != nil {
		t.Fatal(err)
	}
}

// replicaJSON is one replica's row of 'status RANGE --json'.
func (c *testCluster) replicaJSON(rangeID, id string) (replicaStatusJSON, string) {
	c.t.Helper()
	var st []statusJSON
	out := c.mustCtl("", "status", rangeID, "--json")
	if err := json.Unmarshal([]byte(out), &st); err != nil || len(st) != 1 {
		c.t.Fatalf("status %s --json: %v\n%s", rangeID, err, out)
	}
	for _, r := range st[0].Replicas {
		if r.ID == id {
			return r, st[0].Leader
		}
	}
	c.t.Fatalf("status %s --json lists no %s:\n%s", rangeID, id, out)
	return replicaStatusJSON{}, ""
}

// testRebuild damages r3's copy of a range on disk while r3 is down: r3
// comes back with that copy quarantined (status says HALTED, quarantined)
// and its other ranges serving; 'range rebuild' removes r3, which drops the
// copy, and adds it back as a learner that fetches the whole log and becomes
// a voter; r3 then holds the range's full log and serves as a follower, and
// as leader after a handover.
func testRebuild(t *testing.T, c *testCluster) {
	c.createRange("mend", "r1")
	c.createRange("mend-ok", "r1")
	c.mustCtl("", "produce", "mend", "a", "b", "c", "d")
	waitFor(t, "r3 to hold mend's log", 20*time.Second, func() bool {
		r3, leader := c.replicaJSON("mend", "r3")
		l, _ := c.replicaJSON("mend", leader)
		return r3.LogEnd == l.LogEnd && r3.HighWaterMark == l.HighWaterMark && l.LogEnd > 0
	})
	r3 := c.byID["r3"]
	c.stop(r3)
	flipLastBatch(t, r3.dir, "mend")
	c.start(r3)

	st, _ := c.replicaJSON("mend", "r3")
	if !strings.Contains(st.Halted, "quarantined") {
		t.Fatalf("r3's copy after the damage: halted %q, want quarantined", st.Halted)
	}
	out := c.mustCtl("", "status", "mend")
	wantLines(t, "status of the quarantined copy", out, "HALTED (quarantined; tenurectl range rebuild mend --replica r3)")
	// The copy never took a role: its row and epochs' column say halted
	// (they said "unspecified"), and epochs says why it has no history
	// (it said "unreachable" of a replica that answered).
	wantLines(t, "status row of the quarantined copy", out, "r3 halted ")
	out = c.mustCtl("", "epochs", "mend")
	wantLines(t, "epochs with a quarantined copy", out, "r3 (halted)", "r3: no history: ")
	if !strings.Contains(out, "quarantined") || strings.Contains(out, "unreachable") || strings.Contains(out, "unspecified") {
		t.Errorf("epochs with r3's copy quarantined:\n%s\nwant r3 halted, with no history because quarantined; not unreachable or unspecified", out)
	}
	// r3's other ranges are not touched: it still serves them.
	if st, _ := c.replicaJSON("mend-ok", "r3"); st.Halted != "" || st.Error != "" {
		t.Fatalf("r3's copy of another range after the restart: %+v", st)
	}

	// A healthy copy is not rebuilt without --force.
	code, _, stderr := c.ctl("", "range", "rebuild", "mend", "--replica", "r2")
	if code != exitFail || !strings.Contains(stderr, "not halted") {
		t.Fatalf("rebuild of a healthy copy: status %d, stderr:\n%s\nwant refused, 'not halted'", code, stderr)
	}

	var rebuilt string
	waitFor(t, "range rebuild to be accepted", 30*time.Second, func() bool {
		code, stdout, stderr := c.ctl("", "range", "rebuild", "mend", "--replica", "r3", "--catch-up-lag", "0")
		if code != exitOK && !strings.Contains(stderr, "epoch-start record") {
			t.Fatalf("range rebuild: status %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
		}
		rebuilt = stdout
		return code == exitOK
	})
	wantLines(t, "range rebuild", rebuilt,
		"remove: remove r3: epoch",
		"drop: r3 dropped the range's data",
		"add-learner: add-learner r3: epoch",
		"catch-up: r3 caught up",
		"promote-learner: promote-learner r3: epoch",
		"members:")

	c.mustCtl("", "produce", "mend", "e")
	waitFor(t, "the rebuilt r3 to follow with the whole log", 20*time.Second, func() bool {
		r3, leader := c.replicaJSON("mend", "r3")
		l, _ := c.replicaJSON("mend", leader)
		return r3.Halted == "" && r3.Role == "follower" && !r3.Learner && r3.LogEnd == l.LogEnd && r3.HighWaterMark == l.HighWaterMark
	})
	// Its log is the range's whole log: led by r3, every record reads.
	waitFor(t, "a handover to r3", 30*time.Second, func() bool {
		code, _, _ := c.ctl("", "promote", "mend", "--to", "r3", "--reason", "test: the rebuilt copy leads")
		return code == exitOK
	})
	if _, leader := c.replicaJSON("mend", "r3"); leader != "r3" {
		t.Fatalf("leader after the handover = %s, want r3", leader)
	}
	var got string
	waitFor(t, "consume from the rebuilt leader", 20*time.Second, func() bool {
		code, stdout, _ := c.ctl("", "consume", "mend")
		got = stdout
		return code == exitOK && strings.Count(stdout, "\n") >= 5
	})
	for _, v := range []string{"a", "b", "c", "d", "e"} {
		if !strings.Contains(got, "\t"+v+"\n") && !strings.Contains(got, " "+v+"\n") {
			t.Errorf("consume from the rebuilt r3 lacks %q:\n%s", v, got)
		}
	}

	// A rebuild that stopped after its removal (here: the removal run by
	// hand) resumes with the add; the range no longer lists the address.
	c.mustCtl("", "range", "remove-replica", "mend-ok", "r3")
	code, _, stderr = c.ctl("", "range", "rebuild", "mend-ok", "--replica", "r3")
	if code != exitFail || !strings.Contains(stderr, "--replica r3=URL") {
		t.Fatalf("rebuild of a removed replica without its URL: status %d, stderr:\n%s", code, stderr)
	}
	var resumed string
	waitFor(t, "the resumed rebuild to be accepted", 30*time.Second, func() bool {
		code, stdout, stderr := c.ctl("", "range", "rebuild", "mend-ok", "--replica", "r3=http://"+r3.listen, "--catch-up-lag", "0")
		if code != exitOK && !strings.Contains(stderr, "epoch-start record") {
			t.Fatalf("resumed range rebuild: status %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
		}
		resumed = stdout
		return code == exitOK
	})
	if strings.Contains(resumed, "remove:") {
		t.Errorf("the resumed rebuild removed again:\n%s", resumed)
	}
	wantLines(t, "resumed range rebuild", resumed, "add-learner: add-learner r3: epoch", "promote-learner: promote-learner r3: epoch", "members:")

	code, help, _ := c.ctl("", "range", "rebuild", "--help")
	if code != exitOK || !strings.Contains(help, "Usage: tenurectl range rebuild") || !strings.Contains(help, "learner") {
		t.Errorf("range rebuild --help: status %d, stdout:\n%s", code, help)
	}
}
