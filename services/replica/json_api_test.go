package replica_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/tenurelog/tenure/internal/testnet"
)

// TestJSONProducerRefusalsSpeakTheAPI: an idempotent producer in another
// language (plain JSON over HTTP, as curl sends it) that skips a sequence
// or reuses a fenced producer epoch gets FailedPrecondition with what to
// send instead, and no name of a Go package behind the API. It read
// "range \"orders-0\": logstore: producer sequence out of order: ...".
func TestJSONProducerRefusalsSpeakTheAPI(t *testing.T) {
	c := newCluster(t, 3)
	n1, n2, n3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, n1, n2, n3)
	const append = "/tenure.v1.LogService/Append"
	// 16 bytes, base64 as protobuf's JSON mapping writes bytes.
	const producer = `"AAECAwQFBgcICQoLDA0ODw=="`
	body := func(epoch, seq int) string {
		return fmt.Sprintf(`{"range_id":%q,"records":["aA=="],"producer_id":%s,"producer_epoch":%d,"first_sequence":%d}`, rangeID, producer, epoch, seq)
	}
	if got := testnet.PostJSON(t, n1.url, append, body(1, 0)); got.Status != 200 {
		t.Fatalf("first idempotent append = %d %s", got.Status, got.Body)
	}
	for _, tc := range []struct {
		what, body, says string
	}{
		{"a sequence after a gap", body(1, 5), "expected sequence 1, got 5"},
		{"a fenced producer epoch", body(0, 0), "the range holds its epoch 1"},
	} {
		got := testnet.PostJSON(t, n1.url, append, tc.body)
		if got.Code != "failed_precondition" || !strings.Contains(got.Message, tc.says) || strings.Contains(got.Message, "logstore") {
			t.Errorf("%s: %d %s %q; want failed_precondition saying %q, without \"logstore\"", tc.what, got.Status, got.Code, got.Message, tc.says)
		}
	}
}

// TestTailDeadlineIsNotACleanEnd: a tail whose caller set a deadline
// (Connect-Timeout-Ms; grpc-timeout alike) ends with DeadlineExceeded when
// it passes. It ended with "{}", the end of a stream that completed, which
// a client that relies on the server's deadline (curl) cannot tell from a
// tail that is over; a tail never is.
func TestTailDeadlineIsNotACleanEnd(t *testing.T) {
	c := newCluster(t, 3)
	n1, n2, n3 := c.node(1), c.node(2), c.node(3)
	c.elect(1, n1, n2, n3)
	c.mustAppend(n1, values("a", 2)...)
	body := fmt.Sprintf(`{"range_id":%q,"offset":1}`, rangeID)
	got := testnet.StreamJSON(t, n1.url, "/tenure.v1.LogService/Tail", body, http.Header{"Connect-Timeout-Ms": {"500"}})
	if got.Status != 200 || len(got.Messages) == 0 || !strings.Contains(got.End, `"deadline_exceeded"`) {
		t.Fatalf("tail with a 500 ms deadline: status %d, %d messages, end %s; want the records, then deadline_exceeded", got.Status, len(got.Messages), got.End)
	}
}
