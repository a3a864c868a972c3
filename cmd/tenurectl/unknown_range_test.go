package main

import (
	"strings"
	"testing"
)

// Every command about a range fails (exit 1) when the range does not
// exist, and says so in tenurectl's words: the commands to run, not the
// RPCs behind them.
func testUnknownRange(t *testing.T, c *testCluster) {
	r1 := "r1=http://" + c.byID["r1"].listen
	for _, args := range [][]string{
		{"status", "nope"},
		{"epochs", "nope"},
		{"transitions", "nope"},
		{"transitions", "nope", "--json"},
		{"promote", "nope"},
		{"produce", "nope", "x"},
		{"consume", "nope"},
		{"consume", "nope", "--follow"},
		{"bench", "nope", "--records", "1"},
		{"range", "add-replica", "nope", r1},
		{"range", "remove-replica", "nope", "r1"},
		{"range", "replace-replica", "nope", "--remove", "r1", "--add", "r4=http://" + c.byID["r1"].listen},
	} {
		code, stdout, stderr := c.ctl("", args...)
		cmd := strings.Join(args, " ")
		if code != exitFail {
			t.Errorf("tenurectl %s: status %d, want %d\nstdout:\n%s\nstderr:\n%s", cmd, code, exitFail, stdout, stderr)
			continue
		}
		if !strings.Contains(stderr, `range "nope" does not exist`) {
			t.Errorf("tenurectl %s: stderr does not say the range does not exist:\n%s", cmd, stderr)
		}
		if rpc := rpcName(stderr); rpc != "" {
			t.Errorf("tenurectl %s: stderr names the RPC %s, not a command:\n%s", cmd, rpc, stderr)
		}
	}
}

// rpcName returns the first RPC name in s, if any.
func rpcName(s string) string {
	for _, rpc := range []string{"CreateRange", "GetRange", "ListRanges", "DeleteRange", "ChangeReplicas", "ListTransitions",
		"Promote(", "GetStatus", "Append(", "AppendStream", "Tail(", "Fence"} {
		if strings.Contains(s, rpc) {
			return rpc
		}
	}
	return ""
}
