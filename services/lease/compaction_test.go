package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/lease"
	"github.com/tenurelog/tenure/services/lease/leasetest"
)

// etcd keeps every revision until it is compacted, and nothing in tenure
// compacted it: against an etcd run without --auto-compaction-* (etcd's
// default), epoch grants, binds, membership changes and transition records
// grew its backend for as long as the cluster ran, up to its quota, after
// which etcd refuses every write. The lease service now compacts, keeping
// one interval of history.
func TestLeaseServiceCompactsEtcdHistory(t *testing.T) {
	const every = 200 * time.Millisecond
	env := leasetest.Start(t, lease.WithCompaction(every))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rs := []*tenurev1.Replica{{Id: "r1", Address: "http://127.0.0.1:1"}}
	if _, err := env.Client.CreateRange(ctx, connect.NewRequest(&tenurev1.CreateRangeRequest{RangeId: "c", Replicas: rs})); err != nil {
		t.Fatal(err)
	}
	old, err := env.EtcdClient.Get(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	before := old.Header.Revision
	// History after it: the revision itself must go once an interval
	// has passed over it, and the present stays readable.
	for i := range 5 {
		p := &tenurev1.RetentionPolicy{MaxBytes: uint64(1+i) << 20}
		if _, err := env.Client.SetRetention(ctx, connect.NewRequest(&tenurev1.SetRetentionRequest{RangeId: "c", Retention: p})); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := env.EtcdClient.Get(ctx, "/", clientv3.WithRev(before))
		if errors.Is(err, rpctypes.ErrCompacted) {
			break
		}
		if err != nil {
			t.Fatalf("Get at revision %d = %v", before, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("revision %d still readable after %v: etcd's history is not compacted", before, 20*time.Second)
		}
		time.Sleep(every / 2)
	}
	if _, err := env.Client.GetRange(ctx, connect.NewRequest(&tenurev1.GetRangeRequest{RangeId: "c"})); err != nil {
		t.Fatalf("GetRange after compaction = %v", err)
	}
}
