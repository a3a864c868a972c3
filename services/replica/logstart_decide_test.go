package replica

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tenurelog/tenure/pkg/journal"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// A leader whose log starts above 0 answers a follower below its start, or
// one whose last epoch precedes its trimmed history, with below_log_start,
// never with a divergence it cannot compute; every other pair is decided as
// checkFetch decides it. A reset follower (empty log at its start) is
// accepted from the leader's log start up to its log end.
func TestCheckFetchFrom(t *testing.T) {
	// Epoch 3 was in force at the log start 100 (kept), epoch 5 began at 150;
	// epochs 1 and 2 (below 40) were trimmed. Log end 200.
	trimmed := es(3, 40, 5, 150)
	full := es(1, 0, 3, 40, 5, 150)
	for _, tc := range []struct {
		name             string
		h                []journal.EpochStart
		start            uint64
		lastEpoch, fetch uint64
		want             *tenurev1.DivergingEpoch
		below            bool
	}{
		{"untrimmed: as checkFetch", full, 0, 3, 160, &tenurev1.DivergingEpoch{Epoch: 3, EndOffset: 150}, false},
		{"untrimmed: caught up", full, 0, 5, 200, nil, false},
		{"untrimmed: empty log from 0", full, 0, 0, 0, nil, false},
		{"below the log start", trimmed, 100, 3, 90, nil, true},
		{"empty log from 0 below the start", trimmed, 100, 0, 0, nil, true},
		{"at the log start, epoch kept", trimmed, 100, 3, 100, nil, false},
		{"above the start, diverging in a kept epoch", trimmed, 100, 3, 160, &tenurev1.DivergingEpoch{Epoch: 3, EndOffset: 150}, false},
		{"caught up", trimmed, 100, 5, 200, nil, false},
		{"last epoch trimmed away", trimmed, 100, 2, 120, nil, true},
		{"last epoch never on this leader, below the first kept", trimmed, 100, 1, 100, nil, true},
		{"an epoch between kept entries", trimmed, 100, 4, 160, &tenurev1.DivergingEpoch{Epoch: 3, EndOffset: 150}, false},
		{"reset follower at the leader's start", trimmed, 100, 0, 100, nil, false},
		{"reset follower above the leader's start", trimmed, 100, 0, 180, nil, false},
		{"reset follower at the leader's log end", trimmed, 100, 0, 200, nil, false},
		{"reset follower below the leader's start", trimmed, 100, 0, 60, nil, true},
		{"reset follower beyond the leader's log end", trimmed, 100, 0, 201, &tenurev1.DivergingEpoch{}, false},
		{"reset follower, untrimmed leader", full, 0, 0, 120, nil, false},
	} {
		d, below := checkFetchFrom(tc.h, tc.start, 200, tc.lastEpoch, tc.fetch)
		if below != tc.below || !proto.Equal(d, tc.want) {
			t.Errorf("%s: checkFetchFrom(%v, %d, 200, %d, %d) = %v, %v; want %v, %v", tc.name, tc.h, tc.start, tc.lastEpoch, tc.fetch, d, below, tc.want, tc.below)
		}
	}
}

// A follower acts on a leader's log start only when it is consistent: never
// above the leader's HWM, and a below_log_start answer carries nothing else
// and a positive start.
func TestValidateFetchAnswerLogStart(t *testing.T) {
	rec := &tenurev1.Record{Offset: 10, Epoch: 3, Value: []byte("a")}
	for _, tc := range []struct {
		name string
		a    *tenurev1.FetchResponse
		ok   bool
	}{
		{"records with a log start below the offset", &tenurev1.FetchResponse{Epoch: 3, LogStart: 8, HighWaterMark: 10, LogEnd: 20, Records: []*tenurev1.Record{rec}}, true},
		{"log start 0 (an older leader)", &tenurev1.FetchResponse{Epoch: 3, HighWaterMark: 10, LogEnd: 20, Records: []*tenurev1.Record{rec}}, true},
		{"below the log start", &tenurev1.FetchResponse{Epoch: 3, LogStart: 15, LogEnd: 20, BelowLogStart: true}, true},
		{"below a log start beyond the log end", &tenurev1.FetchResponse{Epoch: 3, LogStart: 21, LogEnd: 20, BelowLogStart: true}, false},
		{"log start above the HWM", &tenurev1.FetchResponse{Epoch: 3, LogStart: 11, HighWaterMark: 10, LogEnd: 20}, false},
		{"accepted an offset below its log start", &tenurev1.FetchResponse{Epoch: 3, LogStart: 11, HighWaterMark: 12, LogEnd: 20, Records: []*tenurev1.Record{rec}}, false},
		{"below a log start of 0", &tenurev1.FetchResponse{Epoch: 3, HighWaterMark: 10, LogEnd: 20, BelowLogStart: true}, false},
		{"below the log start with records", &tenurev1.FetchResponse{Epoch: 3, LogStart: 15, HighWaterMark: 18, LogEnd: 20, BelowLogStart: true, Records: []*tenurev1.Record{rec}}, false},
		{"below the log start with a divergence", &tenurev1.FetchResponse{Epoch: 3, LogStart: 15, HighWaterMark: 18, LogEnd: 20, BelowLogStart: true, Diverging: &tenurev1.DivergingEpoch{Epoch: 2, EndOffset: 9}}, false},
	} {
		err := validateFetchAnswer(3, 10, 2, tc.a)
		if (err == nil) != tc.ok {
			t.Errorf("%s: validateFetchAnswer = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}
