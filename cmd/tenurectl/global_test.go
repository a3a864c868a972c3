package main

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParseGlobal(t *testing.T) {
	tests := []struct {
		args            []string
		lease, promoter string
		json            bool
		rest            string
		wantErr         string
	}{
		{args: []string{"status"}, rest: "status"},
		{args: []string{"--lease", "http://l:1", "status", "x"}, lease: "http://l:1", rest: "status x"},
		{args: []string{"--lease=http://l:1", "-promoter", "http://p:2", "--json", "epochs", "r"}, lease: "http://l:1", promoter: "http://p:2", json: true, rest: "epochs r"},
		{args: []string{"--json=false", "status"}, rest: "status"},
		// Anything else ends the global flags: the command reports it.
		{args: []string{"--help"}, rest: "--help"},
		{args: []string{"--bogus", "status"}, rest: "--bogus status"},
		{args: []string{"--lease"}, wantErr: "flag --lease needs a URL"},
		{args: []string{"--cert"}, wantErr: "flag --cert needs a FILE"},
	}
	for _, tt := range tests {
		e := &env{}
		rest, err := parseGlobal(e, tt.args)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("parseGlobal(%q) error = %v, want %q", tt.args, err, tt.wantErr)
			}
			continue
		}
		if err != nil || strings.Join(rest, " ") != tt.rest || e.global.lease != tt.lease || e.global.promoter != tt.promoter || e.global.json != tt.json {
			t.Errorf("parseGlobal(%q) = %q, %+v, %v; want %q, lease %q, promoter %q, json %v", tt.args, rest, e.global, err, tt.rest, tt.lease, tt.promoter, tt.json)
		}
	}
}

// A global --json before the command name applies to every command that
// reads, journal dump too.
func TestGlobalJSON(t *testing.T) {
	path := recordJournal(t)
	code, stdout, stderr := runCmd(t, "--json", "journal", "dump", path)
	var got dumpJSON
	if code != exitOK || json.Unmarshal([]byte(stdout), &got) != nil || got.Path != path {
		t.Errorf("tenurectl --json journal dump: status %d, stdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
}

// A flag among the command's arguments wins over one given before the
// command, which wins over the environment, which wins over the default.
func TestClusterFlagPrecedence(t *testing.T) {
	vars := map[string]string{"TENURECTL_LEASE": "http://env-lease:1", "TENURECTL_PROMOTER": "http://env-promoter:2"}
	tests := []struct {
		global, args    []string
		lease, promoter string
	}{
		{nil, nil, "http://env-lease:1", "http://env-promoter:2"},
		{[]string{"--lease", "http://global:3"}, nil, "http://global:3", "http://env-promoter:2"},
		{[]string{"--lease", "http://global:3"}, []string{"--lease", "http://arg:4"}, "http://arg:4", "http://env-promoter:2"},
	}
	for _, tt := range tests {
		var out strings.Builder
		e := &env{stdout: &out, stderr: &out, getenv: func(k string) string { return vars[k] }}
		if _, err := parseGlobal(e, tt.global); err != nil {
			t.Fatal(err)
		}
		fs := newFlags(e, "x", "", "")
		o := addClusterFlags(e, fs)
		if _, err := parseArgs(fs, tt.args); err != nil {
			t.Fatal(err)
		}
		if *o.lease != tt.lease || *o.promoter != tt.promoter {
			t.Errorf("global %q, args %q: lease %q, promoter %q; want %q, %q", tt.global, tt.args, *o.lease, *o.promoter, tt.lease, tt.promoter)
		}
	}
	e := &env{getenv: func(string) string { return "" }}
	o := addClusterFlags(e, newFlags(e, "x", "", ""))
	if *o.lease != defaultLeaseURL || *o.promoter != defaultPromoterURL {
		t.Errorf("defaults: lease %q, promoter %q", *o.lease, *o.promoter)
	}
}

// --cacert, --cert and --key go before the command too, as --help says of
// every global flag ("tenurectl --cert X --key Y status" was "unknown
// command \"--cert\""), and win over the environment; after the command
// they win over both.
func TestTLSFlagsBeforeTheCommand(t *testing.T) {
	e := &env{getenv: func(k string) string {
		return map[string]string{"TENURECTL_CACERT": "env-ca.pem", "TENURECTL_CERT": "env.pem"}[k]
	}}
	rest, err := parseGlobal(e, []string{"--cacert", "ca.pem", "--cert=op.pem", "-key", "op-key.pem", "status", "--key", "late-key.pem"})
	if err != nil || strings.Join(rest, " ") != "status --key late-key.pem" {
		t.Fatalf("parseGlobal = %q, %v", rest, err)
	}
	fs := newFlags(e, "status", "", "")
	o := addClusterFlags(e, fs)
	if _, err := parseArgs(fs, rest[1:]); err != nil {
		t.Fatal(err)
	}
	if *o.cacert != "ca.pem" || *o.cert != "op.pem" || *o.key != "late-key.pem" {
		t.Errorf("cacert, cert, key = %q, %q, %q; want ca.pem, op.pem (before the command, over the environment), late-key.pem (after it)", *o.cacert, *o.cert, *o.key)
	}
}
