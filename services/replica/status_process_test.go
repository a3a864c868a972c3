package replica_test

import (
	"os"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// GetStatus names the process that answers and when the replica started,
// so an operator can tell a restarted replica from the one before it
// (tenurectl status prints both).
func TestStatusNamesProcessAndStart(t *testing.T) {
	before := time.Now().UnixMilli()
	c := newCluster(t, 1)
	n := c.node(1)
	status := func() *tenurev1.ReplicaServiceGetStatusResponse {
		t.Helper()
		st, err := n.rc.GetStatus(ctxT(t), connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		return st.Msg
	}
	first := status()
	if first.GetPid() != int64(os.Getpid()) {
		t.Errorf("GetStatus pid = %d, want this process's %d", first.GetPid(), os.Getpid())
	}
	if s := first.GetStartedUnixMs(); s < before || s > time.Now().UnixMilli() {
		t.Errorf("GetStatus started_unix_ms = %d, want between %d and now", s, before)
	}

	restarted := time.Now().UnixMilli()
	c.restart(n)
	if s := status().GetStartedUnixMs(); s < restarted {
		t.Errorf("GetStatus started_unix_ms after a restart = %d, want at least %d (the restart), not the first start's %d", s, restarted, first.GetStartedUnixMs())
	}
}
