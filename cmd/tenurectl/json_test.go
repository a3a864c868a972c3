package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// Every command's --json follows one schema style (README "JSON output"):
// snake_case keys, ids named *_id, 64-bit integers as numbers (never the
// protobuf mapping's quoted strings), one document per command and one
// object per line for streams.
func testJSONSchema(t *testing.T, c *testCluster) {
	leader := c.createRange("schema", "r1")
	c.mustCtl("", "produce", "schema", "a", "b")
	followCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tt := range []struct {
		args   []string
		stream bool
	}{
		{[]string{"range", "create", "schema-2", "--replicas", c.members()}, false},
		{[]string{"range", "list"}, false},
		{[]string{"range", "show", "schema"}, false},
		{[]string{"range", "set", "schema", "--retention-age", "30d"}, false},
		{[]string{"status"}, false},
		{[]string{"status", "schema"}, false},
		{[]string{"epochs", "schema"}, false},
		{[]string{"produce", "schema", "c", "d"}, true},
		{[]string{"produce", "schema", "e", "--echo"}, true},
		{[]string{"consume", "schema"}, true},
		{[]string{"consume", "schema", "--follow", "--limit", "2"}, true},
		{[]string{"promote", "schema", "--preferred", c.others(leader)[0]}, false},
		{[]string{"transitions", "schema"}, false},
		{[]string{"bench", "schema", "--records", "4"}, false},
		{[]string{"bench", "schema", "--duration", "600ms", "--disk"}, false},
		{[]string{"range", "delete", "schema-2"}, false},
	} {
		code, stdout, stderr := c.ctlContext(followCtx, "", append(tt.args, "--json")...)
		what := "tenurectl " + strings.Join(tt.args, " ") + " --json"
		if code != exitOK {
			t.Errorf("%s: status %d, stderr:\n%s", what, code, stderr)
			continue
		}
		checkJSONStyle(t, what, stdout, tt.stream)
	}
}

var snakeCase = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

// idKeys are names that must be spelled as ids, the way the API does.
var idKeys = map[string]string{"range": "range_id", "leader": "leader_id", "holder": "holder_id", "reference": "reference_id"}

var integerString = regexp.MustCompile(`^-?[0-9]+$`)

// checkJSONStyle fails unless out is one JSON document (or, for a stream,
// one JSON object per line) in the schema style.
func checkJSONStyle(t *testing.T, what, out string, stream bool) {
	t.Helper()
	for _, p := range jsonStyleProblems(out, stream) {
		t.Errorf("%s: %s", what, p)
	}
}

func jsonStyleProblems(out string, stream bool) []string {
	if strings.TrimSpace(out) == "" {
		return []string{"printed nothing"}
	}
	docs := []string{out}
	if stream {
		docs = strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	}
	var problems []string
	for _, doc := range docs {
		dec := json.NewDecoder(strings.NewReader(doc))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			problems = append(problems, fmt.Sprintf("not JSON (%v): %s", err, doc))
			continue
		}
		if dec.More() {
			problems = append(problems, fmt.Sprintf("more than one JSON value where one belongs (stream %v): %s", stream, doc))
		}
		if _, ok := v.(map[string]any); stream && !ok {
			problems = append(problems, "a stream line is not a JSON object: "+doc)
		}
		walkJSON(&problems, "", v)
	}
	return problems
}

func walkJSON(problems *[]string, path string, v any) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if !snakeCase.MatchString(k) {
				*problems = append(*problems, fmt.Sprintf("key %s.%s is not snake_case", path, k))
			}
			if want, ok := idKeys[k]; ok {
				*problems = append(*problems, fmt.Sprintf("key %s.%s names an id: want %s", path, k, want))
			}
			if k == "attributes" {
				// A span's attributes are data: OpenTelemetry's names.
				continue
			}
			walkJSON(problems, path+"."+k, e)
		}
	case []any:
		for _, e := range v {
			walkJSON(problems, path+"[]", e)
		}
	case string:
		if integerString.MatchString(v) && !quotedIDs[protoreflect.Name(path[strings.LastIndex(path, ".")+1:])] {
			*problems = append(*problems, fmt.Sprintf("%s is the string %q: integers are JSON numbers", path, v))
		}
	}
}

// The checker itself: the old styles fail it, the new one passes.
func TestJSONStyleChecker(t *testing.T) {
	for _, bad := range []string{
		`{"range_id":"r","epoch":"2"}`,
		`{"range":"r"}`,
		`{"rangeId":"r"}`,
		`{"replicas":[{"leader":"r1"}]}`,
		"{\"a\": 1}\n{\"b\": 2}\n",
	} {
		if len(jsonStyleProblems(bad, false)) == 0 {
			t.Errorf("jsonStyleProblems passed %s", bad)
		}
	}
	if p := jsonStyleProblems("{\"range_id\":\"r\",\"epoch\":2}\n{\"offset\":1}\n", true); len(p) != 0 {
		t.Errorf("a good stream: %q", p)
	}
}

// A 64-bit identifier (an etcd session id uses every bit) is printed as a
// quoted string with every digit: as a JSON number, jq and every reader of
// doubles rounded 7742710652541656470 to 7742710652541656000. Counts and
// offsets stay numbers.
func TestJSONKeepsSessionIDsExact(t *testing.T) {
	const id = 7742710652541656470
	b, err := protoJSON.Marshal(&tenurev1.RangeInfo{RangeId: "r", Epoch: 7, Lease: &tenurev1.Lease{HolderId: "r1", Epoch: 7, SessionId: id}})
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Epoch any `json:"epoch"`
		Lease struct {
			SessionID any `json:"session_id"`
		} `json:"lease"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	if got, ok := v.Lease.SessionID.(string); !ok || got != fmt.Sprint(id) {
		t.Errorf("lease.session_id = %#v, want the string %q: %s", v.Lease.SessionID, fmt.Sprint(id), b)
	}
	if _, ok := v.Epoch.(float64); !ok {
		t.Errorf("epoch = %#v, want a number: %s", v.Epoch, b)
	}
	if p := jsonStyleProblems(string(b), false); len(p) != 0 {
		t.Errorf("the style checker refuses it: %q", p)
	}
}
