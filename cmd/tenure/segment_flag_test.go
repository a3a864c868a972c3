package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// --segment-bytes outside 64 KiB to 1 GiB is refused before the replica
// opens anything.
func TestReplicaRefusesASegmentSizeOutOfBounds(t *testing.T) {
	for _, v := range []string{"65535", "1073741825", "0", "2GiB"} {
		dir := filepath.Join(t.TempDir(), "data")
		err := runReplica(context.Background(), []string{"--id", "r1", "--listen", "127.0.0.1:0", "--data-dir", dir, "--segment-bytes", v})
		if err == nil || !strings.Contains(err.Error(), ": want 65536 to 1073741824") {
			t.Errorf("replica --segment-bytes %s = %v, want the bounds named", v, err)
		}
	}
}
