// Package leaseclient is the one lease service client every tenure process
// uses (the replica's lease keeper, the promoter, tenurectl): a Connect
// client over several instances of the lease service that fails over
// between them.
//
// Lease service instances are stateless over one etcd: a session is an etcd
// lease, an epoch and a lease binding are etcd keys, so any instance serves
// any call about any session, and a session opened through one instance is
// renewed through another under the same id, with the leases bound to it.
// A holder that loses its instance therefore keeps its session (and its
// leaderships) by sending its next keep-alive to another one, as long as
// etcd still holds the session (its TTL has not run out).
//
// The failover rule is transport.Failover's: a call that never reached an
// instance (the dial failed) goes to the next one whatever it is; a call
// whose outcome is unknown (sent, then no answer, or Unavailable) goes to
// the next one only if repeating it is safe, by the table in Safe. The
// instance that answered last is the one later calls try first.
package leaseclient

import (
	"net/http"

	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// procedureSafe says, for every lease service procedure, whether a call to
// it whose outcome is unknown may be sent again to another instance: true
// when a second application changes nothing the first did not, or changes
// it in a way every caller already handles. A procedure missing here is not
// sent again (TestEveryProcedureHasARule keeps the table complete).
var procedureSafe = map[string]bool{
	// Reads change nothing.
	tenurev1connect.LeaseServiceGetRangeProcedure:   true,
	tenurev1connect.LeaseServiceGetRangesProcedure:  true,
	tenurev1connect.LeaseServiceListRangesProcedure: true,
	tenurev1connect.LeaseServiceGetLeaseProcedure:   true,
	// A watch only reads, from the revision the request names; a stream
	// that breaks later is resumed by its caller from the last revision it
	// saw, which the failover does not do.
	tenurev1connect.LeaseServiceWatchLeasesProcedure: true,

	// Renewing an etcd lease twice restarts its TTL twice: the session
	// lives a little longer, never shorter. The answer (which held ranges
	// moved on) is a read made after the renewal. A renewal the lost try
	// did apply only makes the keeper's validity (counted from the first
	// send) more conservative, never longer than a real renewal allows.
	tenurev1connect.LeaseServiceKeepAliveProcedure: true,
	// Revoking a revoked session answers NotFound, which every caller
	// takes as closed (Keeper.Close).
	tenurev1connect.LeaseServiceCloseSessionProcedure: true,
	// Binding the current epoch's lease to a session is a compare-and-swap
	// on the epoch: a second bind of the same epoch to the same session
	// writes the same binding, and a bind after the epoch moved on is
	// refused (FailedPrecondition), as the first would have been.
	tenurev1connect.LeaseServiceBindLeaseProcedure:  true,
	tenurev1connect.LeaseServiceBindLeasesProcedure: true,
	// Releasing a released lease answers success ("released already").
	tenurev1connect.LeaseServiceReleaseLeaseProcedure: true,
	// Deleting a deleted range succeeds (DeleteRange is idempotent).
	tenurev1connect.LeaseServiceDeleteRangeProcedure: true,
	// SetRetention writes the whole policy the request names: a second
	// application writes the same value again.
	tenurev1connect.LeaseServiceSetRetentionProcedure: true,

	// Not sent again after an unknown outcome; the caller decides:
	//
	// OpenSession: a lost try may have opened a session, and a second try
	// opens another. The holder's newest session is where the promoter
	// binds its leases (session 0); if the lost try applied last, the
	// newest would be an orphan nobody renews, and a lease bound to it
	// would expire within a TTL: a needless promotion. The keeper retries
	// on its own, and an orphan expires unrenewed.
	tenurev1connect.LeaseServiceOpenSessionProcedure: false,
	// GrantEpoch(s): a compare-and-swap on the previous epoch, so a
	// repeated grant can never grant twice: if the lost try applied, the
	// repeat answers Aborted with the current epoch (the one the lost try
	// granted). Safe for fencing, but the caller would read its own grant
	// as a lost race. The promoter then re-reads and grants again from the
	// current epoch: a higher epoch, which fences out everything the lost
	// grant could have (an epoch nobody was fenced at is simply skipped;
	// epochs strictly increase, they need not be dense for safety). So
	// the promoter is told the outcome is unknown and takes that path
	// itself, with a fresh read, rather than a blind repeat here.
	tenurev1connect.LeaseServiceGrantEpochProcedure:  false,
	tenurev1connect.LeaseServiceGrantEpochsProcedure: false,
	// CreateRange: a repeat after a lost success answers AlreadyExists,
	// which an operator would read as "someone else made it".
	tenurev1connect.LeaseServiceCreateRangeProcedure: false,
	// Membership changes are compare-and-swaps on the membership revision:
	// a repeat after a lost success is refused (Aborted, or a change
	// already in flight), which the caller must resolve by reading the
	// range again, as it does for any lost race.
	tenurev1connect.LeaseServiceSetReplicasProcedure:              false,
	tenurev1connect.LeaseServiceChangeMembershipProcedure:         false,
	tenurev1connect.LeaseServiceCompleteMembershipChangeProcedure: false,
}

// Safe reports whether a call to procedure whose outcome is unknown may be
// sent again to another lease service instance (procedureSafe says why for
// each).
func Safe(procedure string) bool { return procedureSafe[procedure] }

// Client is a lease service client over one or more instances.
type Client struct {
	tenurev1connect.LeaseServiceClient
	failover *transport.Failover
}

// New returns a client of the lease service instances at urls (base URLs,
// as transport.BaseURLs returns them), over hc, built with
// transport.ClientOptions like every tenure client.
func New(hc *http.Client, urls []string) (*Client, error) {
	f, err := transport.NewFailover(hc, urls, Safe)
	if err != nil {
		return nil, err
	}
	return &Client{
		LeaseServiceClient: tenurev1connect.NewLeaseServiceClient(f, f.BaseURL(), transport.ClientOptions()...),
		failover:           f,
	}, nil
}

// Current is the instance calls go to first now: the one that answered
// last.
func (c *Client) Current() string { return c.failover.Current() }
