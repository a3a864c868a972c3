package wire_test

import (
	"errors"
	"fmt"
	"testing"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// BelowLogStart reads the log start only from an OutOfRange carrying a
// LogStartDetail, wrapped or not.
func TestBelowLogStart(t *testing.T) {
	withDetail := func(code connect.Code, start uint64) error {
		ce := connect.NewError(code, errors.New("offset 3 is below the log start"))
		d, err := connect.NewErrorDetail(&tenurev1.LogStartDetail{LogStart: start})
		if err != nil {
			t.Fatal(err)
		}
		ce.AddDetail(d)
		return ce
	}
	for _, tc := range []struct {
		name  string
		err   error
		start uint64
		ok    bool
	}{
		{"out of range with the detail", withDetail(connect.CodeOutOfRange, 4096), 4096, true},
		{"wrapped", fmt.Errorf("read: %w", withDetail(connect.CodeOutOfRange, 7)), 7, true},
		{"out of range without it (beyond the HWM)", connect.NewError(connect.CodeOutOfRange, errors.New("beyond")), 0, false},
		{"another code with the detail", withDetail(connect.CodeFailedPrecondition, 9), 0, false},
		{"not a Connect error", errors.New("plain"), 0, false},
		{"nil", nil, 0, false},
	} {
		start, ok := wire.BelowLogStart(tc.err)
		if start != tc.start || ok != tc.ok {
			t.Errorf("%s: BelowLogStart = %d, %v; want %d, %v", tc.name, start, ok, tc.start, tc.ok)
		}
	}
}

// A log reset to a log start (nothing held, empty journal) is known; an
// empty journal over records is not.
func TestHistoryKnownFrom(t *testing.T) {
	h := []*tenurev1.EpochStart{{Epoch: 2, StartOffset: 5}}
	for _, tc := range []struct {
		name          string
		h             []*tenurev1.EpochStart
		logStart, end uint64
		want          bool
	}{
		{"never written", nil, 0, 0, true},
		{"a journal", h, 5, 9, true},
		{"reset to its start", nil, 40, 40, true},
		{"records without a journal", nil, 0, 9, false},
		{"records above a start without a journal", nil, 40, 45, false},
	} {
		if got := wire.HistoryKnownFrom(tc.h, tc.logStart, tc.end); got != tc.want {
			t.Errorf("%s: HistoryKnownFrom(%v, %d, %d) = %v, want %v", tc.name, tc.h, tc.logStart, tc.end, got, tc.want)
		}
	}
}
