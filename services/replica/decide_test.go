package replica

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tenurelog/tenure/pkg/journal"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

func TestCommitPoint(t *testing.T) {
	for _, tc := range []struct {
		name       string
		own        uint64
		followers  []uint64
		replicas   int
		epochStart uint64
		want       uint64
		ok         bool
	}{
		{"quorum of leader and one follower", 10, []uint64{8, 5}, 3, 3, 8, true},
		{"no follower has fetched", 10, nil, 3, 3, 0, false},
		{"followers alone make a quorum: the leader's fsync runs in parallel", 2, []uint64{10, 10}, 3, 1, 10, true},
		{"quorum offset at the epoch-start record is not above it", 4, []uint64{3, 3}, 3, 3, 0, false},
		{"quorum offset just past the epoch-start record", 4, []uint64{4, 1}, 3, 3, 4, true},
		{"earlier epochs' records wait for this epoch's", 100, []uint64{100, 100}, 3, 100, 0, false},
		{"single replica commits alone", 5, nil, 1, 0, 5, true},
		{"single replica before its epoch-start record is durable", 0, nil, 1, 0, 0, false},
		{"five replicas need three", 10, []uint64{9, 8, 7, 6}, 5, 0, 8, true},
		{"five replicas with two silent", 10, []uint64{9}, 5, 0, 0, false},
		{"more followers than members: refused", 10, []uint64{10, 10, 10}, 3, 0, 0, false},
		{"no replicas: refused", 10, nil, 0, 0, 0, false},
	} {
		got, ok := commitPoint(tc.own, tc.followers, tc.replicas, tc.epochStart)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: commitPoint(%d, %v, %d, %d) = %d, %v; want %d, %v", tc.name, tc.own, tc.followers, tc.replicas, tc.epochStart, got, ok, tc.want, tc.ok)
		}
	}
}

func es(pairs ...uint64) []journal.EpochStart {
	out := make([]journal.EpochStart, 0, len(pairs)/2)
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, journal.EpochStart{Epoch: pairs[i], Start: pairs[i+1]})
	}
	return out
}

func TestCheckFetch(t *testing.T) {
	leader := es(1, 0, 3, 10) // log end 15
	for _, tc := range []struct {
		name             string
		h                []journal.EpochStart
		lastEpoch, fetch uint64
		want             *tenurev1.DivergingEpoch // nil: counts
	}{
		{"empty follower log", leader, 0, 0, nil},
		{"inside epoch 1", leader, 1, 5, nil},
		{"at the end of epoch 1", leader, 1, 10, nil},
		{"past the end of epoch 1", leader, 1, 11, &tenurev1.DivergingEpoch{Epoch: 1, EndOffset: 10}},
		{"an epoch the leader never had", leader, 2, 12, &tenurev1.DivergingEpoch{Epoch: 1, EndOffset: 10}},
		{"caught up", leader, 3, 15, nil},
		{"inside the last epoch", leader, 3, 12, nil},
		{"beyond the leader's log end", leader, 3, 16, &tenurev1.DivergingEpoch{Epoch: 3, EndOffset: 15}},
		{"an epoch above the leader's", leader, 4, 15, &tenurev1.DivergingEpoch{Epoch: 3, EndOffset: 15}},
		{"records under epoch 0", leader, 0, 5, &tenurev1.DivergingEpoch{}},
		{"leader history unknown", nil, 1, 5, &tenurev1.DivergingEpoch{}},
		{"follower's epoch below all the leader's", es(2, 0), 1, 3, &tenurev1.DivergingEpoch{}},
	} {
		got := checkFetch(tc.h, 15, tc.lastEpoch, tc.fetch)
		if !proto.Equal(got, tc.want) {
			t.Errorf("%s: checkFetch(%v, 15, %d, %d) = %v, want %v", tc.name, tc.h, tc.lastEpoch, tc.fetch, got, tc.want)
		}
	}
}

func TestFollowerTruncateTarget(t *testing.T) {
	for _, tc := range []struct {
		name        string
		d           *tenurev1.DivergingEpoch
		own         []journal.EpochStart
		logEnd, hwm uint64
		want        uint64
		ok          bool
	}{
		{"the leader's epoch ends first", &tenurev1.DivergingEpoch{Epoch: 1, EndOffset: 10}, es(1, 0, 2, 12), 20, 5, 10, true},
		{"our later epoch starts first (KIP-279)", &tenurev1.DivergingEpoch{Epoch: 1, EndOffset: 100}, es(1, 0, 2, 50), 60, 10, 50, true},
		{"an older covering epoch: cut to our own end of it", &tenurev1.DivergingEpoch{Epoch: 2, EndOffset: 100}, es(1, 0, 3, 50), 70, 0, 50, true},
		{"nothing past our log end", &tenurev1.DivergingEpoch{Epoch: 1, EndOffset: 30}, es(1, 0), 20, 0, 20, true},
		{"exactly at the HWM", &tenurev1.DivergingEpoch{Epoch: 1, EndOffset: 6}, es(1, 0, 2, 8), 10, 6, 6, true},
		{"below the HWM is a violation", &tenurev1.DivergingEpoch{Epoch: 1, EndOffset: 5}, es(1, 0, 2, 8), 10, 6, 5, false},
		{"the leader vouches for nothing", &tenurev1.DivergingEpoch{}, es(1, 0), 4, 4, 0, false},
		{"the leader vouches for nothing, nothing committed", &tenurev1.DivergingEpoch{}, es(1, 0), 4, 0, 0, true},
		{"our history unknown: keep only the HWM", &tenurev1.DivergingEpoch{Epoch: 1, EndOffset: 10}, nil, 20, 7, 7, true},
		{"all our epochs above the leader's", &tenurev1.DivergingEpoch{Epoch: 2, EndOffset: 30}, es(3, 5), 20, 0, 0, true},
	} {
		got, ok := followerTruncateTarget(tc.d, tc.own, tc.logEnd, tc.hwm)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: followerTruncateTarget(%v, %v, %d, %d) = %d, %v; want %d, %v", tc.name, tc.d, tc.own, tc.logEnd, tc.hwm, got, ok, tc.want, tc.ok)
		}
	}
}

func TestValidateFetchAnswer(t *testing.T) {
	rec := func(off, epoch uint64, v string) *tenurev1.Record {
		return &tenurev1.Record{Offset: off, Epoch: epoch, Value: []byte(v)}
	}
	answer := func(recs ...*tenurev1.Record) *tenurev1.FetchResponse {
		return &tenurev1.FetchResponse{Epoch: 3, Records: recs, HighWaterMark: 10, LogEnd: 20}
	}
	// The follower fetches at offset 10 with last fetched epoch 2, following epoch 3.
	for _, tc := range []struct {
		name string
		a    *tenurev1.FetchResponse
		ok   bool
	}{
		{"records continuing the log", answer(rec(10, 2, "a"), rec(11, 3, ""), rec(12, 3, "b")), true},
		{"nothing new", answer(), true},
		{"a divergence", &tenurev1.FetchResponse{Epoch: 3, LogEnd: 20, Diverging: &tenurev1.DivergingEpoch{Epoch: 1, EndOffset: 8}}, true},
		{"another epoch's leader", &tenurev1.FetchResponse{Epoch: 4, LogEnd: 20}, false},
		{"an older epoch's leader", &tenurev1.FetchResponse{Epoch: 2, LogEnd: 20}, false},
		{"HWM beyond the log end", &tenurev1.FetchResponse{Epoch: 3, HighWaterMark: 21, LogEnd: 20}, false},
		{"a divergence with records", &tenurev1.FetchResponse{Epoch: 3, LogEnd: 20, Records: []*tenurev1.Record{rec(10, 3, "")}, Diverging: &tenurev1.DivergingEpoch{Epoch: 1, EndOffset: 8}}, false},
		{"a diverging epoch above ours", &tenurev1.FetchResponse{Epoch: 3, LogEnd: 20, Diverging: &tenurev1.DivergingEpoch{Epoch: 3, EndOffset: 8}}, false},
		{"a diverging end beyond the log", &tenurev1.FetchResponse{Epoch: 3, LogEnd: 20, Diverging: &tenurev1.DivergingEpoch{Epoch: 2, EndOffset: 21}}, false},
		{"a gap", answer(rec(10, 2, "a"), rec(12, 2, "b")), false},
		{"not at the fetch offset", answer(rec(9, 2, "a")), false},
		{"a missing record", answer(rec(10, 2, "a"), nil), false},
		{"an epoch going back", answer(rec(10, 3, "a"), rec(11, 2, "b")), false},
		{"an epoch below our last", answer(rec(10, 1, "a")), false},
		{"an epoch above the leader's", answer(rec(10, 4, "a")), false},
		{"epoch 0", &tenurev1.FetchResponse{Epoch: 3, LogEnd: 20, Records: []*tenurev1.Record{rec(10, 0, "a")}}, false},
		{"an epoch-start record with data", answer(&tenurev1.Record{Offset: 10, Epoch: 3, Value: []byte("x"), EpochStart: true}), false},
		{"records past the leader's log end", &tenurev1.FetchResponse{Epoch: 3, LogEnd: 11, Records: []*tenurev1.Record{rec(10, 2, "a"), rec(11, 2, "b")}}, false},
		{"a log end below the fetch offset", &tenurev1.FetchResponse{Epoch: 3, LogEnd: 9}, false},
	} {
		err := validateFetchAnswer(3, 10, 2, tc.a)
		if (err == nil) != tc.ok {
			t.Errorf("%s: validateFetchAnswer = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

func TestBackoffBounded(t *testing.T) {
	var b backoff
	for i := 0; i < 100; i++ {
		d := b.next()
		if d < fetchBackoffMin/2 || d > fetchBackoffMax {
			t.Fatalf("backoff %d = %v, want within [%v, %v]", i, d, fetchBackoffMin/2, fetchBackoffMax)
		}
	}
	b.reset()
	if d := b.next(); d > fetchBackoffMin {
		t.Fatalf("backoff after reset = %v, want at most %v", d, fetchBackoffMin)
	}
}

func TestHistoryToWire(t *testing.T) {
	got := fmt.Sprint(journal.ToWire(es(1, 0, 4, 7)))
	want := fmt.Sprint([]*tenurev1.EpochStart{{Epoch: 1, StartOffset: 0}, {Epoch: 4, StartOffset: 7}})
	if got != want {
		t.Fatalf("historyToWire = %s, want %s", got, want)
	}
}
