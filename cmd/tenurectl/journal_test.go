package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tenurelog/tenure/pkg/journal"
)

// recordJournal writes a real journal holding (1,0), (2,300), (17,123456789)
// and returns its path.
func recordJournal(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "r1.journal")
	j, err := journal.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []journal.EpochStart{{Epoch: 1, Start: 0}, {Epoch: 2, Start: 300}, {Epoch: 17, Start: 123456789}} {
		if err := j.Record(e.Epoch, e.Start); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func appendBytes(t *testing.T, path string, b []byte) []byte {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func wantUnchanged(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("dump changed the file: now %d bytes, was %d", len(got), len(want))
	}
}

func TestJournalDump(t *testing.T) {
	path := recordJournal(t)
	code, stdout, stderr := runCmd(t, "journal", "dump", path)
	if code != exitOK {
		t.Fatalf("status %d, stderr:\n%s", code, stderr)
	}
	want := "journal  " + path + `
size     68 bytes
header   TNRJRNL version 1
entries  3 of at most 4096
tail     clean

  INDEX  EPOCH      START        END
      0      1          0        300
      1      2        300  123456789
      2     17  123456789    log end
`
	if stdout != want {
		t.Fatalf("journal dump printed:\n%s\nwant:\n%s", stdout, want)
	}
}

// A torn tail is reported, with what opening the journal would cut, and the
// file is left exactly as it was: dump is read-only.
func TestJournalDumpTornTail(t *testing.T) {
	tests := []struct {
		name  string
		tail  []byte
		state string
		cut   string
	}{
		{"partial entry", []byte{0, 0, 0, 0, 0, 0, 0}, "torn: a partial final entry", "7 bytes at offset 68 would be cut"},
		{"bad checksum", make([]byte, 20), "final entry fails its checksum", "20 bytes at offset 68 would be cut"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := recordJournal(t)
			before := appendBytes(t, path, tt.tail)
			code, stdout, stderr := runCmd(t, "journal", "dump", path)
			if code != exitOK {
				t.Fatalf("status %d, stderr:\n%s", code, stderr)
			}
			for _, want := range []string{tt.state, tt.cut, "entries  3 of at most 4096", "2     17  123456789    log end"} {
				if !strings.Contains(stdout, want) {
					t.Errorf("journal dump output lacks %q:\n%s", want, stdout)
				}
			}
			wantUnchanged(t, path, before)
		})
	}
}

func TestJournalDumpJSON(t *testing.T) {
	path := recordJournal(t)
	before := appendBytes(t, path, []byte{1, 2, 3})
	// Flags may follow the path.
	code, stdout, stderr := runCmd(t, "journal", "dump", path, "--json")
	if code != exitOK {
		t.Fatalf("status %d, stderr:\n%s", code, stderr)
	}
	checkJSONStyle(t, "journal dump --json", stdout, false)
	var got dumpJSON
	if err := json.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, stdout)
	}
	want := dumpJSON{
		Path: path, SizeBytes: 71, Version: 1, MaxEntries: journal.MaxEntries,
		Entries: []entryJSON{{0, 1, 0}, {1, 2, 300}, {2, 17, 123456789}},
		Tail:    "torn", CutBytes: 3,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("journal dump --json = %+v, want %+v", got, want)
	}
	wantUnchanged(t, path, before)
}

func TestJournalDumpEmptyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r1.journal")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, _ := runCmd(t, "journal", "dump", path)
	if code != exitOK || !strings.Contains(stdout, "no complete header") || !strings.Contains(stdout, "history is unknown") {
		t.Fatalf("status %d, output:\n%s", code, stdout)
	}
	code, stdout, _ = runCmd(t, "journal", "dump", "--json", path)
	if code != exitOK || !strings.Contains(stdout, `"entries": []`) || !strings.Contains(stdout, `"tail": "no_header"`) {
		t.Fatalf("--json: status %d, output:\n%s", code, stdout)
	}
	wantUnchanged(t, path, nil)
}

// A corrupt journal is a failure (status 1) whose message says where the
// damage is and what to do about it.
func TestJournalDumpCorrupt(t *testing.T) {
	path := recordJournal(t)
	data, _ := os.ReadFile(path)
	data[8+20+3] ^= 0x01 // entry 1, not the last: damage, not a torn append
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCmd(t, "journal", "dump", path)
	if code != exitFail || stdout != "" {
		t.Fatalf("status %d, stdout %q; want 1 and nothing on stdout", code, stdout)
	}
	// What to do is what the replica does: it rebuilds the journal from
	// its log at its next start (the message said it refused the journal
	// and left the history unknown, and had the operator move the file
	// aside, which the replica never needed).
	for _, want := range []string{"corrupt", "entry 1 at byte 28", "rebuilds this journal from its own log", "tenurectl range rebuild RANGE --replica ID"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	for _, wrong := range []string{"history as unknown", "moving the file aside"} {
		if strings.Contains(stderr, wrong) {
			t.Errorf("stderr still says %q:\n%s", wrong, stderr)
		}
	}
	wantUnchanged(t, path, data)
}

func TestJournalDumpMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope.journal")
	code, _, stderr := runCmd(t, "journal", "dump", path)
	if code != exitFail || !strings.Contains(stderr, "no journal at "+path) {
		t.Fatalf("status %d, stderr:\n%s\nwant 1 and \"no journal at\"", code, stderr)
	}
	if _, err := os.Stat(path); err == nil {
		t.Fatal("dump created the missing journal")
	}
}
