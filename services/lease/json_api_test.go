package lease_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tenurelog/tenure/internal/testnet"
)

// TestJSONCallersReadWhatIsWrong: a client in another language, calling
// with plain JSON over HTTP as curl does, gets InvalidArgument with a
// message that names the field it got wrong, in the API's words. They
// were "wire: invalid: replica 0 id: wire: invalid: range id is empty"
// for a replica without an id (blaming the range id, which was fine, with
// a Go package's name twice), and "lease: holder_id \"a/b\": wire: invalid:
// range id \"a/b\" has byte '/' ..." for a bad holder id.
func TestJSONCallersReadWhatIsWrong(t *testing.T) {
	env := newEnv(t)
	base := env.Server.URL()
	info := createRange(t, testCtx(t, time.Minute), env.Client, "known")
	rev := info.GetMembershipRevision()
	for _, tc := range []struct {
		procedure, body string
		// says must be in the message; blames must not.
		says, blames string
	}{
		{"/tenure.v1.LeaseService/GetRange", `{}`, "range id is empty", ""},
		{"/tenure.v1.LeaseService/CreateRange", `{"range_id":"r","replicas":[{"address":"http://127.0.0.1:1"}]}`, "replica 0: replica id is empty", "range id"},
		{"/tenure.v1.LeaseService/CreateRange", `{"range_id":"r","replicas":[{"id":"a/b","address":"http://127.0.0.1:1"}]}`, `replica id "a/b" has byte '/'`, "range id"},
		{"/tenure.v1.LeaseService/OpenSession", `{"holder_id":"a/b"}`, `holder_id "a/b" has byte '/'`, "range id"},
		{"/tenure.v1.LeaseService/ChangeMembership", fmt.Sprintf(`{"range_id":"known","expected_revision":%d,"step":"MEMBERSHIP_STEP_REMOVE","replica":{}}`, rev), "replica id is empty", "range id"},
	} {
		got := testnet.PostJSON(t, base, tc.procedure, tc.body)
		if got.Status != 400 || got.Code != "invalid_argument" || !strings.Contains(got.Message, tc.says) ||
			(tc.blames != "" && strings.Contains(got.Message, tc.blames)) || strings.Contains(got.Message, "wire:") {
			t.Errorf("%s %s = %d %s %q; want 400 invalid_argument saying %q, not %q, and no Go package name (wire:)",
				tc.procedure, tc.body, got.Status, got.Code, got.Message, tc.says, tc.blames)
		}
	}
}

// TestReplicaAddressesAreBaseURLs: a replica's address is where every peer
// and client dials it, so a request naming one that is not a base URL is
// refused when it is made. CreateRange stored "not a url" and
// "127.0.0.1:7101" (200), and the promotion then failed with "missing
// scheme"; a 1 MB address was answered 500 internal "lease: etcd:
// etcdserver: request is too large".
func TestReplicaAddressesAreBaseURLs(t *testing.T) {
	env := newEnv(t)
	base := env.Server.URL()
	info := createRange(t, testCtx(t, time.Minute), env.Client, "known")
	rev := info.GetMembershipRevision()
	huge := "http://" + strings.Repeat("a", 1<<20)
	for _, tc := range []struct {
		procedure, body, says string
	}{
		{"/tenure.v1.LeaseService/CreateRange", `{"range_id":"a","replicas":[{"id":"r1","address":"not a url"}]}`, `replica r1: address "not a url" is not a base URL`},
		{"/tenure.v1.LeaseService/CreateRange", `{"range_id":"b","replicas":[{"id":"r1","address":"127.0.0.1:7101"}]}`, "want http://HOST:PORT or https://HOST:PORT"},
		{"/tenure.v1.LeaseService/CreateRange", `{"range_id":"c","replicas":[{"id":"r1","address":"` + huge + `"}]}`, "address is 1048583 bytes, at most 1024"},
		{"/tenure.v1.LeaseService/SetReplicas", fmt.Sprintf(`{"range_id":"known","expected_revision":%d,"replicas":[{"id":"r1","address":"http://127.0.0.1:7101"},{"id":"r2","address":"ftp://127.0.0.1:1"},{"id":"r3","address":"http://127.0.0.1:7103"}]}`, rev), `replica r2: address "ftp://127.0.0.1:1" is not a base URL`},
		{"/tenure.v1.LeaseService/ChangeMembership", fmt.Sprintf(`{"range_id":"known","expected_revision":%d,"step":"MEMBERSHIP_STEP_ADD_LEARNER","replica":{"id":"r9","address":"r9:7109"}}`, rev), "is not a base URL"},
	} {
		got := testnet.PostJSON(t, base, tc.procedure, tc.body)
		if got.Status != 400 || got.Code != "invalid_argument" || !strings.Contains(got.Message, tc.says) {
			body := tc.body
			if len(body) > 200 {
				body = body[:200] + "..."
			}
			t.Errorf("%s %s = %d %s %q; want 400 invalid_argument saying %q", tc.procedure, body, got.Status, got.Code, got.Message, tc.says)
		}
	}
	// Nothing was stored.
	for _, id := range []string{"a", "b", "c"} {
		if got := testnet.PostJSON(t, base, "/tenure.v1.LeaseService/GetRange", `{"range_id":"`+id+`"}`); got.Code != "not_found" {
			t.Errorf("range %s after a refused CreateRange: %d %s", id, got.Status, got.Body)
		}
	}
}
