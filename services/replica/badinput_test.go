package replica_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// Bad input gets a clear Connect error and changes nothing.
func TestBadInput(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(2, r1, r2, r3)
	c.mustAppend(r1, values("x", 3)...)
	c.waitCaughtUp(r1, r2, r3)
	before := snapshot(c)

	ctx := ctxT(t)
	appendReq := func(n *node, rangeID string, recs ...[]byte) error {
		_, err := n.lc.Append(ctx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: rangeID, Records: recs}))
		return err
	}
	read := func(n *node, rangeID string, off uint64) error {
		_, err := n.lc.Read(ctx, connect.NewRequest(&tenurev1.ReadRequest{RangeId: rangeID, Offset: off}))
		return err
	}
	fetch := func(m *tenurev1.FetchRequest) error {
		_, err := r1.rc.Fetch(ctx, connect.NewRequest(m))
		return err
	}
	fence := func(n *node, rangeID string, epoch uint64) error {
		_, err := n.rc.Fence(ctx, connect.NewRequest(&tenurev1.FenceRequest{RangeId: rangeID, Epoch: epoch}))
		return err
	}
	truncate := func(n *node, rangeID string, epoch, to uint64) error {
		_, err := n.rc.Truncate(ctx, connect.NewRequest(&tenurev1.TruncateRequest{RangeId: rangeID, Epoch: epoch, TargetOffset: to}))
		return err
	}
	adopt := func(n *node, m *tenurev1.AdoptRequest) error {
		_, err := n.rc.Adopt(ctx, connect.NewRequest(m))
		return err
	}
	adoptReq := func(epoch uint64, role tenurev1.Role, leader *node, rs []*tenurev1.Replica) *tenurev1.AdoptRequest {
		return &tenurev1.AdoptRequest{RangeId: rangeID, Epoch: epoch, Role: role, LeaderId: leader.id, LeaderAddress: leader.url, Replicas: rs}
	}
	tooMany := make([][]byte, wire.MaxBatchRecords+1)
	for i := range tooMany {
		tooMany[i] = []byte{1}
	}
	fetchAt := func(epoch uint64, replicaID string, wait uint32) *tenurev1.FetchRequest {
		return &tenurev1.FetchRequest{RangeId: rangeID, Epoch: epoch, ReplicaId: replicaID, FetchOffset: 4, LastFetchedEpoch: 2, MaxWaitMs: wait}
	}
	all := replicas(c.nodes...)

	for _, tc := range []struct {
		name string
		call func() error
		code connect.Code
	}{
		{"Append to an unknown range", func() error { return appendReq(r1, "nope", []byte("a")) }, connect.CodeNotFound},
		{"Append with an invalid range id", func() error { return appendReq(r1, "bad/id", []byte("a")) }, connect.CodeInvalidArgument},
		{"Append with an empty range id", func() error { return appendReq(r1, "", []byte("a")) }, connect.CodeInvalidArgument},
		{"Append an empty batch", func() error { return appendReq(r1, rangeID) }, connect.CodeInvalidArgument},
		{"Append an oversized record", func() error { return appendReq(r1, rangeID, make([]byte, wire.MaxRecordBytes+1)) }, connect.CodeInvalidArgument},
		{"Append too many records", func() error { return appendReq(r1, rangeID, tooMany...) }, connect.CodeInvalidArgument},
		{"Append to a follower", func() error { return appendReq(r2, rangeID, []byte("a")) }, connect.CodeFailedPrecondition},
		{"Read from a follower", func() error { return read(r2, rangeID, 0) }, connect.CodeFailedPrecondition},
		{"Read an unknown range", func() error { return read(r1, "nope", 0) }, connect.CodeNotFound},
		{"Read past the HWM", func() error { return read(r1, rangeID, 100) }, connect.CodeOutOfRange},
		{"Fence at epoch 0", func() error { return fence(r2, rangeID, 0) }, connect.CodeInvalidArgument},
		{"Fence with an invalid range id", func() error { return fence(r2, "../etc", 3) }, connect.CodeInvalidArgument},
		{"Fence at an epoch from the past", func() error { return fence(r2, rangeID, 1) }, connect.CodeFailedPrecondition},
		{"Truncate an unknown range", func() error { return truncate(r2, "nope", 2, 0) }, connect.CodeNotFound},
		{"Truncate at epoch 0", func() error { return truncate(r2, rangeID, 0, 4) }, connect.CodeInvalidArgument},
		{"Truncate at a stale epoch", func() error { return truncate(r2, rangeID, 1, 4) }, connect.CodeFailedPrecondition},
		{"Truncate a follower", func() error { return truncate(r2, rangeID, 2, 4) }, connect.CodeFailedPrecondition},
		{"Adopt an unknown range", func() error {
			m := adoptReq(2, tenurev1.Role_ROLE_FOLLOWER, r1, all)
			m.RangeId = "nope"
			return adopt(r2, m)
		}, connect.CodeNotFound},
		{"Adopt at epoch 0", func() error { return adopt(r2, adoptReq(0, tenurev1.Role_ROLE_FOLLOWER, r1, all)) }, connect.CodeInvalidArgument},
		{"Adopt with no role", func() error { return adopt(r2, adoptReq(2, tenurev1.Role_ROLE_UNSPECIFIED, r1, all)) }, connect.CodeInvalidArgument},
		{"Adopt as fenced", func() error { return adopt(r2, adoptReq(2, tenurev1.Role_ROLE_FENCED, r1, all)) }, connect.CodeInvalidArgument},
		{"Adopt without self in the replica set", func() error {
			return adopt(r2, adoptReq(2, tenurev1.Role_ROLE_FOLLOWER, r1, replicas(r1, r3)))
		}, connect.CodeInvalidArgument},
		{"Adopt with a duplicate replica", func() error {
			return adopt(r2, adoptReq(2, tenurev1.Role_ROLE_FOLLOWER, r1, replicas(r1, r2, r2)))
		}, connect.CodeInvalidArgument},
		{"Adopt as leader naming another leader", func() error { return adopt(r2, adoptReq(2, tenurev1.Role_ROLE_LEADER, r1, all)) }, connect.CodeInvalidArgument},
		{"Adopt as follower of itself", func() error { return adopt(r2, adoptReq(2, tenurev1.Role_ROLE_FOLLOWER, r2, all)) }, connect.CodeInvalidArgument},
		{"Adopt at a stale epoch", func() error { return adopt(r2, adoptReq(1, tenurev1.Role_ROLE_FOLLOWER, r1, all)) }, connect.CodeFailedPrecondition},
		{"Adopt a different role at the adopted epoch", func() error { return adopt(r2, adoptReq(2, tenurev1.Role_ROLE_FOLLOWER, r3, all)) }, connect.CodeFailedPrecondition},
		{"Fetch at epoch 0", func() error { return fetch(fetchAt(0, r2.id, 0)) }, connect.CodeInvalidArgument},
		{"Fetch at a stale epoch", func() error { return fetch(fetchAt(1, r2.id, 0)) }, connect.CodeFailedPrecondition},
		{"Fetch at a future epoch", func() error { return fetch(fetchAt(3, r2.id, 0)) }, connect.CodeFailedPrecondition},
		{"Fetch from a stranger", func() error { return fetch(fetchAt(2, "r9", 0)) }, connect.CodeFailedPrecondition},
		{"Fetch by the leader itself", func() error { return fetch(fetchAt(2, r1.id, 0)) }, connect.CodeFailedPrecondition},
		{"Fetch with an invalid replica id", func() error { return fetch(fetchAt(2, "a b", 0)) }, connect.CodeInvalidArgument},
		{"Fetch with a too-long wait", func() error { return fetch(fetchAt(2, r2.id, wire.MaxFetchWaitMillis+1)) }, connect.CodeInvalidArgument},
		{"Fetch from a follower", func() error {
			_, err := r2.rc.Fetch(ctx, connect.NewRequest(fetchAt(2, r3.id, 0)))
			return err
		}, connect.CodeFailedPrecondition},
		{"GetEpochHistory of an unknown range", func() error {
			_, err := r1.rc.GetEpochHistory(ctx, connect.NewRequest(&tenurev1.GetEpochHistoryRequest{RangeId: "nope"}))
			return err
		}, connect.CodeNotFound},
		{"GetStatus of an unknown range", func() error {
			_, err := r1.rc.GetStatus(ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: "nope"}))
			return err
		}, connect.CodeNotFound},
	} {
		err := tc.call()
		wantCode(t, tc.name, err, tc.code)
		if ce := new(connect.Error); !errors.As(err, &ce) || ce.Message() == "" {
			t.Fatalf("%s: %v is not a Connect error with a message", tc.name, err)
		}
	}
	if after := snapshot(c); after != before {
		t.Fatalf("bad input changed state:\nbefore %s\nafter  %s", before, after)
	}
	// The follower reads answer names the leader it knows.
	err := read(r2, rangeID, 0)
	if !strings.Contains(err.Error(), "r1") {
		t.Fatalf("follower's read refusal %q does not name the leader r1", err)
	}
}

// snapshot summarises every node's durable view of the range.
func snapshot(c *cluster) string {
	var b strings.Builder
	for _, n := range c.nodes {
		st, h := c.status(n), c.history(n)
		fmt.Fprintf(&b, "%s{%s fenced=%d epoch=%d end=%d hwm=%d leader=%s history=%v} ", n.id, st.GetRole(), st.GetFencedEpoch(), st.GetEpoch(), st.GetLogEnd(), st.GetHighWaterMark(), st.GetLeaderId(), h.GetHistory())
	}
	return b.String()
}

// Tail streams committed records as the HWM passes them.
func TestTailStreamsCommittedRecords(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("a", 3)...)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := r1.lc.Tail(ctx, connect.NewRequest(&tenurev1.TailRequest{RangeId: rangeID, Offset: 1}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	var mu sync.Mutex
	var got []*tenurev1.Record
	done := make(chan error, 1)
	go func() {
		for stream.Receive() {
			mu.Lock()
			got = append(got, stream.Msg().GetRecords()...)
			n := len(got)
			mu.Unlock()
			if n >= 3+5+5 {
				done <- nil
				return
			}
		}
		done <- stream.Err()
	}()
	c.mustAppend(r1, values("b", 5)...)
	c.mustAppend(r1, values("c", 5)...)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("tail ended: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("tail did not deliver the committed records")
	}
	mu.Lock()
	defer mu.Unlock()
	for i, r := range got {
		if r.GetOffset() != uint64(i+1) {
			t.Fatalf("tail record %d has offset %d, want contiguous from 1", i, r.GetOffset())
		}
	}
}

// fakeLease is a LeaseGuard the test revokes at will.
type fakeLease struct {
	mu      sync.Mutex
	held    map[string]bool
	revoked bool
}

func (l *fakeLease) key(rangeID string, epoch uint64) string {
	return fmt.Sprintf("%s@%d", rangeID, epoch)
}

func (l *fakeLease) Hold(rangeID string, epoch uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held == nil {
		l.held = map[string]bool{}
	}
	l.held[l.key(rangeID, epoch)] = true
}

func (l *fakeLease) Drop(rangeID string, epoch uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.held, l.key(rangeID, epoch))
}

func (l *fakeLease) Valid(rangeID string, epoch uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held[l.key(rangeID, epoch)] && !l.revoked
}

func (l *fakeLease) revoke(v bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.revoked = v
}

// A leader whose lease is not valid stops acknowledging appends and serving
// reads; waiting appends fail.
func TestLeaderWithoutLeaseStopsServing(t *testing.T) {
	c := newCluster(t, 3)
	r1, r2, r3 := c.node(1), c.node(2), c.node(3)
	lease := &fakeLease{}
	r1.lease = lease
	c.restart(r1)
	c.elect(1, r1, r2, r3)
	c.mustAppend(r1, values("a", 2)...)
	if st := c.status(r1); !st.GetLeaseValid() {
		t.Fatalf("status lease_valid = false with a held lease")
	}

	r2.gate.block()
	r3.gate.block()
	waiting := make(chan error, 1)
	go func() {
		_, err := c.append(ctxT(t), r1, []byte("waits"))
		waiting <- err
	}()
	waitUntil(t, 5*time.Second, "the waiting append", func() bool { return c.status(r1).GetLogEnd() == 4 })
	lease.revoke(true)
	select {
	case err := <-waiting:
		wantCode(t, "waiting append after the lease was lost", err, connect.CodeFailedPrecondition)
	case <-time.After(5 * time.Second):
		t.Fatal("waiting append not failed after the lease was lost")
	}
	_, err := c.append(ctxT(t), r1, []byte("new"))
	wantCode(t, "append without a lease", err, connect.CodeFailedPrecondition)
	_, err = r1.lc.Read(ctxT(t), connect.NewRequest(&tenurev1.ReadRequest{RangeId: rangeID}))
	wantCode(t, "read without a lease", err, connect.CodeFailedPrecondition)
	if st := c.status(r1); st.GetLeaseValid() {
		t.Fatal("status lease_valid = true after the lease was lost")
	}

	// A fence drops the lease of the deposed epoch.
	lease.revoke(false)
	c.mustFence(r1, 2)
	if lease.Valid(rangeID, 1) {
		t.Fatal("the fence did not drop the lease of epoch 1")
	}
}
