package wire

import (
	"errors"
	"fmt"
	"net/url"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// ErrInvalid is wrapped by every validation failure, so callers map it to
// connect.CodeInvalidArgument in one place. Its text begins the message a
// caller of the API reads (InvalidArgument's, in JSON too), so it is in
// the caller's words: it was "wire: invalid", the name of this Go
// package, which tells a client in another language nothing.
var ErrInvalid = errors.New("invalid request")

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// ValidateRangeID checks a range id: 1 to MaxRangeIDBytes bytes of
// [a-zA-Z0-9._-], not starting with '.' or '-'. Ids are etcd key
// components, Badger key prefixes and journal file names, so the grammar
// excludes '/', NUL and anything a path or key could be confused by.
func ValidateRangeID(id string) error { return ValidateID("range id", id) }

// ValidateReplicaID checks a replica id: the range id grammar (replica ids
// are key components and file names too), with the error naming the
// replica id. A replica id checked with ValidateRangeID was refused as
// "range id is empty", which sent a caller whose range id was fine looking
// for what was wrong with it.
func ValidateReplicaID(id string) error { return ValidateID("replica id", id) }

// ValidateID checks an id of the range id grammar that the error calls
// what ("leader id", "holder_id"): any other id the API takes.
func ValidateID(what, id string) error {
	if p := idProblem(what, id); p != "" {
		return invalidf("%s", p)
	}
	return nil
}

// idProblem says what is wrong with id as a what, or "" when nothing is.
func idProblem(what, id string) string {
	if id == "" {
		return what + " is empty"
	}
	if len(id) > MaxRangeIDBytes {
		return fmt.Sprintf("%s is %d bytes, at most %d", what, len(id), MaxRangeIDBytes)
	}
	if id[0] == '.' || id[0] == '-' {
		return fmt.Sprintf("%s %q starts with %q", what, id, id[0])
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			return fmt.Sprintf("%s %q has byte %q at %d; allowed: letters, digits, '.', '_', '-'", what, id, c, i)
		}
	}
	return ""
}

// ValidateHistory checks an epoch history received from a peer or read from
// disk: at most MaxEpochStarts entries, no nil entry, no epoch 0, strictly
// increasing epochs and non-decreasing starts. A peer's history is a claim:
// a non-advancing one would hand the promoter a truncation target that
// discards acknowledged records, so the receiver refuses it rather than
// trusting whatever arrives.
func ValidateHistory(h []*tenurev1.EpochStart) error {
	if len(h) > MaxEpochStarts {
		return invalidf("epoch history has %d entries, at most %d", len(h), MaxEpochStarts)
	}
	for i, e := range h {
		if e == nil {
			return invalidf("epoch history entry %d is missing", i)
		}
		if e.GetEpoch() == 0 {
			return invalidf("epoch history entry %d has epoch 0 (\"no grant yet\" is never recorded)", i)
		}
		if i == 0 {
			continue
		}
		prev := h[i-1]
		// Epochs strictly increase: each entry is a later leadership.
		if e.GetEpoch() <= prev.GetEpoch() {
			return invalidf("epoch history entry %d: epoch %d does not follow epoch %d", i, e.GetEpoch(), prev.GetEpoch())
		}
		// Starts never decrease: a later epoch cannot have written below an
		// earlier one's first record without that record being truncated,
		// and truncation removes the earlier entry.
		if e.GetStartOffset() < prev.GetStartOffset() {
			return invalidf("epoch history entry %d: start %d is below the previous start %d", i, e.GetStartOffset(), prev.GetStartOffset())
		}
	}
	return nil
}

// HistoryKnown reports whether a replica's reported history can be used for
// epoch reconciliation. An empty history means "unknown" (a missing, broken or
// older-version journal), except when the replica's log is empty: then there
// is nothing to attribute and the empty history is complete. Without that
// exception a brand-new range, where every replica is empty, could never
// gather a quorum of known histories and never get its first leader.
func HistoryKnown(h []*tenurev1.EpochStart, logEnd uint64) bool {
	return len(h) > 0 || logEnd == 0
}

// ValidateHistoryAgainstLog additionally checks that a history fits the log it
// describes: no epoch starts beyond the log end. (An epoch may start exactly
// at the log end: a leader that journaled its epoch and has not yet written.)
func ValidateHistoryAgainstLog(h []*tenurev1.EpochStart, logEnd uint64) error {
	if err := ValidateHistory(h); err != nil {
		return err
	}
	if n := len(h); n > 0 && h[n-1].GetStartOffset() > logEnd {
		return invalidf("epoch %d starts at %d, beyond the log end %d", h[n-1].GetEpoch(), h[n-1].GetStartOffset(), logEnd)
	}
	return nil
}

// ValidateBatch checks the values of one Append: 1 to MaxBatchRecords
// records, each at most MaxRecordBytes, at most MaxBatchBytes in all.
func ValidateBatch(values [][]byte) error {
	if len(values) == 0 {
		return invalidf("batch is empty")
	}
	if len(values) > MaxBatchRecords {
		return invalidf("batch has %d records, at most %d", len(values), MaxBatchRecords)
	}
	total := 0
	for i, v := range values {
		if len(v) > MaxRecordBytes {
			return invalidf("record %d is %d bytes, at most %d", i, len(v), MaxRecordBytes)
		}
		total += len(v)
	}
	if total > MaxBatchBytes {
		return invalidf("batch is %d bytes, at most %d", total, MaxBatchBytes)
	}
	return nil
}

// ValidateReplicas checks a replica set: 1 to MaxReplicas members with valid,
// distinct ids and non-empty addresses.
func ValidateReplicas(rs []*tenurev1.Replica) error {
	if len(rs) == 0 {
		return invalidf("replica set is empty")
	}
	if len(rs) > MaxReplicas {
		return invalidf("replica set has %d members, at most %d", len(rs), MaxReplicas)
	}
	seen := make(map[string]bool, len(rs))
	for i, r := range rs {
		if r == nil {
			return invalidf("replica %d is missing", i)
		}
		if p := idProblem("replica id", r.GetId()); p != "" {
			return invalidf("replica %d: %s", i, p)
		}
		if r.GetAddress() == "" {
			return invalidf("replica %q has no address", r.GetId())
		}
		if seen[r.GetId()] {
			return invalidf("replica %q is listed twice", r.GetId())
		}
		seen[r.GetId()] = true
	}
	return nil
}

// ValidateAddress checks a replica's address as a request names it
// (CreateRange, SetReplicas, a member added): the base URL of its Connect
// server, http:// or https:// with a host, at most MaxAddressBytes. Every
// peer and client dials the member there as given; "127.0.0.1:7101" or
// "not a url" used to be stored, and each promotion then failed to reach
// the member ("missing scheme") long after the request that was wrong.
//
// ValidateReplicas does not check addresses: it also checks memberships
// read back from the store, and one stored before this check must stay
// readable, or SetReplicas could not correct it.
func ValidateAddress(addr string) error {
	if p := addressProblem(addr); p != "" {
		return invalidf("%s", p)
	}
	return nil
}

// ValidateAddresses checks every replica's address (ValidateAddress), naming
// the replica.
func ValidateAddresses(rs []*tenurev1.Replica) error {
	for _, r := range rs {
		if p := addressProblem(r.GetAddress()); p != "" {
			return invalidf("replica %s: %s", r.GetId(), p)
		}
	}
	return nil
}

// addressProblem says what is wrong with addr, or "" when nothing is.
func addressProblem(addr string) string {
	if addr == "" {
		return "address is empty"
	}
	if len(addr) > MaxAddressBytes {
		return fmt.Sprintf("address is %d bytes, at most %d", len(addr), MaxAddressBytes)
	}
	u, err := url.Parse(addr)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Sprintf("address %q is not a base URL: want http://HOST:PORT or https://HOST:PORT", addr)
	}
	return ""
}

// Quorum is the number of replicas that form a majority of n.
func Quorum(n int) int { return n/2 + 1 }

// ValidateRangeBatch checks the range ids of a batched call (FenceRanges,
// AdoptRanges, GrantEpochs, BindLeases): at least one, at most
// MaxRangesPerBatch, none twice. Two commands for one range in one call
// would race each other under that range's lock or compare-and-swap in an
// order the caller cannot see. Each entry's own fields are checked by the
// single-range handler that runs it.
func ValidateRangeBatch(n int, rangeID func(i int) string) error {
	if n == 0 {
		return invalidf("a batch names no range")
	}
	if n > MaxRangesPerBatch {
		return invalidf("a batch names %d ranges, at most %d", n, MaxRangesPerBatch)
	}
	seen := make(map[string]bool, n)
	for i := range n {
		id := rangeID(i)
		if seen[id] {
			return invalidf("range %q appears twice in one batch", id)
		}
		seen[id] = true
	}
	return nil
}
