package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// A bad --id is named as the replica id it is, with what is wrong with it
// and the grammar. The shared check (wire.ValidateRangeID) said "range id",
// as if a range were wrong.
func TestReplicaIDErrorNamesTheReplicaID(t *testing.T) {
	for id, want := range map[string]string{
		"a/b":                    `--id: replica id "a/b" has byte '/' at 1; allowed: letters, digits, '.', '_', '-'`,
		".r1":                    `--id: replica id ".r1" starts with '.'`,
		strings.Repeat("r", 129): "--id: replica id is 129 bytes, at most 128",
	} {
		dir := filepath.Join(t.TempDir(), "data")
		err := runReplica(context.Background(), []string{"--id", id, "--listen", "127.0.0.1:0", "--data-dir", dir})
		if err == nil || err.Error() != want {
			t.Errorf("replica --id %s = %v, want %s", id, err, want)
		}
		if got := exitStatus(err); got != exitUsage {
			t.Errorf("replica --id %s: exit status %d, want %d (invoked wrongly)", id, got, exitUsage)
		}
	}
}
