package chaos

import (
	"testing"
	"time"

	"github.com/tenurelog/tenure/internal/chaos/check"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// A fetch-time truncation a replica's status reports is a Truncation the
// checker judges: matched against the replica's fence at the epoch it
// fetched at, a cut of an acknowledged record counts, once per increase
// of the status's count; a cut of another epoch's tail does not.
func TestObserverFetchTruncations(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name string
		// The replica's fence answer at epoch 3: log end 6, records from 4
		// on written by epoch from4.
		from4 uint64
		want  int
	}{
		{"cut of acknowledged epoch-2 records", 2, 1},
		{"cut of epoch-1 records at the offsets epoch 2 acknowledged", 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newObserver()
			hist := []*tenurev1.EpochStart{{Epoch: 1, StartOffset: 0}}
			if tc.from4 == 2 {
				hist = append(hist, &tenurev1.EpochStart{Epoch: 2, StartOffset: 4})
			}
			o.record("r2", tenurev1connect.ReplicaServiceFenceProcedure, &tenurev1.FenceRequest{RangeId: rangeID, Epoch: 3},
				&tenurev1.FenceResponse{ReplicaId: "r2", FencedEpoch: 3, LogEnd: 6, History: hist}, now, now)
			st := &tenurev1.RangeStatus{RangeId: rangeID, FetchTruncations: 1, LastFetchTruncationFrom: 6, LastFetchTruncationTo: 4,
				LastFetchTruncationEpoch: 3, LastFetchTruncationLeader: "r1"}
			o.fetchTruncations("r2", 1, st)
			o.fetchTruncations("r2", 1, st) // the same cut, sampled again
			_, truncs := o.results()
			if len(truncs) != 1 {
				t.Fatalf("truncations = %v, want one", truncs)
			}
			// Offset 4 was acknowledged at epoch 2.
			run := check.Run{History: []check.Op{{Range: rangeID, Kind: check.Append, Value: []byte("v"), Offset: 4, Epoch: 2,
				Outcome: check.OK, Call: now, Return: now}}, Truncations: truncs}
			if got := check.Check(run).AckedTruncated; got != tc.want {
				t.Errorf("acked-truncated = %d, want %d (truncation %+v)", got, tc.want, truncs[0])
			}
		})
	}
}
