package promoter

import (
	"testing"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// A stream that breaks inside a revision is resumed from the revision
// before; events already handled are skipped, the rest are not lost.
func TestWatchPosReplaysLastRevisionOnce(t *testing.T) {
	ev := func(rangeID string, rev int64) *tenurev1.WatchLeasesResponse {
		return &tenurev1.WatchLeasesResponse{Type: tenurev1.LeaseEventType_LEASE_EVENT_TYPE_EXPIRED, RangeId: rangeID, Revision: rev}
	}
	var pos watchPos
	for _, e := range []*tenurev1.WatchLeasesResponse{ev("a", 5), ev("b", 7), ev("c", 7)} {
		if !pos.fresh(e) {
			t.Fatalf("first delivery of %s@%d not fresh", e.GetRangeId(), e.GetRevision())
		}
	}
	// The stream broke after c@7; revision 7 also held d. The replay starts
	// after revision 6 and delivers b, c, d again.
	var handled []string
	for _, e := range []*tenurev1.WatchLeasesResponse{ev("b", 7), ev("c", 7), ev("d", 7), ev("a", 8)} {
		if pos.fresh(e) {
			handled = append(handled, e.GetRangeId())
		}
	}
	if got := len(handled); got != 2 || handled[0] != "d" || handled[1] != "a" {
		t.Errorf("handled after replay = %v, want [d a]", handled)
	}
	if pos.fresh(ev("z", 3)) {
		t.Errorf("an event older than the position was fresh")
	}
}
