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
