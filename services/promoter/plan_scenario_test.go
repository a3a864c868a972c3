package promoter_test

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/services/promoter"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of testdata/*.txt scenarios with what Decide returns")

// TestDecideScenarios runs the promotion scenarios in testdata/*.txt. Each
// file holds cases like this one:
//
//	# comments and blank lines between cases are kept on -rewrite
//	decide epoch=3 preferred=r2
//	r1 fenced end=12 hwm=8 history=1@0
//	r2 fenced end=15 hwm=15 history=1@0,2@10
//	r3 unimplemented end=15 hwm=11
//	r4 refused connection refused
//	r5 silent
//	----
//	<the plan, as Decide returns it>
//
// The first line is `decide epoch=N [preferred=ID] [replicas=ID,ID,...]`.
// Each further line up to "----" is one replica's answer: `fenced` (with
// end, hwm and history, a comma-separated list of epoch@start, or "-" for
// none), `unimplemented` (an older version: end and hwm only), `refused`
// (not fenced; the rest of the line is the error) or `silent` (no answer).
// The replica set is those replicas in order unless replicas= names it.
// The expected output runs to the next blank line.
//
// Run with -rewrite to regenerate the expected outputs, then review the diff.
func TestDecideScenarios(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no scenarios in testdata/*.txt")
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txt"), func(t *testing.T) {
			runScenarioFile(t, file)
		})
	}
}

// scenarioCase is one case of a scenario file.
type scenarioCase struct {
	line   int      // of the decide command, for failure messages
	input  []string // the decide line and the answer lines
	output []string // the expected output as written in the file
}

// runScenarioFile checks, or with -rewrite regenerates, one file. Anything
// outside a case (comments, blank lines) is copied through unchanged.
func runScenarioFile(t *testing.T, file string) {
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	var out strings.Builder
	var c *scenarioCase
	inOutput := false
	cases := 0
	finish := func() {
		cases++
		got := runScenario(c.input)
		for _, l := range c.input {
			out.WriteString(l + "\n")
		}
		out.WriteString("----\n")
		for _, l := range got {
			out.WriteString(l + "\n")
		}
		if !*rewrite && strings.Join(got, "\n") != strings.Join(c.output, "\n") {
			t.Errorf("%s:%d: %s\ngot:\n%s\nwant:\n%s\n(run with -rewrite to accept)", file, c.line, c.input[0],
				strings.Join(got, "\n"), strings.Join(c.output, "\n"))
		}
		c, inOutput = nil, false
	}

	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case c != nil && inOutput && line == "":
			finish()
			out.WriteString("\n")
		case c != nil && inOutput:
			c.output = append(c.output, line)
		case c != nil && line == "----":
			inOutput = true
		case c != nil:
			c.input = append(c.input, line)
		case line == "" || strings.HasPrefix(line, "#"):
			out.WriteString(line + "\n")
		default:
			c = &scenarioCase{line: n, input: []string{line}}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if c != nil {
		if !inOutput {
			t.Fatalf("%s:%d: case has no \"----\" line", file, c.line)
		}
		finish()
	}
	if cases == 0 {
		t.Errorf("%s: no cases", file)
	}
	if *rewrite {
		if err := os.WriteFile(file, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// runScenario parses one case's input, runs Decide and renders the result.
// A malformed case renders as "bad scenario: ...", which never matches a
// reviewed expectation.
func runScenario(lines []string) []string {
	in, err := parseScenario(lines)
	if err != nil {
		return []string{"bad scenario: " + err.Error()}
	}
	plan, err := promoter.Decide(in)
	var out []string
	if err != nil {
		var pe *promoter.PlanError
		if !errors.As(err, &pe) {
			return []string{fmt.Sprintf("error (not a *PlanError): %v", err)}
		}
		// One clause per line, so a diff points at the replica it names.
		msg := strings.ReplaceAll(pe.Message, "; ", ";\n  ")
		out = append(out, strings.Split(fmt.Sprintf("error %s: %s", pe.Code, msg), "\n")...)
	} else {
		out = append(out, "candidate "+plan.Candidate, fmt.Sprintf("committed-bound %d", plan.CommittedBound))
		for _, tr := range plan.Truncations {
			out = append(out, fmt.Sprintf("truncate %s %d -> %d", tr.ReplicaID, tr.From, tr.To))
		}
		for _, id := range plan.Followers {
			out = append(out, "follower "+id)
		}
		for _, id := range plan.Unreconciled {
			out = append(out, "unreconciled "+id)
		}
		for _, id := range plan.Learners {
			out = append(out, "learner "+id)
		}
		for _, id := range plan.Excluded {
			out = append(out, "excluded "+id)
		}
		if plan.PossiblyLostFrom < plan.HighestHWMSeen {
			out = append(out, fmt.Sprintf("possibly-lost %d..%d", plan.PossiblyLostFrom, plan.HighestHWMSeen))
		}
	}
	for _, f := range plan.Fenced {
		switch {
		case f.GetFenced() && f.GetLearner():
			out = append(out, fmt.Sprintf("report %s: learner end=%d hwm=%d last-epoch=%d%s", f.GetReplicaId(), f.GetLogEnd(), f.GetHighWaterMark(), f.GetLastEpoch(), errSuffix(f.GetError())))
		case f.GetFenced() && f.GetHistoryKnown() && f.GetError() != "":
			out = append(out, fmt.Sprintf("report %s: fenced end=%d hwm=%d last-epoch=%d, %s", f.GetReplicaId(), f.GetLogEnd(), f.GetHighWaterMark(), f.GetLastEpoch(), f.GetError()))
		case !f.GetFenced():
			out = append(out, fmt.Sprintf("report %s: %s", f.GetReplicaId(), f.GetError()))
		case f.GetHistoryKnown():
			out = append(out, fmt.Sprintf("report %s: fenced end=%d hwm=%d last-epoch=%d", f.GetReplicaId(), f.GetLogEnd(), f.GetHighWaterMark(), f.GetLastEpoch()))
		default:
			out = append(out, fmt.Sprintf("report %s: fenced end=%d hwm=%d, %s", f.GetReplicaId(), f.GetLogEnd(), f.GetHighWaterMark(), f.GetError()))
		}
	}
	return out
}

func errSuffix(e string) string {
	if e == "" {
		return ""
	}
	return ", " + e
}

func parseScenario(lines []string) (promoter.Input, error) {
	var in promoter.Input
	cmd := strings.Fields(lines[0])
	if len(cmd) == 0 || cmd[0] != "decide" {
		return in, fmt.Errorf("want a decide line, got %q", lines[0])
	}
	var members []string
	for _, kv := range cmd[1:] {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "epoch":
			e, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return in, fmt.Errorf("epoch: %v", err)
			}
			in.Epoch = e
		case "preferred":
			in.Preferred = v
		case "replicas":
			members = strings.Split(v, ",")
		case "learners":
			in.Learners = strings.Split(v, ",")
		case "old-voters":
			in.OldVoters = strings.Split(v, ",")
		case "unsafe":
			in.Unsafe = true
		case "highest-hwm":
			h, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return in, fmt.Errorf("highest-hwm: %v", err)
			}
			in.HighestHWMSeen = h
		default:
			return in, fmt.Errorf("unknown decide argument %q", kv)
		}
	}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) < 2 {
			return in, fmt.Errorf("want `<replica> <fenced|unimplemented|refused|silent> ...`, got %q", l)
		}
		in.Replicas = append(in.Replicas, f[0])
		a := promoter.Answer{ReplicaID: f[0]}
		// member-inc=X anywhere on the line: the incarnation the membership
		// records for this replica.
		var rest []string
		for _, kv := range f[2:] {
			if v, ok := strings.CutPrefix(kv, "member-inc="); ok {
				if in.Incarnations == nil {
					in.Incarnations = map[string]string{}
				}
				in.Incarnations[f[0]] = v
				continue
			}
			rest = append(rest, kv)
		}
		f = append(f[:2], rest...)
		switch f[1] {
		case "silent":
			continue
		case "refused":
			a.Err = fmt.Errorf("%s", strings.Join(f[2:], " "))
		case "fenced", "unimplemented":
			a.Unimplemented = f[1] == "unimplemented"
			for _, kv := range f[2:] {
				k, v, _ := strings.Cut(kv, "=")
				var err error
				switch k {
				case "end":
					a.LogEnd, err = strconv.ParseUint(v, 10, 64)
				case "hwm":
					a.HWM, err = strconv.ParseUint(v, 10, 64)
				case "history":
					a.History, err = parseHistory(v)
				case "inc":
					a.Incarnation = v
				default:
					err = fmt.Errorf("unknown field %q", k)
				}
				if err != nil {
					return in, fmt.Errorf("%s: %v", f[0], err)
				}
			}
		default:
			return in, fmt.Errorf("%s: unknown answer kind %q", f[0], f[1])
		}
		in.Answers = append(in.Answers, a)
	}
	if members != nil {
		in.Replicas = members
	} else if in.Learners != nil || in.OldVoters != nil {
		return in, fmt.Errorf("learners= or old-voters= needs replicas= (the voters)")
	}
	return in, nil
}

// parseHistory reads "1@0,2@10" (epoch@start pairs) or "-" (empty).
func parseHistory(s string) ([]journal.EpochStart, error) {
	if s == "-" {
		return nil, nil
	}
	var h []journal.EpochStart
	for _, p := range strings.Split(s, ",") {
		e, st, ok := strings.Cut(p, "@")
		if !ok {
			return nil, fmt.Errorf("history entry %q is not epoch@start", p)
		}
		epoch, err := strconv.ParseUint(e, 10, 64)
		if err != nil {
			return nil, err
		}
		start, err := strconv.ParseUint(st, 10, 64)
		if err != nil {
			return nil, err
		}
		h = append(h, journal.EpochStart{Epoch: epoch, Start: start})
	}
	return h, nil
}
