package promoter

import "testing"

// Every reason the promoter's own code gives maps to its bounded label,
// retries included; an operator's free text is "operator" whatever it says.
func TestReasonLabel(t *testing.T) {
	for _, tc := range []struct {
		opts     promoteOpts
		observed int64
		want     string
	}{
		{promoteOpts{reason: "leader r1 unreachable: unavailable: dial tcp 127.0.0.1:7101: connect: connection refused"}, 3, "leader_unreachable"},
		{promoteOpts{reason: retryReason("leader r1 unreachable: deadline exceeded")}, 3, "leader_unreachable"},
		{promoteOpts{reason: "leader r2 not serving at epoch 4"}, 4, "leader_not_serving"},
		{promoteOpts{reason: "lease expired"}, 2, "lease_expired"},
		{promoteOpts{reason: retryReason("lease released")}, 2, "lease_released"},
		{promoteOpts{reason: "lease something new"}, 2, "lease_other"},
		{promoteOpts{reason: "initial leader"}, 0, "initial_leader"},
		{promoteOpts{reason: "initial leader (no lease at epoch 7)"}, 7, "initial_leader"},
		{promoteOpts{reason: "orphaned grant: no leader at our own epoch"}, 5, "orphaned_grant"},
		{promoteOpts{reason: "leader r1 unreachable"}, -1, "operator"}, // an operator may write anything
		{promoteOpts{reason: "operator request"}, -1, "operator"},
		{promoteOpts{reason: "operator: unsafe promotion", unsafe: true}, -1, "unsafe"},
		{promoteOpts{reason: "membership: add learner r4", step: "add-learner r4"}, -1, "membership"},
		{promoteOpts{reason: "rebalance: preferred r1 is caught up"}, -1, "rebalance"},
		{promoteOpts{reason: "something else"}, 9, "other"},
	} {
		if got := reasonLabel(tc.opts, tc.observed); got != tc.want {
			t.Errorf("reasonLabel(%q, observed %d) = %q, want %q", tc.opts.reason, tc.observed, got, tc.want)
		}
	}
}
