package transport_test

import (
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/internal/testnet"
	"github.com/tenurelog/tenure/pkg/transport"
)

// A JSON request that does not parse is refused naming the proto message
// (tenure.v1.FetchRequest), the name a caller in another language knows.
// connect-go's codec named the Go type: "unmarshal into
// *tenurev1.FetchRequest: proto: (line 1:14): ...". JSON that parses still
// works, in both JSON content types, with unknown fields ignored.
func TestJSONRefusalsNameTheProtoMessage(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle("/t.Echo/Unary", connect.NewUnaryHandler("/t.Echo/Unary", echoUnary, transport.HandlerOptions()...))
	srv, err := transport.Serve("127.0.0.1:0", transport.Registration{Name: "t.Echo", Path: "/t.Echo/", Handler: mux})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()

	for _, tc := range []struct{ body, says string }{
		{`{"range_id":5}`, "invalid JSON for tenure.v1.FetchRequest: (line 1:13): invalid value for string field rangeId: 5"},
		{`{bad`, "invalid JSON for tenure.v1.FetchRequest: "},
		{``, "empty JSON for tenure.v1.FetchRequest: send {}"},
	} {
		got := testnet.PostJSON(t, srv.URL(), "/t.Echo/Unary", tc.body)
		if got.Code != "invalid_argument" || !strings.Contains(got.Message, tc.says) || strings.Contains(got.Message, "tenurev1") {
			t.Errorf("%q: %d %s %q; want invalid_argument saying %q, and no Go type", tc.body, got.Status, got.Code, got.Message, tc.says)
		}
	}
	if got := testnet.PostJSON(t, srv.URL(), "/t.Echo/Unary", `{"fetch_offset":"7","unknown":1}`); got.Status != 200 || got.Body != `{"highWaterMark":"7"}` {
		t.Errorf("a good JSON request: %d %s", got.Status, got.Body)
	}
	resp, err := http.Post(srv.URL()+"/t.Echo/Unary", "application/json; charset=utf-8", strings.NewReader(`{"fetchOffset":3}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("application/json; charset=utf-8: status %d", resp.StatusCode)
	}
}
