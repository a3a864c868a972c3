package promoter

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tenurelog/tenure/services/lease/leasetest"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// TestTransitionRecordsAreBounded: a range promoted for months must not
// grow its transition records in etcd without end. Writing a record keeps
// the newest KeepTransitions epochs of that range and deletes the rest;
// another range's records are untouched; records of one range far apart in
// one batch (a put inside the same transaction's delete range is refused
// by etcd) are still written.
func TestTransitionRecordsAreBounded(t *testing.T) {
	env := leasetest.Start(t)
	p, err := New(Config{ID: "p1", Etcd: env.EtcdClient, LeaseURL: env.Server.URL(), Logger: testLogger(), KeepTransitions: 5})
	if err != nil {
		t.Fatal(err)
	}
	if p.cfg.KeepTransitions != recordedHWMs {
		t.Fatalf("KeepTransitions 5 became %d, want the floor %d (unsafe promotions read that many)", p.cfg.KeepTransitions, recordedHWMs)
	}
	keep := uint64(p.cfg.KeepTransitions)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	record := func(rangeID string, epoch uint64) {
		t.Helper()
		if err := p.recordTransition(ctx, &tenurev1.Transition{RangeId: rangeID, Epoch: epoch, Reason: "test"}); err != nil {
			t.Fatalf("record %s@%d: %v", rangeID, epoch, err)
		}
	}
	epochs := func(rangeID string) []uint64 {
		t.Helper()
		trs, err := p.transitions(ctx, rangeID, maxTransitions)
		if err != nil {
			t.Fatal(err)
		}
		var out []uint64
		for _, tr := range trs {
			out = append(out, tr.GetEpoch())
		}
		return out
	}
	for e := uint64(1); e <= 3; e++ {
		record("other", e)
	}
	const last = 70
	for e := uint64(1); e <= last; e++ {
		record("busy", e)
	}
	got := epochs("busy")
	if uint64(len(got)) != keep || got[0] != last || got[len(got)-1] != last-keep+1 {
		t.Fatalf("busy's records after %d epochs = %v, want the newest %d (%d..%d)", last, got, keep, last-keep+1, last)
	}
	if got := epochs("other"); len(got) != 3 {
		t.Fatalf("other's records = %v, want its 3 untouched", got)
	}

	// Two records of one range in one transaction, far apart.
	var batch []pendingRecord
	for _, e := range []uint64{200, 200 + 3*keep} {
		b, err := proto.Marshal(&tenurev1.Transition{RangeId: "busy", Epoch: e})
		if err != nil {
			t.Fatal(err)
		}
		batch = append(batch, pendingRecord{key: p.transitionKey("busy", e), val: b, rangeID: "busy", epoch: e})
	}
	if err := p.writeBatch(batch); err != nil {
		t.Fatalf("batch of two records of one range: %v", err)
	}
	// The batch pruned below its lowest epoch (200), so 200 and the one
	// above are there; the next record prunes 200 away.
	got = epochs("busy")
	if len(got) != 2 || got[0] != 200+3*keep || got[1] != 200 {
		t.Fatalf("busy's records after the batch = %v, want [%d 200]", got, 200+3*keep)
	}
	record("busy", 201+3*keep)
	if got := epochs("busy"); len(got) != 2 || got[1] != 200+3*keep {
		t.Fatalf("busy's records after one more = %v, want the two newest", got)
	}
}
