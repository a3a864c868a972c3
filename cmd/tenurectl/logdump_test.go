package main

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// writeStore leaves in a new data directory one range "r" that led epoch 1
// (offsets 0-2) and epoch 2 (offsets 3-4), with HWM 4: offset 4 is an
// uncommitted tail. It returns the directory.
func writeStore(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	s, err := logstore.Open(dir, logstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.CreateRange("r")
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	replicas := []*tenurev1.Replica{{Id: "r1", Address: "http://r1"}, {Id: "r2", Address: "http://r2"}}
	for _, epoch := range []uint64{1, 2} {
		must(r.SetState(logstore.State{FencedEpoch: epoch, Epoch: epoch, Role: tenurev1.Role_ROLE_LEADER, LeaderID: "r1", LeaderAddress: "http://r1", Replicas: replicas}))
		must(r.RecordEpoch(epoch, r.LogEnd()))
		_, err := r.Append(epoch, true, [][]byte{{}})
		must(err)
		values := [][]byte{[]byte("a"), []byte("b")}
		if epoch == 2 {
			values = [][]byte{[]byte("c")}
		}
		_, err = r.Append(epoch, false, values)
		must(err)
	}
	must(r.SetHWM(4))
	must(s.Close())
	return dir
}

func TestLogDumpJSON(t *testing.T) {
	dir := writeStore(t)
	code, stdout, stderr := runCmd(t, "log", "dump", "--data-dir", dir, "--range", "r", "--json")
	if code != exitOK {
		t.Fatalf("status %d, stderr:\n%s", code, stderr)
	}
	checkJSONStyle(t, "log dump --json", stdout, false)
	var got logDumpJSON
	if err := json.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatalf("%v in:\n%s", err, stdout)
	}
	want := logDumpJSON{
		DataDir: dir, Range: "r", LogStart: 0, LogEnd: 5, HighWaterMark: 4, FencedEpoch: 2, Epoch: 2,
		Role: "leader", LeaderID: "r1",
		History: []epochStartJSON{{1, 0}, {2, 3}},
		Records: []logRecordJSON{
			{Offset: 0, Epoch: 1, EpochStart: true, Committed: true},
			{Offset: 1, Epoch: 1, Committed: true, Value: "a"},
			{Offset: 2, Epoch: 1, Committed: true, Value: "b"},
			{Offset: 3, Epoch: 2, EpochStart: true, Committed: true},
			{Offset: 4, Epoch: 2, Committed: false, Value: "c"},
		},
		Replicas: []logReplicaJSON{{"r1", "http://r1"}, {"r2", "http://r2"}},
		Ranges:   []string{"r"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("dump:\n got %+v\nwant %+v", got, want)
	}
	// The global --json before the command name works too.
	if code, stdout2, _ := runCmd(t, "--json", "log", "dump", "--data-dir", dir, "--range", "r"); code != exitOK || stdout2 != stdout {
		t.Errorf("global --json: status %d, output differs:\n%s", code, stdout2)
	}
}

func TestLogDumpText(t *testing.T) {
	dir := writeStore(t)
	code, stdout, stderr := runCmd(t, "log", "dump", "--data-dir", dir, "--range", "r")
	if code != exitOK {
		t.Fatalf("status %d, stderr:\n%s", code, stderr)
	}
	for _, want := range []string{
		"role      leader at epoch 2 (fenced at 2), leader r1",
		"log       [0, 5), HWM 4 (1 uncommitted)",
		"epochs    (1, 0) (2, 3)",
		"OFFSET  EPOCH  COMMITTED  VALUE",
		"0       1      true       (epoch start)",
		"2       1      true       \"b\"",
		"4       2      false      \"c\"",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
}

func TestLogDumpErrors(t *testing.T) {
	dir := writeStore(t)
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"log", "dump", "--range", "r"}, exitUsage, "--data-dir and --range are required"},
		{[]string{"log", "dump", "--data-dir", dir}, exitUsage, "--data-dir and --range are required"},
		{[]string{"log", "dump", "--data-dir", dir, "--range", "r", "extra"}, exitUsage, "unexpected arguments"},
		{[]string{"log", "dump", "--data-dir", t.TempDir(), "--range", "r"}, exitFail, "holds no replica store"},
		{[]string{"log", "dump", "--data-dir", dir, "--range", "nope"}, exitFail, `holds no range "nope" (it holds: r)`},
	}
	for _, tt := range tests {
		code, _, stderr := runCmd(t, tt.args...)
		if code != tt.code || !strings.Contains(stderr, tt.want) {
			t.Errorf("tenurectl %v: status %d, stderr:\n%s\nwant status %d and %q", tt.args, code, stderr, tt.code, tt.want)
		}
	}
}
