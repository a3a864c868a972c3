package lease

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// The subtree names under the prefix. Part of the storage format.
const (
	epochsDir    = "epochs/"
	leasesDir    = "leases/"
	membersDir   = "members/"
	sessionsDir  = "sessions/"
	retentionDir = "retention/"
)

// layout builds and parses the keys of one prefix (see the package comment).
type layout struct{ prefix string }

func (l layout) epoch(rangeID string) string   { return l.prefix + epochsDir + rangeID }
func (l layout) lease(rangeID string) string   { return l.prefix + leasesDir + rangeID }
func (l layout) members(rangeID string) string { return l.prefix + membersDir + rangeID }
func (l layout) epochs() string                { return l.prefix + epochsDir }
func (l layout) leases() string                { return l.prefix + leasesDir }
func (l layout) membersAll() string            { return l.prefix + membersDir }

// retention is a range's retention policy, kept apart from members/ so that
// a policy change never moves the membership revision (which the promoter's
// membership steps compare-and-swap on).
func (l layout) retention(rangeID string) string { return l.prefix + retentionDir + rangeID }

// sessions is the directory of one holder's live sessions.
func (l layout) sessions(holderID string) string { return l.prefix + sessionsDir + holderID + "/" }

// session is one session's record. Fixed-width hex keeps a holder's sessions
// in id order and makes the key independent of how ids are printed elsewhere.
func (l layout) session(holderID string, sessionID int64) string {
	return fmt.Sprintf("%s%016x", l.sessions(holderID), uint64(sessionID))
}

// keyKind is which subtree a key is in.
type keyKind int

const (
	kindOther keyKind = iota
	kindEpoch
	kindLease
	kindMembers
	kindSession
	kindRetention
)

// parse names the subtree of key and the range id (for epochs, leases,
// members and retention). Keys that do not parse, e.g. written by hand, are kindOther.
func (l layout) parse(key string) (keyKind, string) {
	rest, ok := strings.CutPrefix(key, l.prefix)
	if !ok {
		return kindOther, ""
	}
	for _, d := range []struct {
		dir  string
		kind keyKind
	}{{epochsDir, kindEpoch}, {leasesDir, kindLease}, {membersDir, kindMembers}, {retentionDir, kindRetention}} {
		if id, ok := strings.CutPrefix(rest, d.dir); ok {
			if wire.ValidateRangeID(id) != nil {
				return kindOther, ""
			}
			return d.kind, id
		}
	}
	if strings.HasPrefix(rest, sessionsDir) {
		return kindSession, ""
	}
	return kindOther, ""
}

// formatEpoch and parseEpoch are the epoch key's value format: decimal ASCII,
// so that etcdctl shows it and GrantEpoch can compare it as a string.
// Equality of the canonical decimal form is equality of the number, which is
// all the compare-and-swap needs.
func formatEpoch(e uint64) string { return strconv.FormatUint(e, 10) }

func parseEpoch(key string, v []byte) (uint64, error) {
	e, err := strconv.ParseUint(string(v), 10, 64)
	if err != nil || formatEpoch(e) != string(v) {
		return 0, fmt.Errorf("%w: %s holds %q, not a decimal epoch", errCorrupt, key, v)
	}
	return e, nil
}

// leaseRecord is the value of leases/<range>.
type leaseRecord struct {
	Epoch         uint64 `json:"epoch"`
	HolderID      string `json:"holder_id"`
	HolderAddress string `json:"holder_address,omitempty"`
	// SessionID is the etcd lease the key is attached to; it is kept in a
	// released record for the history, but nothing holds the lease then.
	SessionID int64 `json:"session_id"`
	// Released marks a lease given up by ReleaseLease (see the package comment).
	Released bool `json:"released,omitempty"`
}

func decodeLease(key string, v []byte) (leaseRecord, error) {
	var r leaseRecord
	if err := json.Unmarshal(v, &r); err != nil {
		return r, fmt.Errorf("%w: %s: %v", errCorrupt, key, err)
	}
	// Checked after reading, like any stored record: epoch 0 is never granted,
	// so a lease for it means the value was not written by this service.
	if r.Epoch == 0 || wire.ValidateRangeID(r.HolderID) != nil || r.SessionID <= 0 {
		return r, fmt.Errorf("%w: %s holds a malformed lease record %q", errCorrupt, key, v)
	}
	return r, nil
}

// sessionRecord is the value of sessions/<holder>/<id>.
type sessionRecord struct {
	HolderID      string `json:"holder_id"`
	HolderAddress string `json:"holder_address,omitempty"`
	TTLMillis     int64  `json:"ttl_ms"`
	// Closing is set by CloseSession just before it revokes the session, so
	// watchers report the leases that go with it as RELEASED, not EXPIRED.
	Closing bool `json:"closing,omitempty"`
}

func decodeSession(key string, v []byte) (sessionRecord, error) {
	var r sessionRecord
	if err := json.Unmarshal(v, &r); err != nil {
		return r, fmt.Errorf("%w: %s: %v", errCorrupt, key, err)
	}
	if wire.ValidateRangeID(r.HolderID) != nil {
		return r, fmt.Errorf("%w: %s holds a malformed session record %q", errCorrupt, key, v)
	}
	return r, nil
}

// membersRecord is the value of members/<range>.
type membersRecord struct {
	Replicas           []replicaRecord `json:"replicas"`
	PreferredReplicaID string          `json:"preferred_replica_id,omitempty"`
	// Change is the membership step in flight, if any (membership.go).
	Change *changeRecord `json:"change,omitempty"`
}

type replicaRecord struct {
	ID      string `json:"id"`
	Address string `json:"address"`
	// Incarnation is the member's data-directory id, once recorded.
	Incarnation string `json:"incarnation,omitempty"`
	// Learner: fetches, never counts.
	Learner bool `json:"learner,omitempty"`
}

func newMembersRecord(rs []*tenurev1.Replica, preferred string) membersRecord {
	m := membersRecord{Replicas: make([]replicaRecord, 0, len(rs)), PreferredReplicaID: preferred}
	for _, r := range rs {
		m.Replicas = append(m.Replicas, replicaRecord{ID: r.GetId(), Address: r.GetAddress(), Incarnation: r.GetIncarnation(), Learner: r.GetLearner()})
	}
	return m
}

func (m membersRecord) proto() []*tenurev1.Replica {
	out := make([]*tenurev1.Replica, 0, len(m.Replicas))
	for _, r := range m.Replicas {
		out = append(out, &tenurev1.Replica{Id: r.ID, Address: r.Address, Incarnation: r.Incarnation, Learner: r.Learner})
	}
	return out
}

func decodeMembers(key string, v []byte) (membersRecord, error) {
	var m membersRecord
	if err := json.Unmarshal(v, &m); err != nil {
		return m, fmt.Errorf("%w: %s: %v", errCorrupt, key, err)
	}
	// %v, not %w: a bad stored set is corruption, not the caller's invalid input.
	if err := wire.ValidateReplicas(m.proto()); err != nil {
		return m, fmt.Errorf("%w: %s holds a malformed replica set: %v", errCorrupt, key, err)
	}
	return m, nil
}

// retentionRecord is the value of retention/<range>. Both fields are always
// written (0 = unlimited), so a stored policy never depends on a default
// that a later version might change.
type retentionRecord struct {
	MaxBytes uint64 `json:"max_bytes"`
	MaxAgeMs int64  `json:"max_age_ms"`
}

func newRetentionRecord(p *tenurev1.RetentionPolicy) retentionRecord {
	return retentionRecord{MaxBytes: p.GetMaxBytes(), MaxAgeMs: p.GetMaxAgeMs()}
}

func (r retentionRecord) proto() *tenurev1.RetentionPolicy {
	return &tenurev1.RetentionPolicy{MaxBytes: r.MaxBytes, MaxAgeMs: r.MaxAgeMs}
}

// decodeRetention reads a retention record, or the defaults when kv is nil
// (a range stored before retention existed).
func decodeRetention(kv *mvccpb.KeyValue) (*tenurev1.RetentionPolicy, error) {
	if kv == nil {
		return wire.DefaultRetention(), nil
	}
	var r retentionRecord
	if err := json.Unmarshal(kv.Value, &r); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", errCorrupt, kv.Key, err)
	}
	p := r.proto()
	if err := wire.ValidateRetention(p); err != nil {
		return nil, fmt.Errorf("%w: %s holds a malformed retention policy: %v", errCorrupt, kv.Key, err)
	}
	return p, nil
}

// mustJSON encodes one of the records above; they are plain structs of
// strings, numbers and bools, which cannot fail to encode.
func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("lease: encode %T: %v", v, err))
	}
	return string(b)
}
