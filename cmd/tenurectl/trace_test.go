package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var rewriteTrace = flag.Bool("rewrite-trace", false, "rewrite testdata/trace_waterfall.txt with what 'tenurectl trace' draws")

const recordedTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"

// fakeJaeger serves testdata/jaeger_trace.json, a trace shaped like the one
// Jaeger's query API returns for a promotion (the old leader r1 down, r2
// chosen), at /api/traces/{its id}, and 404 with Jaeger's error body for any
// other id. It records the paths asked for.
func fakeJaeger(t *testing.T) (*httptest.Server, *[]string) {
	t.Helper()
	body, err := os.ReadFile(filepath.Join("testdata", "jaeger_trace.json"))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.Method+" "+r.URL.Path)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path != "/api/traces/"+recordedTraceID {
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"data":null,"total":0,"limit":0,"offset":0,"errors":[{"code":404,"msg":"trace not found"}]}`))
			return
		}
		w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv, &paths
}

func TestTraceDrawsWaterfall(t *testing.T) {
	srv, paths := fakeJaeger(t)
	code, stdout, stderr := runCmd(t, "trace", "--jaeger", srv.URL+"/", strings.ToUpper(recordedTraceID))
	if code != exitOK {
		t.Fatalf("tenurectl trace: status %d, stderr:\n%s", code, stderr)
	}
	if want := []string{"GET /api/traces/" + recordedTraceID}; strings.Join(*paths, ",") != strings.Join(want, ",") {
		t.Errorf("asked Jaeger for %q, want %q", *paths, want)
	}
	// The last line links the trace in Jaeger's UI, on the --jaeger server
	// (its address is the test's; the golden file says JAEGER).
	if want := "\nin Jaeger's UI: " + srv.URL + "/trace/" + recordedTraceID + "\n"; !strings.HasSuffix(stdout, want) {
		t.Errorf("tenurectl trace's output ends %q, want %q", stdout[max(0, len(stdout)-120):], want)
	}
	stdout = strings.ReplaceAll(stdout, srv.URL, "http://JAEGER")
	golden := filepath.Join("testdata", "trace_waterfall.txt")
	if *rewriteTrace {
		if err := os.WriteFile(golden, []byte(stdout), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if stdout != string(want) {
		t.Errorf("tenurectl trace drew:\n%s\nwant (%s; -rewrite-trace to update):\n%s", stdout, golden, want)
	}
}

func TestTraceJSON(t *testing.T) {
	srv, _ := fakeJaeger(t)
	code, stdout, stderr := runCmd(t, "trace", recordedTraceID, "--json", "--jaeger="+srv.URL)
	if code != exitOK {
		t.Fatalf("tenurectl trace --json: status %d, stderr:\n%s", code, stderr)
	}
	checkJSONStyle(t, "trace --json", stdout, false)
	// --json before the command name, as for every other command.
	if code, global, stderr := runCmd(t, "--json", "trace", recordedTraceID, "--jaeger="+srv.URL); code != exitOK || global != stdout {
		t.Errorf("tenurectl --json trace: status %d, stderr %q; want the same JSON as 'trace --json'", code, stderr)
	}
	var got waterfall
	if err := json.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, stdout)
	}
	if want := srv.URL + "/trace/" + recordedTraceID; got.UIURL != want {
		t.Errorf("ui_url = %q, want %q", got.UIURL, want)
	}
	if got.TraceID != recordedTraceID || got.DurationUs != 48210 || len(got.Spans) != 26 {
		t.Fatalf("trace %s, %dus, %d spans; want %s, 48210us, 26 spans", got.TraceID, got.DurationUs, len(got.Spans), recordedTraceID)
	}
	// Depth-first, children by start time: the promotion's steps in order.
	var steps []string
	for _, s := range got.Spans {
		if s.Depth == 1 && s.Kind == "" {
			steps = append(steps, s.Name+":"+strings.TrimSpace(attrOrEmpty(s, "tenure.replica")))
		}
	}
	want := "grant-epoch: fence-all: choose-candidate: adopt:r2 adopt:r3 bind-lease:r2 record-transition:"
	if strings.Join(steps, " ") != want {
		t.Errorf("promote's step children = %q, want %q", strings.Join(steps, " "), want)
	}
	root := got.Spans[0]
	if root.Name != "promote" || root.Depth != 0 || root.ParentID != "" || root.StartOffsetUs != 0 || root.Service != "promoter-1" {
		t.Errorf("first row = %+v, want the promote root at offset 0 in promoter-1", root)
	}
	// A replica's server span sits under the promoter's client span, and
	// is attributed to the replica that recorded it.
	byID := map[string]waterfallRow{}
	for _, s := range got.Spans {
		byID[s.SpanID] = s
	}
	servers := 0
	for _, s := range got.Spans {
		if s.Kind != "server" || s.Name != "tenure.v1.ReplicaService/Fence" {
			continue
		}
		servers++
		client := byID[s.ParentID]
		fence := byID[client.ParentID]
		if client.Kind != "client" || fence.Name != "fence" || s.Depth != fence.Depth+2 {
			t.Errorf("Fence server span's parents = %q (%s) < %q, want a client span under a fence span", client.Name, client.Kind, fence.Name)
		}
		if replica := attrOrEmpty(fence, "tenure.replica"); s.Instance != replica {
			t.Errorf("Fence server span recorded by %s, under the fence of %s", s.Instance, replica)
		}
	}
	if servers != 2 {
		t.Errorf("%d Fence server spans, want 2 (r1 was down)", servers)
	}
	for _, s := range got.Spans {
		if s.Name == "fence" && attrOrEmpty(s, "tenure.replica") == "r1" && !strings.Contains(s.Error, "connection refused") {
			t.Errorf("r1's failed fence has error %q, want the dial error", s.Error)
		}
	}
}

func attrOrEmpty(r waterfallRow, key string) string {
	if v, ok := r.Attributes[key]; ok {
		b, _ := json.Marshal(v)
		return strings.Trim(string(b), `"`)
	}
	return ""
}

func TestTraceJaegerFromEnvironment(t *testing.T) {
	srv, paths := fakeJaeger(t)
	var out, errOut bytes.Buffer
	e := &env{stdout: &out, stderr: &errOut, getenv: func(k string) string {
		if k == "TENURECTL_JAEGER" {
			return srv.URL
		}
		return ""
	}}
	if code := run(context.Background(), e, []string{"trace", recordedTraceID}); code != exitOK {
		t.Fatalf("status %d, stderr:\n%s", code, errOut.String())
	}
	if len(*paths) != 1 {
		t.Errorf("TENURECTL_JAEGER's server got %d requests, want 1", len(*paths))
	}
	if want := "in Jaeger's UI: " + srv.URL + "/trace/" + recordedTraceID + "\n"; !strings.HasSuffix(out.String(), want) {
		t.Errorf("the UI link defaults to TENURECTL_JAEGER's server: output ends %q, want %q", out.String()[max(0, out.Len()-120):], want)
	}
}

// make ctl runs tenurectl on the stack's network, where Jaeger is
// http://jaeger:16686, but the engineer's browser reaches the port compose
// publishes: --jaeger-ui (TENURECTL_JAEGER_UI) names that one for the link,
// and a bad value is refused before Jaeger is asked.
func TestTraceJaegerUILink(t *testing.T) {
	srv, paths := fakeJaeger(t)
	var out, errOut bytes.Buffer
	e := &env{stdout: &out, stderr: &errOut, getenv: func(k string) string {
		if k == "TENURECTL_JAEGER_UI" {
			return "127.0.0.1:16686"
		}
		return ""
	}}
	if code := run(context.Background(), e, []string{"trace", "--jaeger", srv.URL, recordedTraceID}); code != exitOK {
		t.Fatalf("status %d, stderr:\n%s", code, errOut.String())
	}
	if want := "\nin Jaeger's UI: http://127.0.0.1:16686/trace/" + recordedTraceID + "\n"; !strings.HasSuffix(out.String(), want) {
		t.Errorf("output ends %q, want %q", out.String()[max(0, out.Len()-120):], want)
	}
	code, _, stderr := runCmd(t, "trace", "--jaeger", srv.URL, "--jaeger-ui", "ftp://x", recordedTraceID)
	if code != exitUsage || !strings.Contains(stderr, "--jaeger-ui") {
		t.Errorf("--jaeger-ui ftp://x: status %d, stderr %q; want a usage error naming --jaeger-ui", code, stderr)
	}
	if len(*paths) != 1 {
		t.Errorf("Jaeger got %d requests, want 1 (none for the refused --jaeger-ui)", len(*paths))
	}
}

func TestTraceErrors(t *testing.T) {
	srv, _ := fakeJaeger(t)
	down := httptest.NewServer(http.NotFoundHandler())
	downURL := down.URL
	down.Close()
	// A server that is not Jaeger: 404 for every path, in plain text. It
	// was "trace ... not found in Jaeger", as if Jaeger had answered.
	notJaeger := httptest.NewServer(http.NotFoundHandler())
	defer notJaeger.Close()
	tests := []struct {
		name     string
		args     []string
		wantCode int
		want     string
	}{
		{"unknown trace", []string{"trace", "--jaeger", srv.URL, "00000000000000000000000000000001"}, exitFail, "trace 00000000000000000000000000000001 not found in Jaeger at " + srv.URL},
		{"Jaeger down", []string{"trace", "--jaeger", downURL, recordedTraceID}, exitFail, "cannot reach Jaeger at " + downURL},
		{"not a trace id", []string{"trace", "--jaeger", srv.URL, "promote-42"}, exitUsage, `trace id "promote-42": want 32 hex digits`},
		{"no trace id", []string{"trace", "--jaeger", srv.URL}, exitUsage, "want exactly one TRACE_ID, got 0"},
		{"bad Jaeger URL", []string{"trace", "--jaeger", "jaeger", recordedTraceID}, exitUsage, `--jaeger: "jaeger" is not a server address: want HOST:PORT, http://HOST:PORT or https://HOST:PORT`},
		{"not Jaeger", []string{"trace", "--jaeger", notJaeger.URL, recordedTraceID}, exitFail, "Jaeger's query API is not at " + notJaeger.URL},
		{"Jaeger as HOST:PORT", []string{"trace", "--jaeger", strings.TrimPrefix(srv.URL, "http://"), "00000000000000000000000000000001"}, exitFail, "trace 00000000000000000000000000000001 not found in Jaeger at " + srv.URL},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCmd(t, tt.args...)
			if code != tt.wantCode || !strings.Contains(stderr, tt.want) {
				t.Errorf("tenurectl %v: status %d, stderr %q; want status %d and %q", tt.args, code, stderr, tt.wantCode, tt.want)
			}
			if stdout != "" {
				t.Errorf("tenurectl %v printed %q on stdout", tt.args, stdout)
			}
		})
	}
}

// Spans whose parents name each other are drawn, marked, not dropped: a
// trace of two such spans drew "0 spans, 30ms, 0 services" and exited 0.
func TestTraceDrawsSpansInAParentCycle(t *testing.T) {
	const id = "0000000000000000000000000000c1c1"
	span := func(spanID, parent string, start int64) string {
		return `{"traceID":"` + id + `","spanID":"` + spanID + `","operationName":"op-` + spanID + `","references":[{"refType":"CHILD_OF","traceID":"` + id + `","spanID":"` + parent + `"}],"startTime":` + fmt.Sprint(start) + `,"duration":30000,"tags":[],"processID":"p1"}`
	}
	body := `{"data":[{"traceID":"` + id + `","spans":[` + span("00000000000000a1", "00000000000000a2", 1000) + `,` + span("00000000000000a2", "00000000000000a1", 2000) +
		`],"processes":{"p1":{"serviceName":"tenure-promoter","tags":[]}}}]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(body))
	}))
	defer srv.Close()
	code, stdout, stderr := runCmd(t, "trace", "--jaeger", srv.URL, id)
	if code != exitOK || !strings.Contains(stdout, "2 spans") || !strings.Contains(stdout, "op-00000000000000a1") ||
		!strings.Contains(stdout, "op-00000000000000a2") || !strings.Contains(stdout, "cycle") {
		t.Errorf("tenurectl trace of two spans naming each other: status %d, stdout:\n%s\nstderr:\n%s\nwant both spans drawn, the cycle said", code, stdout, stderr)
	}
}
