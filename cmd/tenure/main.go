// Command tenure is tenure's server binary: one static multi-call binary whose
// first argument names the service to run (replica, lease, promoter) or the
// embedded dev cluster (dev). Every flag has an environment-variable
// fallback (TENURE_<FLAG>, upper-case, '-' as '_'), so compose files and
// shells configure it the same way.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tenurelog/tenure/internal/flagusage"
	"github.com/tenurelog/tenure/internal/version"
)

// command is one subcommand of the tenure binary.
type command struct {
	summary string
	run     func(ctx context.Context, args []string) error
	// stopWithin bounds the stop after a signal (0: stopWithin).
	stopWithin time.Duration
}

// stopWithin bounds how long a server takes to stop once SIGTERM or an
// interrupt arrived: past it, the process says which step of its stop had
// not ended and exits 1. A replica whose data directory was removed under
// it retried Badger's memtable flush forever inside its store's Close
// ("error flushing memtable ... retrying") and ignored SIGTERM until
// SIGKILL. The bound is above every server's own graceful steps (the
// replica's 5s drain) and below compose's stop_grace_period (10s), so the
// log says why rather than docker killing it silently. A second signal
// kills at once.
const stopWithin = 8 * time.Second

// stopStep is the step of its stop a server is in (stopping).
var stopStep atomic.Pointer[string]

// stopping names the step of its stop a server is starting, reported if
// the stop outlives its bound.
func stopping(step string) { stopStep.Store(&step) }

// exitIfStuck waits for ctx (the signal) and then bound; a process still
// running by then reports the step it is stuck in and exits 1.
func exitIfStuck(ctx context.Context, stopSignals func(), name string, bound time.Duration) {
	<-ctx.Done()
	stopSignals() // the default action again: a second signal kills
	time.Sleep(bound)
	step := "stopping"
	if s := stopStep.Load(); s != nil {
		step = *s
	}
	fmt.Fprintf(os.Stderr, "tenure %s: not stopped %v after the signal, stuck %s; exiting\n", name, bound, step)
	os.Exit(1)
}

// commands is filled by each command's file in init, so adding a service
// touches only its own file.
var commands = map[string]command{}

// Exit statuses, as tenurectl's: a mistake in the invocation is told
// apart from a failure at run time, so a supervisor restarting a server
// that failed need not restart one that can never start.
const (
	exitFail  = 1 // a failure at run time (etcd unreachable, a port taken, a store that does not open)
	exitUsage = 2 // invoked wrongly: an unknown command or flag, a missing flag, a bad flag value
)

// usageError is a mistake in how tenure was invoked (exit status 2): a flag
// unknown, missing or with a bad value, found before anything is started.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

// usagef is a usageError with a formatted message.
func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// exitStatus is the exit status for a command's error.
func exitStatus(err error) int {
	if errors.As(err, new(usageError)) {
		return exitUsage
	}
	return exitFail
}

// usage prints the command list to w: stdout when asked for (--help),
// stderr with an invocation error.
func usage(w io.Writer) {
	fmt.Fprintf(w, "tenure: the replication plane's server binary.\n\nUsage:\n  tenure <command> [flags]\n\nCommands:\n")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(w, "\nRun 'tenure <command> --help' for a command's flags, 'tenure --version' for the\nversion. Every flag can also be set with an environment variable TENURE_<FLAG>\n(e.g. --data-dir as TENURE_DATA_DIR).\n\nExit status: 0 done (a server stopped by a signal included), 1 failed at run\ntime, 2 invoked wrongly (an unknown command or flag, a missing flag, a bad\nflag value). Help goes to stdout, errors to stderr.\n")
}

func main() {
	if len(os.Args) < 2 {
		usage(os.Stderr)
		os.Exit(exitUsage)
	}
	if os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage(os.Stdout)
		return
	}
	if os.Args[1] == "--version" || os.Args[1] == "-version" || os.Args[1] == "version" {
		fmt.Printf("tenure %s\n", version.String())
		return
	}
	cmd, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "tenure: unknown command %q\n\n", os.Args[1])
		usage(os.Stderr)
		os.Exit(exitUsage)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	bound := cmd.stopWithin
	if bound == 0 {
		bound = stopWithin
	}
	go exitIfStuck(ctx, stop, os.Args[1], bound)
	if err := cmd.run(ctx, os.Args[2:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintf(os.Stderr, "tenure %s: %v\n", os.Args[1], err)
		os.Exit(exitStatus(err))
	}
}

// parseQuietly parses args into fs. --help prints the whole usage on
// stdout, as asked for (so 'tenure replica --help | less' pages it); a bad
// flag is a usageError of one line, the flags named as typed, and the
// usage line, not the flag package's whole page.
func parseQuietly(fs *flag.FlagSet, args []string) error {
	out, usage := fs.Output(), fs.Usage
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	defer func() { fs.SetOutput(out); fs.Usage = usage }()
	err := fs.Parse(args)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(os.Stdout)
		usage()
		return err
	}
	var b strings.Builder
	fs.SetOutput(&b)
	usage()
	line, _, _ := strings.Cut(b.String(), "\n")
	return usagef("%s\n%s ('tenure %s --help' for the flags)", flagusage.Error(err), line, fs.Name())
}

// parseFlags parses args into fs after applying environment fallbacks: a
// flag not given on the command line takes TENURE_<NAME> if that is set.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := parseQuietly(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q (see --help)", fs.Arg(0))
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || err != nil {
			return
		}
		env := "TENURE_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(env); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = usagef("%s=%q: %v", env, v, e)
			}
		}
	})
	return err
}
