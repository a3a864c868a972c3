package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// A replica whose disk is full gets one DISK FULL line, whatever the number
// of ranges it is in, and --json carries every replica's disk fields.
func TestStatusShowsDiskFullReplicaOnce(t *testing.T) {
	full := &tenurev1.DiskStatus{Full: true, Reason: "1048576 bytes free, below the reserve of 268435456", FreeBytes: 1 << 20, ReserveBytes: 256 << 20, UsedBytes: 3 << 30, FullSinceUnixMs: 1}
	room := &tenurev1.DiskStatus{FreeBytes: 10 << 30, ReserveBytes: 256 << 20, UsedBytes: 1 << 30}
	rng := func(id string) rangeStatus {
		return rangeStatus{info: &tenurev1.RangeInfo{RangeId: id, Epoch: 3}, members: []memberStatus{
			{replica: &tenurev1.Replica{Id: "r1"}, disk: room, status: &tenurev1.RangeStatus{RangeId: id, Role: tenurev1.Role_ROLE_LEADER, Epoch: 3, FencedEpoch: 3, LogEnd: 9, HighWaterMark: 9, LeaseValid: true}},
			{replica: &tenurev1.Replica{Id: "r2"}, disk: full, status: &tenurev1.RangeStatus{RangeId: id, Role: tenurev1.Role_ROLE_FOLLOWER, Epoch: 3, FencedEpoch: 3, LogEnd: 7, HighWaterMark: 7}},
		}}
	}
	rs := []rangeStatus{rng("a"), rng("b")}
	var out bytes.Buffer
	if err := writeStatusTable(&out, rs); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "DISK FULL"); n != 1 {
		t.Fatalf("status has %d DISK FULL lines, want 1:\n%s", n, out.String())
	}
	if !strings.Contains(out.String(), "replica r2: DISK FULL since 00:00:00: 1048576 bytes free, below the reserve of 268435456 (free 1.0MiB, reserve 256.0MiB, its files use 3.0GiB)") {
		t.Errorf("status lacks r2's DISK FULL line with its reason and sizes:\n%s", out.String())
	}
	out.Reset()
	if err := writeStatusJSON(&out, rs, promoterView{elected: true}); err != nil {
		t.Fatal(err)
	}
	var got []statusJSON
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("status JSON %q: %v", out.String(), err)
	}
	r1, r2 := got[0].Replicas[0], got[0].Replicas[1]
	if r1.DiskFull || r1.DiskFreeBytes != 10<<30 || r1.DiskReserveBytes != 256<<20 || r1.DiskUsedBytes != 1<<30 {
		t.Errorf("r1 JSON = %+v, want not full, 10 GiB free, 256 MiB reserve, 1 GiB used", r1)
	}
	if !r2.DiskFull || r2.DiskFreeBytes != 1<<20 || !strings.Contains(r2.DiskFullReason, "below the reserve") {
		t.Errorf("r2 JSON = %+v, want full with its reason", r2)
	}
}
