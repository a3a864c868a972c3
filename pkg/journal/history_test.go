package journal_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/tenurelog/tenure/pkg/journal"
)

func TestDivergencePoint(t *testing.T) {
	tests := []struct {
		name   string
		a, b   []journal.EpochStart
		want   uint64
		wantOK bool
	}{
		// Empty is unknown: two unknowns agreeing is not evidence.
		{"both empty", nil, nil, 0, false},
		{"a empty", nil, es(1, 0), 0, false},
		{"b empty", es(1, 0, 2, 100), nil, 0, false},
		{"identical, one entry", es(1, 0), es(1, 0), math.MaxUint64, true},
		{"identical", es(1, 0, 2, 100, 5, 250), es(1, 0, 2, 100, 5, 250), math.MaxUint64, true},
		// The shorter side's epoch 1 may run on past 100, where the longer
		// side's epoch 2 began.
		{"a prefix of b", es(1, 0), es(1, 0, 2, 100), 100, true},
		{"b prefix of a", es(1, 0, 2, 100, 3, 180), es(1, 0, 2, 100), 180, true},
		{"differ at first entry", es(1, 0), es(2, 0), 0, true},
		// Trimmed histories (TrimBefore, or rebuilt from what retention
		// left): a replica holds nothing below its first entry's start.
		{"trimmed: older epochs skipped", es(1, 5, 2, 10), es(2, 10), math.MaxUint64, true},
		{"trimmed: kept entry vs untrimmed", es(1, 0, 2, 100, 3, 200), es(2, 100, 3, 200), math.MaxUint64, true},
		{"trimmed: rebuilt start above the true one", es(1, 0, 2, 100, 3, 200), es(2, 150, 3, 200), math.MaxUint64, true},
		{"trimmed: first epoch the other never had", es(1, 0, 2, 100), es(3, 150), 150, true},
		{"trimmed: the other's epoch starts later", es(1, 0, 3, 100), es(3, 40), 40, true},
		{"trimmed: differ after the first entry", es(2, 100, 3, 200), es(1, 0, 2, 100, 4, 180), 180, true},
		{"trimmed: the older side runs past the other's start", es(1, 0, 2, 300), es(3, 200), 200, true},
		{"same epoch, different start", es(1, 0, 2, 50), es(1, 0, 2, 80), 50, true},
		{"same first epoch, different start", es(3, 70), es(3, 20), math.MaxUint64, true},
		{"one side missed an epoch", es(1, 0, 3, 100), es(1, 0, 2, 50, 3, 100), 50, true},
		{"differ later", es(1, 0, 2, 100, 3, 200), es(1, 0, 2, 100, 4, 150), 150, true},
		{"deposed leader's tail", es(1, 0, 2, 100), es(1, 0, 3, 100), 100, true},
		// An epoch that wrote nothing (the next entry starts where it
		// does) holds no record: the logs are the same records.
		{"an epoch that wrote nothing", es(23, 860, 24, 871, 25, 871), es(23, 860, 25, 871), math.MaxUint64, true},
		{"two epochs that wrote nothing", es(1, 0, 2, 50, 3, 50, 4, 50), es(1, 0, 4, 50), math.MaxUint64, true},
		{"an empty epoch, then a real difference", es(1, 0, 2, 100, 3, 100, 4, 150), es(1, 0, 3, 100, 5, 150), 150, true},
		{"an empty epoch is not the other's records", es(1, 0, 2, 100, 3, 100), es(1, 0, 2, 100), 100, true},
		{"trimmed: an empty first entry", es(2, 100, 3, 100, 4, 200), es(1, 0, 3, 100, 4, 200), math.MaxUint64, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The divergence point is a property of the pair, not of the order.
			for _, order := range [][2][]journal.EpochStart{{tt.a, tt.b}, {tt.b, tt.a}} {
				got, ok := journal.DivergencePoint(order[0], order[1])
				if got != tt.want || ok != tt.wantOK {
					t.Errorf("DivergencePoint(%v, %v) = %d, %v; want %d, %v", order[0], order[1], got, ok, tt.want, tt.wantOK)
				}
			}
		})
	}
}

func TestEndOffsetFor(t *testing.T) {
	h := es(1, 0, 3, 100, 4, 250)
	const logEnd = 300
	tests := []struct {
		name          string
		h             []journal.EpochStart
		epoch, logEnd uint64
		wantEpoch     uint64
		wantEnd       uint64
		wantOK        bool
	}{
		{"empty history", nil, 5, logEnd, 0, 0, false},
		{"epoch 0", h, 0, logEnd, 0, 0, false},
		{"epoch below every entry", es(2, 10, 3, 20), 1, logEnd, 0, 0, false},
		{"first epoch ends where the next starts", h, 1, logEnd, 1, 100, true},
		// Epoch 2 never wrote here: the answer is the largest epoch below it.
		{"absent epoch answers the one below", h, 2, logEnd, 1, 100, true},
		{"middle epoch", h, 3, logEnd, 3, 250, true},
		{"last epoch ends at the log end", h, 4, logEnd, 4, logEnd, true},
		{"epoch above every entry", h, 9, logEnd, 4, logEnd, true},
		{"single entry, empty log", es(5, 0), 5, 0, 5, 0, true},
		{"epoch that wrote nothing", es(1, 0, 2, 100, 3, 100), 2, logEnd, 2, 100, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, end, ok := journal.EndOffsetFor(tt.h, tt.epoch, tt.logEnd)
			if e != tt.wantEpoch || end != tt.wantEnd || ok != tt.wantOK {
				t.Errorf("EndOffsetFor(%v, %d, %d) = %d, %d, %v; want %d, %d, %v", tt.h, tt.epoch, tt.logEnd, e, end, ok, tt.wantEpoch, tt.wantEnd, tt.wantOK)
			}
		})
	}
}

func ExampleDivergencePoint() {
	// The candidate took over at epoch 3 from offset 100. The other replica
	// kept writing under epoch 2 (a deposed leader) from offset 100 on.
	candidate := []journal.EpochStart{{Epoch: 1, Start: 0}, {Epoch: 3, Start: 100}}
	deposed := []journal.EpochStart{{Epoch: 1, Start: 0}, {Epoch: 2, Start: 100}}
	fmt.Println(journal.DivergencePoint(candidate, deposed))
	fmt.Println(journal.DivergencePoint(candidate, nil))
	// Output:
	// 100 true
	// 0 false
}

func ExampleEndOffsetFor() {
	leader := []journal.EpochStart{{Epoch: 1, Start: 0}, {Epoch: 3, Start: 100}}
	// A follower's last record is of epoch 2, which this leader never had:
	// its epoch 1 ended at 100, so the follower truncates to 100.
	fmt.Println(journal.EndOffsetFor(leader, 2, 180))
	// Output:
	// 1 100 true
}
