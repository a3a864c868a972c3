// Package version says which build of tenure a binary is, for --version.
package version

import (
	"runtime/debug"
	"strings"
)

// Version overrides what the build info says, for release builds:
//
//	go build -ldflags "-X github.com/tenurelog/tenure/internal/version.Version=v1.2.3"
var Version string

// String is the version: the -ldflags override, else the module version and
// the VCS revision the go command stamped into the binary, else "devel".
func String() string {
	bi, ok := debug.ReadBuildInfo()
	v := Version
	if v == "" && ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v = bi.Main.Version
	}
	var rev, modified string
	if ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					modified = "+dirty"
				}
			}
		}
	}
	if v == "" {
		v = "devel"
	}
	parts := []string{v}
	if rev != "" && !strings.Contains(v, rev[:min(12, len(rev))]) {
		parts = append(parts, rev[:min(12, len(rev))]+modified)
	}
	if ok {
		parts = append(parts, bi.GoVersion)
	}
	return strings.Join(parts, " ")
}
