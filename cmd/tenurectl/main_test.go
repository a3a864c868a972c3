package main

import (
	"bytes"
	"context"
	"flag"
	"strings"
	"testing"
)

// runCmd runs tenurectl in-process with args and returns its exit status and
// what it printed.
func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	e := &env{stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }}
	code = run(context.Background(), e, args)
	return code, out.String(), errOut.String()
}

func TestHelpListsEveryCommand(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		code, stdout, _ := runCmd(t, args...)
		if code != exitOK {
			t.Errorf("tenurectl %v exit status = %d, want 0", args, code)
		}
		for _, c := range commands {
			if !strings.Contains(stdout, c.name) || !strings.Contains(stdout, c.summary) {
				t.Errorf("tenurectl %v does not list %q with its summary:\n%s", args, c.name, stdout)
			}
		}
	}
}

func TestEveryCommandHasHelp(t *testing.T) {
	for _, c := range commands {
		args := append(strings.Fields(c.name), "--help")
		code, _, stderr := runCmd(t, args...)
		if code != exitOK || !strings.Contains(stderr, "Usage: tenurectl "+c.name) {
			t.Errorf("tenurectl %s --help: status %d, output:\n%s\nwant status 0 and a usage line", c.name, code, stderr)
		}
		// "help CMD" is the same as "CMD --help".
		if code, _, stderr := runCmd(t, append([]string{"help"}, strings.Fields(c.name)...)...); code != exitOK || !strings.Contains(stderr, "Usage: tenurectl "+c.name) {
			t.Errorf("tenurectl help %s: status %d, output:\n%s", c.name, code, stderr)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, "Commands:"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"journal"}, `"journal" needs a subcommand: 'tenurectl journal dump'`},
		{[]string{"journal", "dump"}, "want exactly one journal PATH, got 0"},
		{[]string{"journal", "dump", "a", "b"}, "want exactly one journal PATH, got 2"},
		{[]string{"journal", "dump", "--bogus", "a"}, "flag provided but not defined: -bogus"},
	}
	for _, tt := range tests {
		code, _, stderr := runCmd(t, tt.args...)
		if code != exitUsage || !strings.Contains(stderr, tt.want) {
			t.Errorf("tenurectl %q: status %d, stderr:\n%s\nwant status 2 and %q", tt.args, code, stderr, tt.want)
		}
	}
}

func TestParseArgs(t *testing.T) {
	tests := []struct {
		args       []string
		wantJSON   bool
		positional []string
	}{
		{[]string{"p"}, false, []string{"p"}},
		{[]string{"--json", "p"}, true, []string{"p"}},
		{[]string{"p", "--json"}, true, []string{"p"}},
		{[]string{"p", "q", "-json", "r"}, true, []string{"p", "q", "r"}},
		{[]string{"--", "--json"}, false, []string{"--json"}},
		{[]string{"p", "--", "-x"}, false, []string{"p", "-x"}},
	}
	for _, tt := range tests {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		asJSON := fs.Bool("json", false, "")
		got, err := parseArgs(fs, tt.args)
		if err != nil || *asJSON != tt.wantJSON || strings.Join(got, " ") != strings.Join(tt.positional, " ") {
			t.Errorf("parseArgs(%q) = %q, json=%v, %v; want %q, json=%v", tt.args, got, *asJSON, err, tt.positional, tt.wantJSON)
		}
	}
}
