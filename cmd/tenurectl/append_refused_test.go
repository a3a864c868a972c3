package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/internal/testnet"
	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
	"github.com/tenurelog/tenure/services/replica"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// A leader whose disk is below its reserve refuses an append before
// assigning offsets (README "A full disk"). produce used to retry that in
// silence for --retry-for and then say "Their outcome is unknown: they may
// still commit under a later leader", which sends an operator hunting for
// records that were never written. Now it says once that the disk is full
// while it retries, and at the end that nothing was written.
func TestProduceToAFullLeaderSaysNothingWasWritten(t *testing.T) {
	const id, rangeID = "r1", "full"
	r, srv, err := replica.Start(replica.Config{ID: id, DataDir: t.TempDir(), Logger: quietLogger(),
		StoreOptions: logstore.Options{DiskReserveBytes: 1 << 30, FreeBytes: func() (uint64, error) { return 1 << 20, nil }}}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close(); r.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A range of one replica, led by it: the promoter's fence and adopt,
	// sent by hand. The epoch-start record is written out of the reserve.
	rc := tenurev1connect.NewReplicaServiceClient(transport.NewHTTPClient(), srv.URL(), transport.ClientOptions()...)
	if _, err := rc.Fence(ctx, connect.NewRequest(&tenurev1.FenceRequest{RangeId: rangeID, Epoch: 1, FencerId: "test"})); err != nil {
		t.Fatalf("Fence(%s, 1) = %v", rangeID, err)
	}
	me := &tenurev1.Replica{Id: id, Address: srv.URL()}
	if _, err := rc.Adopt(ctx, connect.NewRequest(&tenurev1.AdoptRequest{RangeId: rangeID, Epoch: 1, Role: tenurev1.Role_ROLE_LEADER,
		LeaderId: id, LeaderAddress: srv.URL(), Replicas: []*tenurev1.Replica{me}})); err != nil {
		t.Fatalf("Adopt(%s, 1, leader) = %v", rangeID, err)
	}

	// No lease service: between retries produce looks for the leader
	// there, finds none and sends to the same replica again.
	var out, errOut bytes.Buffer
	leaseURL, promoterURL, empty, no := "http://"+testnet.ClosedAddr(t), "http://"+testnet.ClosedAddr(t), "", false
	cl := newClients(clusterOpts{lease: &leaseURL, promoter: &promoterURL, json: &no, cacert: &empty, cert: &empty, key: &empty})
	defer cl.close()
	p := &producer{c: cl, e: &env{stdout: &out, stderr: &errOut}, rangeID: rangeID, leader: me,
		id: bytes.Repeat([]byte{7}, 16), retryFor: 500 * time.Millisecond}
	err = p.append(ctx, [][]byte{[]byte("a")})
	if err == nil {
		t.Fatalf("produce to a leader whose disk is full succeeded: %s", out.String())
	}
	if msg := err.Error(); !strings.Contains(msg, "disk full") || !strings.Contains(msg, "Nothing of them was written") || strings.Contains(msg, "outcome is unknown") {
		t.Errorf("produce to a full leader failed with\n%s\nwant the disk-full refusal and \"Nothing of them was written\", not \"outcome is unknown\"", msg)
	}
	if lines := strings.Count(errOut.String(), "\n"); lines != 1 || !strings.Contains(errOut.String(), "disk full") || !strings.Contains(errOut.String(), "trying again for up to --retry-for 500ms") {
		t.Errorf("produce stderr while retrying:\n%s\nwant one line saying the disk is full and how long it retries", errOut.String())
	}
	if out.Len() != 0 {
		t.Errorf("produce printed %q for a refused append, want nothing", out.String())
	}

	// A plain append, never retried, says the same.
	errOut.Reset()
	p.id = nil
	if err := p.append(ctx, [][]byte{[]byte("b")}); err == nil || !strings.Contains(err.Error(), "Nothing of them was written") {
		t.Errorf("plain produce to a full leader: %v, want \"Nothing of them was written\"", err)
	}
}
