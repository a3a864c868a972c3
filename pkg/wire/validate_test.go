package wire_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

func hist(pairs ...uint64) []*tenurev1.EpochStart {
	var h []*tenurev1.EpochStart
	for i := 0; i+1 < len(pairs); i += 2 {
		h = append(h, &tenurev1.EpochStart{Epoch: pairs[i], StartOffset: pairs[i+1]})
	}
	return h
}

func TestValidateHistory(t *testing.T) {
	long := make([]*tenurev1.EpochStart, wire.MaxEpochStarts+1)
	for i := range long {
		long[i] = &tenurev1.EpochStart{Epoch: uint64(i + 1), StartOffset: uint64(i)}
	}
	tests := []struct {
		name string
		h    []*tenurev1.EpochStart
		ok   bool
	}{
		{"empty", nil, true},
		{"one", hist(1, 0), true},
		{"advancing", hist(1, 0, 2, 10, 5, 10, 9, 30), true},
		{"epoch zero", hist(0, 0), false},
		{"epoch zero later", hist(1, 0, 0, 5), false},
		{"repeated epoch", hist(1, 0, 1, 5), false},
		{"decreasing epoch", hist(2, 0, 1, 5), false},
		{"decreasing start", hist(1, 5, 2, 4), false},
		{"nil entry", []*tenurev1.EpochStart{{Epoch: 1}, nil}, false},
		{"at bound", long[:wire.MaxEpochStarts], true},
		{"over bound", long, false},
	}
	for _, tt := range tests {
		err := wire.ValidateHistory(tt.h)
		if (err == nil) != tt.ok {
			t.Errorf("%s: ValidateHistory() = %v, want ok=%v", tt.name, err, tt.ok)
		}
		if err != nil && !errors.Is(err, wire.ErrInvalid) {
			t.Errorf("%s: error %v does not wrap ErrInvalid", tt.name, err)
		}
	}
}

func TestValidateHistoryAgainstLog(t *testing.T) {
	if err := wire.ValidateHistoryAgainstLog(hist(1, 0, 2, 10), 10); err != nil {
		t.Errorf("epoch starting at log end: got %v, want nil", err)
	}
	if err := wire.ValidateHistoryAgainstLog(hist(1, 0, 2, 11), 10); err == nil {
		t.Errorf("epoch starting beyond log end: got nil, want error")
	}
}

func TestHistoryKnown(t *testing.T) {
	tests := []struct {
		h      []*tenurev1.EpochStart
		logEnd uint64
		want   bool
	}{
		{nil, 0, true},        // empty log: nothing to attribute
		{nil, 5, false},       // records with no history: unknown
		{hist(1, 0), 5, true}, // a history
		{hist(1, 0), 0, true}, // epoch journaled, nothing written yet
	}
	for _, tt := range tests {
		if got := wire.HistoryKnown(tt.h, tt.logEnd); got != tt.want {
			t.Errorf("HistoryKnown(%v, %d) = %v, want %v", tt.h, tt.logEnd, got, tt.want)
		}
	}
}

func TestValidateRangeID(t *testing.T) {
	good := []string{"r1", "orders-7", "a.b_c", "R", strings.Repeat("x", wire.MaxRangeIDBytes)}
	bad := []string{"", "-r", ".r", "a/b", "a b", "a\x00", "é", strings.Repeat("x", wire.MaxRangeIDBytes+1)}
	for _, id := range good {
		if err := wire.ValidateRangeID(id); err != nil {
			t.Errorf("ValidateRangeID(%q) = %v, want nil", id, err)
		}
	}
	for _, id := range bad {
		if err := wire.ValidateRangeID(id); err == nil {
			t.Errorf("ValidateRangeID(%q) = nil, want error", id)
		}
	}
}

func TestValidateBatch(t *testing.T) {
	big := make([]byte, wire.MaxRecordBytes+1)
	many := make([][]byte, wire.MaxBatchRecords+1)
	heavy := make([][]byte, wire.MaxBatchBytes/wire.MaxRecordBytes+1)
	for i := range heavy {
		heavy[i] = make([]byte, wire.MaxRecordBytes)
	}
	tests := []struct {
		name string
		b    [][]byte
		ok   bool
	}{
		{"one", [][]byte{[]byte("x")}, true},
		{"empty value", [][]byte{{}}, true},
		{"no records", nil, false},
		{"record too big", [][]byte{big}, false},
		{"too many", many, false},
		{"too heavy", heavy, false},
	}
	for _, tt := range tests {
		if err := wire.ValidateBatch(tt.b); (err == nil) != tt.ok {
			t.Errorf("%s: ValidateBatch() = %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
}

// Every id is checked with the range id grammar, and each error names the
// id it is about: a replica id used to be refused as "range id is empty",
// twice prefixed with this package's name ("wire: invalid: replica 0 id:
// wire: invalid: range id is empty"), which a caller of the API reads.
func TestIDErrorsNameTheirID(t *testing.T) {
	r := func(id string) *tenurev1.Replica { return &tenurev1.Replica{Id: id, Address: "http://x"} }
	for _, tc := range []struct {
		err  error
		want string
	}{
		{wire.ValidateRangeID(""), "invalid request: range id is empty"},
		{wire.ValidateReplicaID(""), "invalid request: replica id is empty"},
		{wire.ValidateReplicaID("a/b"), `invalid request: replica id "a/b" has byte '/' at 1; allowed: letters, digits, '.', '_', '-'`},
		{wire.ValidateID("leader id", "-x"), `invalid request: leader id "-x" starts with '-'`},
		{wire.ValidateReplicas([]*tenurev1.Replica{r("a"), r("")}), "invalid request: replica 1: replica id is empty"},
	} {
		if tc.err == nil || tc.err.Error() != tc.want || !errors.Is(tc.err, wire.ErrInvalid) {
			t.Errorf("got %v, want %q wrapping ErrInvalid", tc.err, tc.want)
		}
	}
}

func TestValidateReplicas(t *testing.T) {
	r := func(id, addr string) *tenurev1.Replica { return &tenurev1.Replica{Id: id, Address: addr} }
	if err := wire.ValidateReplicas([]*tenurev1.Replica{r("a", "http://x"), r("b", "http://y")}); err != nil {
		t.Errorf("valid set: %v", err)
	}
	for name, rs := range map[string][]*tenurev1.Replica{
		"empty":      nil,
		"duplicate":  {r("a", "http://x"), r("a", "http://y")},
		"no address": {r("a", "")},
		"bad id":     {r("a/b", "http://x")},
		"too many":   make([]*tenurev1.Replica, wire.MaxReplicas+1),
	} {
		if err := wire.ValidateReplicas(rs); err == nil {
			t.Errorf("%s: ValidateReplicas() = nil, want error", name)
		}
	}
}

// The read limit must fit a full batch and a full epoch history; if someone
// raises one bound without the other, a legal message becomes unreadable.
func TestBoundsAgree(t *testing.T) {
	need := wire.MaxBatchBytes + wire.MaxBatchRecords*32 + wire.MaxEpochStarts*wire.EpochStartWireBytes
	if wire.MaxMessageBytes < need {
		t.Errorf("MaxMessageBytes = %d, want at least %d", wire.MaxMessageBytes, need)
	}
	// A batched fence answer carries a full history per range.
	if perRange := wire.MaxEpochStarts*wire.EpochStartWireBytes + 1024; wire.MaxRangesPerBatch*perRange > wire.MaxMessageBytes {
		t.Errorf("MaxRangesPerBatch = %d full fence answers are %d bytes, above MaxMessageBytes %d", wire.MaxRangesPerBatch, wire.MaxRangesPerBatch*perRange, wire.MaxMessageBytes)
	}
	if wire.Quorum(3) != 2 || wire.Quorum(5) != 3 || wire.Quorum(1) != 1 || wire.Quorum(4) != 3 {
		t.Errorf("Quorum is not a strict majority")
	}
}

func TestValidateRangeBatch(t *testing.T) {
	distinct := func(i int) string { return fmt.Sprintf("r%d", i) }
	for _, tt := range []struct {
		name string
		n    int
		id   func(int) string
		ok   bool
	}{
		{"empty", 0, distinct, false},
		{"one", 1, distinct, true},
		{"at the limit", wire.MaxRangesPerBatch, distinct, true},
		{"over the limit", wire.MaxRangesPerBatch + 1, distinct, false},
		{"a range twice", 3, func(i int) string { return []string{"a", "b", "a"}[i] }, false},
	} {
		err := wire.ValidateRangeBatch(tt.n, tt.id)
		if (err == nil) != tt.ok {
			t.Errorf("%s: ValidateRangeBatch() = %v, want ok=%v", tt.name, err, tt.ok)
		}
		if err != nil && !errors.Is(err, wire.ErrInvalid) {
			t.Errorf("%s: error %v does not wrap wire.ErrInvalid", tt.name, err)
		}
	}
}

func TestValidateAddress(t *testing.T) {
	for _, a := range []string{"http://127.0.0.1:7101", "https://replica-1.example:7101", "http://[::1]:7101", "https://lb.example/tenure/r1"} {
		if err := wire.ValidateAddress(a); err != nil {
			t.Errorf("ValidateAddress(%q) = %v, want nil", a, err)
		}
	}
	for _, a := range []string{"", "not a url", "127.0.0.1:7101", "ftp://x:1", "http://", "http://u:p@x:1", "http://x:1?q=1", "http://x:1#f", "http://" + strings.Repeat("a", wire.MaxAddressBytes)} {
		if err := wire.ValidateAddress(a); err == nil || !errors.Is(err, wire.ErrInvalid) {
			t.Errorf("ValidateAddress(%q) = %v, want an ErrInvalid", a, err)
		}
	}
}
