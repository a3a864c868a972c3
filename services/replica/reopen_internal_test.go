package replica

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/tenurelog/tenure/services/replica/logstore"
)

// Only a store failure caused by a want of space, with no fsync ever
// failed, is one a reopen recovers from.
func TestReopenable(t *testing.T) {
	failed := func(cause error) error { return fmt.Errorf("%w: %w", logstore.ErrFailed, cause) }
	for _, tc := range []struct {
		name       string
		err        error
		syncFailed bool
		want       bool
	}{
		{"not failed", nil, false, false},
		{"WAL write ENOSPC", failed(fmt.Errorf("logstore: write WAL: %w", syscall.ENOSPC)), false, true},
		{"ENOSPC after a failed fsync", failed(syscall.ENOSPC), true, false},
		{"EIO", failed(syscall.EIO), false, false},
		{"ENOSPC not a store failure", syscall.ENOSPC, false, false},
		{"disk full refusal", logstore.ErrDiskFull, false, false},
	} {
		if got := reopenable(tc.err, tc.syncFailed); got != tc.want {
			t.Errorf("%s: reopenable(%v, %v) = %v, want %v", tc.name, tc.err, tc.syncFailed, got, tc.want)
		}
	}
	if errors.Is(errStoreReopening, logstore.ErrFailed) {
		t.Errorf("errStoreReopening must not read as a store failure")
	}
}
