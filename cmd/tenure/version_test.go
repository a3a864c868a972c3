package main

import (
	"context"
	"os/exec"
	"runtime"
	"strings"
	"testing"
)

// tenure --version says which build it is (the version, else the commit,
// and the Go release) and exits 0, before any command parses flags.
func TestVersion(t *testing.T) {
	bin := buildTenure(t)
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "tenure ") || !strings.Contains(string(out), runtime.Version()) {
		t.Errorf("tenure --version: %v, output %q; want 'tenure VERSION ... %s'", err, out, runtime.Version())
	}
}

// A bad flag is one line, naming it as typed, and the usage line: not the
// flag package's whole page of every flag.
func TestBadFlagIsTwoLines(t *testing.T) {
	for name, c := range commands {
		args := []string{"--bogus"}
		if name == "certs" {
			args = []string{"init", "--bogus"}
		}
		err := c.run(context.Background(), args)
		if err == nil {
			t.Errorf("tenure %s --bogus succeeded", name)
			continue
		}
		lines := strings.Split(err.Error(), "\n")
		if len(lines) != 2 || lines[0] != "flag provided but not defined: --bogus" || !strings.HasPrefix(lines[1], "Usage: tenure ") {
			t.Errorf("tenure %s --bogus: %q, want the error and the usage line", name, err)
		}
	}
}
