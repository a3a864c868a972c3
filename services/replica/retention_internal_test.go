package replica

import (
	"testing"
	"time"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// logView is a range's log as retentionTarget reads it: fixed answers.
type logView struct {
	start, hwm   uint64
	byBytes      uint64    // RetainBytes' answer
	bySince      uint64    // RetainSince's answer
	askedBytes   uint64    // the limit RetainBytes was asked
	askedSince   time.Time // the time RetainSince was asked
	bytes, since bool      // whether each was asked
}

func (v *logView) LogStart() uint64 { return v.start }
func (v *logView) HWM() uint64      { return v.hwm }
func (v *logView) RetainBytes(limit uint64) uint64 {
	v.bytes, v.askedBytes = true, limit
	return v.byBytes
}
func (v *logView) RetainSince(t time.Time) uint64 {
	v.since, v.askedSince = true, t
	return v.bySince
}

func TestRetentionTarget(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for _, tt := range []struct {
		name       string
		p          *tenurev1.RetentionPolicy
		v          logView
		want       uint64
		bytes, age bool // which limits were consulted
	}{
		{"unlimited keeps the start", &tenurev1.RetentionPolicy{}, logView{start: 5, hwm: 100, byBytes: 90, bySince: 90}, 5, false, false},
		{"size alone", &tenurev1.RetentionPolicy{MaxBytes: 1 << 20}, logView{start: 5, hwm: 100, byBytes: 40}, 40, true, false},
		{"age alone", &tenurev1.RetentionPolicy{MaxAgeMs: 60_000}, logView{start: 5, hwm: 100, bySince: 30}, 30, false, true},
		{"both: the larger start wins (outside either limit goes)", &tenurev1.RetentionPolicy{MaxBytes: 1, MaxAgeMs: 1}, logView{start: 5, hwm: 100, byBytes: 40, bySince: 70}, 70, true, true},
		{"both, size larger", &tenurev1.RetentionPolicy{MaxBytes: 1, MaxAgeMs: 1}, logView{start: 5, hwm: 100, byBytes: 80, bySince: 70}, 80, true, true},
		// Only committed records go: a limit asking past the HWM stops there.
		{"clamped to the HWM", &tenurev1.RetentionPolicy{MaxBytes: 1}, logView{start: 5, hwm: 50, byBytes: 90}, 50, true, false},
		{"never below the start", &tenurev1.RetentionPolicy{MaxBytes: 1, MaxAgeMs: 1}, logView{start: 60, hwm: 100, byBytes: 10, bySince: 20}, 60, true, true},
	} {
		v := tt.v
		if got, _ := retentionTarget(&v, tt.p, now); got != tt.want {
			t.Errorf("%s: retentionTarget = %d, want %d", tt.name, got, tt.want)
		}
		if v.bytes != tt.bytes || v.since != tt.age {
			t.Errorf("%s: consulted size %v, age %v; want %v, %v", tt.name, v.bytes, v.since, tt.bytes, tt.age)
		}
		if v.bytes && v.askedBytes != tt.p.GetMaxBytes() {
			t.Errorf("%s: RetainBytes(%d), want the policy's %d", tt.name, v.askedBytes, tt.p.GetMaxBytes())
		}
		if want := now.Add(-time.Duration(tt.p.GetMaxAgeMs()) * time.Millisecond); v.since && !v.askedSince.Equal(want) {
			t.Errorf("%s: RetainSince(%v), want now - max_age = %v", tt.name, v.askedSince, want)
		}
	}
}
