package lease

import (
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// TestTranslate pins down how etcd events become lease events, including the
// cases a live test cannot force: several ranges and several revisions in one
// watch response, a corrupt value, a filter.
func TestTranslate(t *testing.T) {
	keys := layout{prefix: "/p/"}
	leaseVal := func(epoch uint64, holder string, session int64, released bool) string {
		return mustJSON(leaseRecord{Epoch: epoch, HolderID: holder, SessionID: session, Released: released})
	}
	sessionVal := func(holder string, closing bool) string {
		return mustJSON(sessionRecord{HolderID: holder, TTLMillis: 2000, Closing: closing})
	}
	put := func(key, val string, rev, lease int64) *clientv3.Event {
		return &clientv3.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte(key), Value: []byte(val), ModRevision: rev, Lease: lease}}
	}
	del := func(key, prev string, rev, lease int64) *clientv3.Event {
		return &clientv3.Event{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: []byte(key), ModRevision: rev},
			PrevKv: &mvccpb.KeyValue{Key: []byte(key), Value: []byte(prev), Lease: lease}}
	}
	ev := func(typ tenurev1.LeaseEventType, rangeID string, epoch uint64, holder string, rev int64) *tenurev1.WatchLeasesResponse {
		return &tenurev1.WatchLeasesResponse{Type: typ, RangeId: rangeID, Epoch: epoch, HolderId: holder, Revision: rev}
	}
	const (
		granted    = tenurev1.LeaseEventType_LEASE_EVENT_TYPE_GRANTED
		bound      = tenurev1.LeaseEventType_LEASE_EVENT_TYPE_BOUND
		expired    = tenurev1.LeaseEventType_LEASE_EVENT_TYPE_EXPIRED
		released   = tenurev1.LeaseEventType_LEASE_EVENT_TYPE_RELEASED
		membership = tenurev1.LeaseEventType_LEASE_EVENT_TYPE_MEMBERSHIP
	)

	tests := []struct {
		name   string
		evs    []*clientv3.Event
		filter map[string]bool
		want   []*tenurev1.WatchLeasesResponse
	}{
		{
			name: "CreateRange is one MEMBERSHIP, its epoch 0 is no grant",
			evs:  []*clientv3.Event{put("/p/members/r", `{"replicas":[{"id":"a","address":"x"}]}`, 5, 0), put("/p/epochs/r", "0", 5, 0)},
			want: []*tenurev1.WatchLeasesResponse{ev(membership, "r", 0, "", 5)},
		},
		{
			name: "a grant is one GRANTED naming the holder bound in the same txn",
			evs:  []*clientv3.Event{put("/p/epochs/r", "4", 9, 0), put("/p/leases/r", leaseVal(4, "prom", 77, false), 9, 77)},
			want: []*tenurev1.WatchLeasesResponse{ev(granted, "r", 4, "prom", 9)},
		},
		{
			name: "bind, release, then expiry of the next holder, across revisions",
			evs: []*clientv3.Event{
				put("/p/leases/r", leaseVal(4, "leader", 78, false), 10, 78),
				put("/p/leases/r", leaseVal(4, "leader", 78, true), 11, 0),
				del("/p/leases/s", leaseVal(2, "other", 79, false), 12, 79),
				del("/p/sessions/other/000000000000004f", sessionVal("other", false), 12, 79),
			},
			want: []*tenurev1.WatchLeasesResponse{
				ev(bound, "r", 4, "leader", 10),
				ev(released, "r", 4, "leader", 11),
				ev(expired, "s", 2, "other", 12),
			},
		},
		{
			name: "closing a session releases every range it held, in one revision",
			evs: []*clientv3.Event{
				del("/p/leases/a", leaseVal(3, "leader", 80, false), 20, 80),
				del("/p/leases/b", leaseVal(5, "leader", 80, false), 20, 80),
				del("/p/sessions/leader/0000000000000050", sessionVal("leader", true), 20, 80),
			},
			want: []*tenurev1.WatchLeasesResponse{ev(released, "a", 3, "leader", 20), ev(released, "b", 5, "leader", 20)},
		},
		{
			name: "a closing session only marks its own leases released",
			evs: []*clientv3.Event{
				del("/p/leases/a", leaseVal(3, "leader", 80, false), 21, 80),
				del("/p/leases/b", leaseVal(5, "other", 81, false), 21, 81),
				del("/p/sessions/leader/0000000000000050", sessionVal("leader", true), 21, 80),
			},
			want: []*tenurev1.WatchLeasesResponse{ev(released, "a", 3, "leader", 21), ev(expired, "b", 5, "other", 21)},
		},
		{
			name:   "a filter keeps only the named ranges",
			evs:    []*clientv3.Event{put("/p/epochs/a", "1", 30, 0), put("/p/epochs/b", "1", 31, 0)},
			filter: map[string]bool{"b": true},
			want:   []*tenurev1.WatchLeasesResponse{ev(granted, "b", 1, "", 31)},
		},
		{
			name: "corrupt values and foreign keys are skipped",
			evs: []*clientv3.Event{
				put("/p/epochs/a", "01", 40, 0),
				put("/p/leases/a", "{", 41, 0),
				put("/p/other/a", "x", 42, 0),
				put("/p/epochs/a/b", "3", 43, 0),
				put("/p/epochs/a", "2", 44, 0),
			},
			want: []*tenurev1.WatchLeasesResponse{ev(granted, "a", 2, "", 44)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := translate(keys, tt.evs, tt.filter, func(string, error) {})
			if len(got) != len(tt.want) {
				t.Fatalf("translate() = %v, want %v", got, tt.want)
			}
			for i := range got {
				if !proto.Equal(got[i], tt.want[i]) {
					t.Fatalf("translate()[%d] = %v, want %v", i, got[i], tt.want[i])
				}
			}
		})
	}
}
