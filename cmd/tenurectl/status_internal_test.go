package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// haltedRange is a range whose follower r2 stopped on a safety violation.
func haltedRange() []rangeStatus {
	return []rangeStatus{{
		info: &tenurev1.RangeInfo{RangeId: "orders", Epoch: 3},
		members: []memberStatus{
			{replica: &tenurev1.Replica{Id: "r1"}, status: &tenurev1.RangeStatus{RangeId: "orders", Role: tenurev1.Role_ROLE_LEADER, Epoch: 3, FencedEpoch: 3, LogEnd: 9, HighWaterMark: 9, LeaseValid: true}},
			{replica: &tenurev1.Replica{Id: "r2"}, status: &tenurev1.RangeStatus{RangeId: "orders", Role: tenurev1.Role_ROLE_FOLLOWER, Epoch: 3, FencedEpoch: 3, LogEnd: 7, HighWaterMark: 7,
				Halted: `range "orders": leader r1 at epoch 3 answers that our log diverges at 5 (its epoch 2 ends at 5), below our HWM 7: a committed record disagrees; not truncating, not fetching`}},
		},
	}}
}

func TestStatusShowsHaltedReplica(t *testing.T) {
	var out bytes.Buffer
	if err := writeStatusTable(&out, haltedRange()); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out.String(), "\n")
	var r1, r2 string
	for _, l := range lines {
		switch {
		case strings.Contains(l, " r1  ") && strings.Contains(l, "leader "):
			r1 = l
		case strings.Contains(l, " r2  ") && strings.Contains(l, "follower "):
			r2 = l
		}
	}
	if !strings.Contains(r2, "HALTED: range \"orders\": leader r1") || len(r2) > 200 {
		t.Errorf("r2's row = %q, want a HALTED note with the start of the reason, cut to a cell", r2)
	}
	if strings.Contains(r1, "HALTED") {
		t.Errorf("r1's row = %q, want no HALTED note", r1)
	}

	out.Reset()
	if err := writeStatusJSON(&out, haltedRange()); err != nil {
		t.Fatal(err)
	}
	var got []statusJSON
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("status JSON %q: %v", out.String(), err)
	}
	if h := got[0].Replicas[1].Halted; !strings.Contains(h, "below our HWM 7") {
		t.Errorf("r2 JSON halted = %q, want the whole reason", h)
	}
	if h := got[0].Replicas[0].Halted; h != "" || strings.Contains(out.String(), `"halted": ""`) {
		t.Errorf("r1 JSON halted = %q, want the field left out", h)
	}
}
