package version

import (
	"runtime"
	"strings"
	"testing"
)

// A release build's -ldflags value is the version shown.
func TestLdflagsOverride(t *testing.T) {
	defer func(v string) { Version = v }(Version)
	Version = "v9.9.9"
	if got := String(); !strings.HasPrefix(got, "v9.9.9") || !strings.HasSuffix(got, runtime.Version()) {
		t.Errorf("String() = %q, want v9.9.9 first and %s last", got, runtime.Version())
	}
}
