// Command tenurectl is tenure's command-line client and operator tool.
//
//	tenurectl COMMAND [flags] [args]
//
// Run "tenurectl --help" for the commands and "tenurectl COMMAND --help" for
// a command's flags. Exit status: 0 on success, 1 when the command failed,
// 2 when it was invoked wrongly.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/tenurelog/tenure/internal/flagusage"
	"github.com/tenurelog/tenure/internal/version"
)

// A command is one tenurectl subcommand. Related commands share a first word
// ("journal dump", later "journal ..."), and each group keeps its commands in
// one file named after it.
type command struct {
	// name is the command's words, space-separated.
	name string
	// summary is one line for the command list.
	summary string
	// run executes the command with the arguments after its name. A
	// usageError means it was invoked wrongly; flag.ErrHelp that it printed
	// its help.
	run func(ctx context.Context, e *env, args []string) error
}

// commands is the command table: add new commands here.
var commands = []command{
	{name: "range create", summary: "register a range and its replica set with the lease service", run: runRangeCreate},
	{name: "range list", summary: "list ranges: epoch, leader, lease, retention and replica set", run: runRangeList},
	{name: "range show", summary: "show one range as the lease service stores it, retention policy included", run: runRangeShow},
	{name: "range set", summary: "change a range's retention policy (--retention-bytes, --retention-age); only the flags given change", run: runRangeSet},
	{name: "range add-replica", summary: "add a replica to a range: learner, catch-up, voter; prints progress", run: runRangeAddReplica},
	{name: "range remove-replica", summary: "remove a replica from a range (a leader hands over first); prints progress", run: runRangeRemoveReplica},
	{name: "range replace-replica", summary: "replace a range's replica: add the new one, then remove the old; prints progress", run: runRangeReplaceReplica},
	{name: "range set-address", summary: "change members' recorded addresses (a replica moved, or was listed at the wrong one); nothing else", run: runRangeSetAddress},
	{name: "range rebuild", summary: "rebuild a replica's quarantined (or halted) copy of a range from its peers: remove it, add it back as a learner; prints progress", run: runRangeRebuild},
	{name: "range delete", summary: "delete a range: fence every member, drop its data, remove it from the lease service", run: runRangeDelete},
	{name: "produce", summary: "append records (arguments, or stdin lines) to a range's leader and print their offsets", run: runProduce},
	{name: "consume", summary: "read a range's committed records from its leader; --follow tails new ones", run: runConsume},
	{name: "status", summary: "every range's (or one's) leader, epoch, and each replica's role, log end, HWM and lag", run: runStatus},
	{name: "epochs", summary: "every replica's epoch history side by side, with divergence points against the leader", run: runEpochs},
	{name: "promote", summary: "promote a range's leader now (planned handover) and print the promotion's report", run: runPromote},
	{name: "transitions", summary: "a range's leadership-transition records, newest first", run: runTransitions},
	{name: "trace", summary: "draw a trace (a promotion's) from Jaeger as a waterfall: spans, services, timings, key attributes", run: runTrace},
	{name: "bench", summary: "acknowledged-append benchmark against a range: throughput and latency percentiles", run: runBench},
	{name: "journal dump", summary: "print an epoch journal file, read-only: entries and any torn tail", run: runJournalDump},
	{name: "log dump", summary: "print a stopped replica's whole log of a range from its data directory: every record, HWM, fence, epochs", run: runLogDump},
}

// env is what a command may touch besides its arguments. It is passed in, not
// taken from globals, so tests run commands in-process.
type env struct {
	stdout, stderr io.Writer
	// stdin is what produce reads records from when given no values.
	stdin io.Reader
	// getenv reads the environment, for flags with environment fallbacks.
	getenv func(string) string
	// global holds the flags given before the command name.
	global globalFlags
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, &env{stdout: os.Stdout, stderr: os.Stderr, stdin: os.Stdin, getenv: os.Getenv}, os.Args[1:])
	stop()
	os.Exit(code)
}

// Exit statuses.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

// run dispatches args to a command and returns the exit status.
func run(ctx context.Context, e *env, args []string) int {
	rest, err := parseGlobal(e, args)
	if err != nil {
		fmt.Fprintf(e.stderr, "tenurectl: %v\nRun 'tenurectl --help' for usage.\n", err)
		return exitUsage
	}
	args = rest
	if len(args) == 0 {
		printUsage(e.stderr)
		return exitUsage
	}
	if isHelp(args[0]) || args[0] == "help" {
		if len(args) > 1 && args[0] == "help" {
			// "tenurectl help journal dump" is "tenurectl journal dump --help".
			return run(ctx, e, append(slices.Clone(args[1:]), "--help"))
		}
		printUsage(e.stdout)
		return exitOK
	}
	if args[0] == "--version" || args[0] == "-version" || args[0] == "version" {
		fmt.Fprintf(e.stdout, "tenurectl %s\n", version.String())
		return exitOK
	}
	cmd, rest, err := lookup(args)
	if err != nil {
		if len(args) > 1 && slices.ContainsFunc(args[1:], isHelp) && printGroup(e.stdout, args[0]) {
			// "tenurectl range --help": the group's commands.
			return exitOK
		}
		fmt.Fprintf(e.stderr, "tenurectl: %v\nRun 'tenurectl --help' for the list of commands.\n", err)
		return exitUsage
	}
	// The URLs from the environment follow the flags' rule, and say so in
	// the same words before anything is dialled.
	for _, name := range []string{"TENURECTL_LEASE", "TENURECTL_PROMOTER", "TENURECTL_JAEGER"} {
		if v := e.getenv(name); v != "" {
			if err := (urlValue{s: new(string), list: name != "TENURECTL_JAEGER"}).Set(v); err != nil {
				fmt.Fprintf(e.stderr, "tenurectl: %s: %v\n", name, err)
				return exitUsage
			}
		}
	}
	err = cmd.run(ctx, e, rest)
	var usage *usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &usage):
		// One line for the mistake and the synopsis, not the whole page.
		if usage.synopsis == "" {
			usage.synopsis = synopsisOf(ctx, e, cmd)
		}
		fmt.Fprintf(e.stderr, "tenurectl %s: %v\n%s ('tenurectl %s --help' for the flags)\n", cmd.name, err, usage.synopsis, cmd.name)
		return exitUsage
	default:
		fmt.Fprintf(e.stderr, "tenurectl %s: %v\n", cmd.name, err)
		return exitFail
	}
}

// synopsisOf is the usage line of cmd's help.
func synopsisOf(ctx context.Context, e *env, cmd *command) string {
	var b strings.Builder
	help := *e
	help.stdout, help.stderr = &b, &b
	_ = cmd.run(ctx, &help, []string{"--help"})
	line, _, _ := strings.Cut(b.String(), "\n")
	return line
}

func isHelp(arg string) bool { return arg == "-h" || arg == "-help" || arg == "--help" }

// lookup finds the command whose words begin args, preferring the longest.
func lookup(args []string) (*command, []string, error) {
	var best *command
	for i := range commands {
		words := strings.Fields(commands[i].name)
		if len(words) <= len(args) && slices.Equal(words, args[:len(words)]) &&
			(best == nil || len(words) > len(strings.Fields(best.name))) {
			best = &commands[i]
		}
	}
	if best != nil {
		return best, args[len(strings.Fields(best.name)):], nil
	}
	var group []string
	for _, c := range commands {
		if strings.HasPrefix(c.name, args[0]+" ") {
			group = append(group, "'tenurectl "+c.name+"'")
		}
	}
	if len(group) > 0 {
		return nil, nil, fmt.Errorf("%q needs a subcommand: %s", args[0], strings.Join(group, ", "))
	}
	return nil, nil, fmt.Errorf("unknown command %q", args[0])
}

// printGroup lists the commands whose first word is group, with their
// summaries, and reports whether there were any.
func printGroup(w io.Writer, group string) bool {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	n := 0
	for _, c := range commands {
		if strings.HasPrefix(c.name, group+" ") {
			if n == 0 {
				fmt.Fprintf(tw, "The %s commands ('tenurectl %s SUBCOMMAND --help' for one's flags):\n\n", group, group)
			}
			fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
			n++
		}
	}
	_ = tw.Flush()
	return n > 0
}

func printUsage(w io.Writer) {
	fmt.Fprint(w, `tenurectl is the command-line client and operator tool of tenure, the
replication plane of a replicated log.

Usage:
  tenurectl COMMAND [flags] [args]

Commands:
`)
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	_ = tw.Flush()
	fmt.Fprint(w, `
Global flags (before or after the command; environment fallback in brackets):
  --lease URL      lease service base URL [TENURECTL_LEASE] (default `+defaultLeaseURL+`);
                   several instances separated by commas are tried in turn
  --promoter URL   promoter base URL [TENURECTL_PROMOTER] (default `+defaultPromoterURL+`);
                   several promoters separated by commas are tried in turn
  --json           print JSON instead of tables (every command that reads; one
                   schema, README "JSON output"; streams: one object a line)
  --cacert FILE    CA certificate for mutual TLS [TENURECTL_CACERT]
  --cert FILE      client certificate, e.g. operator.pem [TENURECTL_CERT]
  --key FILE       its key [TENURECTL_KEY]; with all three, http:// URLs mean https://

Every URL flag (--lease, --promoter, --jaeger, the URLs of ID=URL) also takes
HOST:PORT, meaning http://HOST:PORT, or https:// with --cacert/--cert/--key.

Run 'tenurectl COMMAND --help' for a command's flags and arguments,
'tenurectl --version' for the version.
`)
}

// usageError is a mistake in how a command was invoked (exit status 2).
type usageError struct {
	msg string
	// synopsis is the command's usage line; run fills it in when empty.
	synopsis string
}

func (u *usageError) Error() string { return u.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// newFlags returns a command's FlagSet. Its usage, printed for --help, is
// the synopsis, the description, then the flags as they are typed.
func newFlags(e *env, name, synopsis, description string) *flag.FlagSet {
	fs := flag.NewFlagSet("tenurectl "+name, flag.ContinueOnError)
	// --help is asked for: it goes to stdout, as 'tenurectl --help' does,
	// so 'tenurectl produce --help | less' shows it. Mistakes go to
	// stderr (parseArgs, run).
	fs.SetOutput(e.stdout)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: tenurectl %s %s\n\n%s\n", name, strings.TrimSpace(synopsis), strings.TrimSpace(description))
		hasFlags := false
		fs.VisitAll(func(*flag.Flag) { hasFlags = true })
		if hasFlags {
			fmt.Fprint(fs.Output(), "\nFlags:\n")
			flagusage.Print(fs.Output(), fs)
		}
	}
	return fs
}

// parseArgs parses flags anywhere among the arguments ("dump PATH --json"
// as well as "dump --json PATH") and returns the positional ones. After
// "--" everything is positional. --help prints the command's whole usage;
// a bad flag is a usageError of one line with the usage line.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	out, usage := fs.Output(), fs.Usage
	// The flag package prints the error and the whole usage on its own;
	// the caller prints one line instead.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	defer func() { fs.SetOutput(out); fs.Usage = usage }()
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.SetOutput(out)
				if usage != nil {
					usage()
				} else {
					fs.PrintDefaults()
				}
				return nil, err
			}
			var b strings.Builder
			if usage != nil {
				fs.SetOutput(&b)
				usage()
			}
			synopsis, _, _ := strings.Cut(b.String(), "\n")
			return nil, &usageError{msg: flagusage.Error(err), synopsis: synopsis}
		}
		rest := fs.Args()
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(positional, rest...), nil
		}
		if len(rest) == 0 {
			return positional, nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}
