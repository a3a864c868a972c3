package main

import (
	"bufio"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

// jsonLines decodes one JSON object per line, as streams print them.
func jsonLines[T any](out string) ([]T, error) {
	var all []T
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			return nil, err
		}
		all = append(all, v)
	}
	return all, nil
}

// produce's stdin is split at --delimiter, or taken whole with --binary;
// consume prints every value on one line, Go-quoted when it would not
// read back as itself, and --json gives the bytes as they are.
func testProduceInput(t *testing.T, c *testCluster) {
	c.createRange("input", "r1")
	for _, tt := range []struct {
		stdin string
		args  []string
		want  []string // the values appended, in order
	}{
		{"a,b,,c,", []string{"--delimiter", ","}, []string{"a", "b", "", "c"}},
		{"x\x00y z\x00", []string{"--delimiter", `\0`}, []string{"x", "y z"}},
		{"p1\n---\np2\nline 2\n", []string{"--delimiter", `\n---\n`}, []string{"p1", "p2\nline 2\n"}},
		{"whole\nfile\twith\x01bytes\n", []string{"--binary"}, []string{"whole\nfile\twith\x01bytes\n"}},
		{"", []string{`"quoted"`, "tab\there", "caf\u00e9 ok"}, []string{`"quoted"`, "tab\there", "caf\u00e9 ok"}},
	} {
		code, out, stderr := c.ctl(tt.stdin, append([]string{"produce", "input", "--json"}, tt.args...)...)
		got, err := jsonLines[producedJSON](out)
		if code != exitOK || err != nil || len(got) != len(tt.want) {
			t.Errorf("produce %q with stdin %q: status %d, stdout %s, stderr %s; want %d records", tt.args, tt.stdin, code, out, stderr, len(tt.want))
			continue
		}
		for i, r := range got {
			line := c.mustCtl("", "consume", "input", "--from", strconv.FormatUint(r.Offset, 10), "--limit", "1", "--json")
			var rec recordJSON
			if err := json.Unmarshal([]byte(line), &rec); err != nil || rec.Value != tt.want[i] {
				t.Errorf("produce %q: record %d at %d is %q (%v), want %q", tt.args, i, r.Offset, rec.Value, err, tt.want[i])
			}
			// The table form: one line, OFFSET<TAB>VALUE, quoted unless it
			// reads back as itself.
			text := c.mustCtl("", "consume", "input", "--from", strconv.FormatUint(r.Offset, 10), "--limit", "1")
			value, ok := strings.CutPrefix(strings.TrimSuffix(text, "\n"), strconv.FormatUint(r.Offset, 10)+"\t")
			if !ok || strings.Contains(value, "\n") || strings.Contains(value, "\t") {
				t.Errorf("consume of %q printed %q: want one OFFSET<TAB>VALUE line", tt.want[i], text)
				continue
			}
			if want := printable([]byte(tt.want[i])); value != want {
				t.Errorf("consume of %q printed the value %q, want %q", tt.want[i], value, want)
			}
		}
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"x", "--binary"}, "give values or --binary, not both"},
		{[]string{"--binary", "--delimiter", ","}, "it has no --delimiter"},
		{[]string{"--delimiter", ""}, "want a non-empty string"},
		{[]string{"--delimiter", `\q`}, "not a valid escape"},
	} {
		code, _, stderr := c.ctl("v", append([]string{"produce", "input"}, tt.args...)...)
		if code != exitUsage || !strings.Contains(stderr, tt.want) {
			t.Errorf("produce input %q: status %d, stderr %s; want status 2 and %q", tt.args, code, stderr, tt.want)
		}
	}
}

// The quoting rule, on its own: raw when it reads back as itself.
func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"plain words": "plain words",
		"":            "",
		"caf\u00e9":   "caf\u00e9",
		"a\nb":        `"a\nb"`,
		"a\tb":        `"a\tb"`,
		"\r":          `"\r"`,
		`"x"`:         `"\"x\""`,
		"\xff":        `"\xff"`,
		"bell\a":      `"bell\a"`,
	} {
		if got := printable([]byte(in)); got != want {
			t.Errorf("printable(%q) = %s, want %s", in, got, want)
		}
	}
}
