package main

import (
	"bytes"
	"strings"
	"testing"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// A range whose leader refuses (issue 31's wedge) is listed with a
// warning, not left out as healthy.
func TestStatusWarnsOfNotServingLeader(t *testing.T) {
	rs := []rangeStatus{{info: &tenurev1.RangeInfo{RangeId: "orders", Epoch: 2}}}
	rs[0].promotion = &tenurev1.RangePromotionState{RangeId: "orders", Epoch: 2, LeaderId: "r1", State: "not-serving"}
	var out bytes.Buffer
	if err := writePromotions(&out, promoterView{id: "p1", elected: true}, rs); err != nil {
		t.Fatal(err)
	}
	if got := normalize(out.String()); !strings.Contains(got, "orders not-serving 0 - WARNING: leader r1 refuses appends and reads") {
		t.Errorf("promotions = %q, want the not-serving range with a warning naming its leader", out.String())
	}
}
