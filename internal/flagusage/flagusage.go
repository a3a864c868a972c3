// Package flagusage prints flags the way they are typed ("--from N", not
// the flag package's "-from uint"), for tenure's and tenurectl's help.
package flagusage

import (
	"flag"
	"fmt"
	"io"
	"regexp"
	"strings"
)

// Print is flag.PrintDefaults with the flags written as they are typed.
func Print(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		arg, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if arg != "" {
			line += " " + argName(arg)
		}
		switch f.DefValue {
		case "", "0", "false", "0s":
		default:
			usage += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(w, "%s\n    \t%s\n", line, strings.ReplaceAll(usage, "\n", "\n    \t"))
	})
}

// argName turns the flag package's type names into what a user types.
func argName(arg string) string {
	switch arg {
	case "int", "uint", "int64", "uint64", "float":
		return "N"
	case "duration":
		return "DURATION"
	case "string", "value":
		return "VALUE"
	}
	return arg
}

// flagName matches the flag package's "-name" in its error messages.
var flagName = regexp.MustCompile(`(flag |for |: )-([A-Za-z])`)

// Error is a flag package parse error with the flags named as typed
// ("flag provided but not defined: --bogus").
func Error(err error) string { return flagName.ReplaceAllString(err.Error(), "$1--$2") }
