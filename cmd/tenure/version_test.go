package main

import (
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
