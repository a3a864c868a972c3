package replica_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestStartRefusesAnIncarnationWithoutItsStore leaves a replica's
// incarnation file in place and takes its store away, as a partial
// restore, a volume mounted without its contents or an operator's rm
// does, and checks that the replica refuses to start, naming what is
// missing and what to do, and that the directory is left as it was.
// Before, the replica started with no ranges under its old incarnation;
// the promoter's next fence recreated each range empty, the membership's
// incarnation check (which catches a wiped disk) passed, and the empty
// copy counted as a voter: a promotion could then lose acknowledged
// records that only it and a dead leader held.
func TestStartRefusesAnIncarnationWithoutItsStore(t *testing.T) {
	for name, keep := range map[string]map[string]bool{
		// Everything but the incarnation: no store file is left to tell.
		"only the incarnation kept": {"incarnation": true},
		// Badger gone, the WAL, segments and journals kept.
		"badger removed": {"incarnation": true, "wal.0": true, "wal.1": true, "segments": true, "journal": true},
	} {
		t.Run(name, func(t *testing.T) {
			c := newCluster(t, 1)
			n := c.node(1)
			c.elect(1, n)
			c.mustAppend(n, []byte("acknowledged"))
			inc := n.r.Incarnation()
			c.stop(n)
			entries, err := os.ReadDir(n.dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				if !keep[e.Name()] {
					if err := os.RemoveAll(filepath.Join(n.dir, e.Name())); err != nil {
						t.Fatal(err)
					}
				}
			}
			err = c.tryStart(n)
			if err == nil {
				t.Fatalf("start without a store = nil error (incarnation %s, ranges served anew), want a refusal", n.r.Incarnation())
			}
			for _, want := range []string{filepath.Join(n.dir, "badger", "MANIFEST"), inc, "tenurectl range rebuild"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("refusal %q does not name %q", err, want)
				}
			}
			if _, err := os.Stat(filepath.Join(n.dir, "badger", "MANIFEST")); err == nil {
				t.Error("the refused start made a new store")
			}
		})
	}
}

// TestNewDataDirectoryGetsIncarnationAndStore: a first start in an empty
// directory makes both, and starts again.
func TestNewDataDirectoryGetsIncarnationAndStore(t *testing.T) {
	c := newCluster(t, 1)
	n := c.node(1)
	inc := n.r.Incarnation()
	for _, f := range []string{"incarnation", filepath.Join("badger", "MANIFEST")} {
		if _, err := os.Stat(filepath.Join(n.dir, f)); err != nil {
			t.Fatalf("a new data directory has no %s: %v", f, err)
		}
	}
	c.restart(n)
	if got := n.r.Incarnation(); got != inc {
		t.Fatalf("Incarnation() after a restart = %q, want %q", got, inc)
	}
}
