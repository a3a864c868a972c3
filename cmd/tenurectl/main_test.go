package main

import (
	"bytes"
	"context"
	"flag"
	"runtime"
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
		// On stdout, as 'tenurectl --help': '| less' shows it.
		code, stdout, stderr := runCmd(t, args...)
		if code != exitOK || !strings.Contains(stdout, "Usage: tenurectl "+c.name) || stderr != "" {
			t.Errorf("tenurectl %s --help: status %d, stdout:\n%s\nstderr:\n%s\nwant status 0 and a usage line on stdout", c.name, code, stdout, stderr)
		}
		// "help CMD" is the same as "CMD --help".
		if code, stdout, _ := runCmd(t, append([]string{"help"}, strings.Fields(c.name)...)...); code != exitOK || !strings.Contains(stdout, "Usage: tenurectl "+c.name) {
			t.Errorf("tenurectl help %s: status %d, output:\n%s", c.name, code, stdout)
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
		{[]string{"journal", "dump", "--bogus", "a"}, "flag provided but not defined: --bogus"},
		{[]string{"consume", "r", "--from", "x"}, `invalid value "x" for flag --from`},
		// Refused before any call: these used to reach the cluster (an
		// empty --to ran an ordinary promotion, a negative catch-up
		// timeout went to the promoter, a negative --retry-for was taken).
		{[]string{"promote", "r", "--to", ""}, "--to needs a replica id"},
		{[]string{"produce", "r", "x", "--retry-for", "-1s"}, `invalid value "-1s" for flag --retry-for: want 0 or a positive duration`},
		{[]string{"range", "add-replica", "r", "r5=http://127.0.0.1:1", "--catch-up-timeout", "-1s"}, `invalid value "-1s" for flag --catch-up-timeout: want a positive duration`},
		{[]string{"range", "replace-replica", "r", "--remove", "r1", "--add", "r5=http://127.0.0.1:1", "--catch-up-timeout", "0s"}, "want a positive duration"},
		{[]string{"range", "rebuild", "r", "--replica", "r1", "--catch-up-timeout", "soon"}, "want a duration such as 30s"},
		// Each names the argument it checks (add-replica's said
		// "--replicas", a flag it has not).
		{[]string{"range", "add-replica", "r", "r5"}, `the replica to add: "r5" is not ID=URL`},
		{[]string{"range", "replace-replica", "r", "--remove", "r1", "--add", "r5"}, `--add: "r5" is not ID=URL`},
		{[]string{"range", "create", "r", "--replicas", "r1"}, `--replicas: "r1" is not ID=URL`},
	}
	for _, tt := range tests {
		code, _, stderr := runCmd(t, tt.args...)
		if code != exitUsage || !strings.Contains(stderr, tt.want) {
			t.Errorf("tenurectl %q: status %d, stderr:\n%s\nwant status 2 and %q", tt.args, code, stderr, tt.want)
		}
	}
}

// A mistake in a command's flags or arguments prints one line and the
// command's usage line, not its whole help page.
func TestUsageErrorIsTwoLines(t *testing.T) {
	for _, args := range [][]string{
		{"consume", "r", "--bogus"},
		{"consume", "r", "--limit"},
		{"consume"},
		{"produce", "r", "--batch", "0"},
		{"journal", "dump", "--json"},
	} {
		code, _, stderr := runCmd(t, args...)
		lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
		if code != exitUsage || len(lines) != 2 || !strings.HasPrefix(lines[1], "Usage: tenurectl "+strings.Join(args[:len(strings.Fields(mustLookup(t, args).name))], " ")+" ") {
			t.Errorf("tenurectl %q: status %d, stderr:\n%s\nwant status 2, an error line and the usage line", args, code, stderr)
		}
	}
}

func mustLookup(t *testing.T, args []string) *command {
	t.Helper()
	c, _, err := lookup(args)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Help shows flags as they are typed: --from, never -from.
func TestHelpShowsFlagsAsTyped(t *testing.T) {
	for _, c := range commands {
		_, help, _ := runCmd(t, append(strings.Fields(c.name), "--help")...)
		for _, line := range strings.Split(help, "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "-") && !strings.HasPrefix(strings.TrimSpace(line), "--") {
				t.Errorf("tenurectl %s --help shows a flag with one dash: %q", c.name, line)
			}
		}
		if !strings.Contains(help, "  --") && c.name != "" {
			t.Errorf("tenurectl %s --help lists no --flags:\n%s", c.name, help)
		}
	}
}

func TestVersion(t *testing.T) {
	for _, arg := range []string{"--version", "version"} {
		code, stdout, _ := runCmd(t, arg)
		if code != exitOK || !strings.HasPrefix(stdout, "tenurectl ") || !strings.Contains(stdout, runtime.Version()) {
			t.Errorf("tenurectl %s: status %d, stdout %q; want the version and %s", arg, code, stdout, runtime.Version())
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

// A group's --help lists its commands on stdout (it was a usage error:
// '"range" needs a subcommand').
func TestGroupHelp(t *testing.T) {
	for _, group := range []string{"range", "journal", "log"} {
		code, stdout, stderr := runCmd(t, group, "--help")
		if code != exitOK || !strings.Contains(stdout, "tenurectl "+group+" SUBCOMMAND --help") || stderr != "" {
			t.Errorf("tenurectl %s --help: status %d, stdout:\n%s\nstderr:\n%s", group, code, stdout, stderr)
		}
		for _, c := range commands {
			if strings.HasPrefix(c.name, group+" ") && !strings.Contains(stdout, c.name) {
				t.Errorf("tenurectl %s --help does not list %s:\n%s", group, c.name, stdout)
			}
		}
	}
	if code, _, stderr := runCmd(t, "range"); code != exitUsage || !strings.Contains(stderr, `"range" needs a subcommand`) {
		t.Errorf("tenurectl range: status %d, stderr:\n%s", code, stderr)
	}
}
