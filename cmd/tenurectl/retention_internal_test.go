package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

func TestParseSize(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want uint64
	}{
		{"0", 0}, {"unlimited", 0}, {"Unlimited", 0}, {"0B", 0}, {"0KiB", 0},
		{"1", 1}, {"65536", 65536}, {"512B", 512},
		{"64KiB", 64 << 10}, {"64kib", 64 << 10}, {"64 KiB", 64 << 10}, {"512MiB", 512 << 20},
		{"1GiB", 1 << 30}, {"2TiB", 2 << 40}, {"1.5GiB", 3 << 29},
		{"10KB", 10_000}, {"10MB", 10_000_000}, {"1GB", 1_000_000_000}, {"1.5KB", 1500},
	} {
		got, err := parseSize(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
	for _, in := range []string{"", "KiB", "-1", "-1KiB", "1.5", "1.0001KiB", "64QB", "sixty", "1e30GiB", "20000000PiB", "1KiB2"} {
		if got, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) = %d, want an error", in, got)
		}
	}
	// formatSize prints what parseSize reads back, exactly.
	for _, n := range []uint64{1, 999, 1000, 1024, 1500, 64 << 10, 1 << 30, 3 << 29, 10_000_000, 1<<40 + 1} {
		back, err := parseSize(formatSize(n))
		if err != nil || back != n {
			t.Errorf("parseSize(formatSize(%d) = %q) = %d, %v", n, formatSize(n), back, err)
		}
	}
	if got := formatSize(64 << 10); got != "64KiB" {
		t.Errorf("formatSize(64KiB) = %q", got)
	}
}

func TestParseAge(t *testing.T) {
	const (
		s = int64(1000)
		m = 60 * s
		h = 60 * m
		d = 24 * h
	)
	for _, tt := range []struct {
		in   string
		want int64
	}{
		{"0", 0}, {"unlimited", 0}, {"0s", 0}, {"0d", 0},
		{"7d", 7 * d}, {"12h", 12 * h}, {"90m", 90 * m}, {"30s", 30 * s}, {"500ms", 500},
		{"1d12h", d + 12*h}, {"1h30m", h + 30*m}, {"1.5h", h + 30*m}, {"2w", 14 * d}, {"1y", 365 * d},
		{"7D", 7 * d}, {"100y", wire.MaxRetentionAgeMs},
	} {
		got, err := parseAge(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("parseAge(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
	for _, in := range []string{"", "7", "d", "-1d", "7days", "1x", "101y", "0.1ms", "1h-5m", "h1"} {
		if got, err := parseAge(in); err == nil {
			t.Errorf("parseAge(%q) = %d, want an error", in, got)
		}
	}
	for _, ms := range []int64{1, 999, 1000, 90 * s, 7 * d, d + 12*h + 5*s + 7, wire.MaxRetentionAgeMs} {
		back, err := parseAge(formatAge(ms))
		if err != nil || back != ms {
			t.Errorf("parseAge(formatAge(%d) = %q) = %d, %v", ms, formatAge(ms), back, err)
		}
	}
	if got := formatAge(7 * d); got != "7d" {
		t.Errorf("formatAge(7d) = %q", got)
	}
	if got := describeRetention(wire.DefaultRetention()); got != "7d" {
		t.Errorf("describeRetention(default) = %q, want 7d", got)
	}
	if got := describeRetention(&tenurev1.RetentionPolicy{MaxBytes: 64 << 10, MaxAgeMs: 12 * h}); got != "64KiB or 12h" {
		t.Errorf("describeRetention(64KiB, 12h) = %q", got)
	}
	if got := describeRetention(&tenurev1.RetentionPolicy{}); got != "unlimited" {
		t.Errorf("describeRetention(0, 0) = %q", got)
	}
}

// The flags' mistakes are usage errors (status 2) that name the flag and
// the value, before anything is dialled; range set with no flag says what
// it needs.
func TestRetentionFlagErrors(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"range", "create", "x", "--replicas", "r1=http://127.0.0.1:1", "--retention-bytes", "lots"}, `invalid value "lots" for flag --retention-bytes`},
		{[]string{"range", "create", "x", "--replicas", "r1=http://127.0.0.1:1", "--retention-age", "-1d"}, "is negative"},
		{[]string{"range", "set", "x", "--retention-age", "7days"}, "units ms, s, m, h, d, w, y"},
		{[]string{"range", "set", "x"}, "nothing to change: give --retention-bytes, --retention-age or both"},
		{[]string{"range", "set", "--retention-age", "1d"}, "want exactly one RANGE"},
	} {
		var out, errOut bytes.Buffer
		e := &env{stdout: &out, stderr: &errOut, stdin: strings.NewReader(""), getenv: func(string) string { return "" }}
		code := run(context.Background(), e, append([]string{"--lease", "http://127.0.0.1:1"}, tt.args...))
		if code != exitUsage || !strings.Contains(errOut.String(), tt.want) {
			t.Errorf("tenurectl %s: status %d, stderr:\n%s\nwant status %d and %q", strings.Join(tt.args, " "), code, errOut.String(), exitUsage, tt.want)
		}
	}
	var out bytes.Buffer
	e := &env{stdout: &out, stderr: &out, stdin: strings.NewReader(""), getenv: func(string) string { return "" }}
	if code := run(context.Background(), e, []string{"range", "set", "--help"}); code != exitOK ||
		!strings.Contains(out.String(), "Only the flags given") || !strings.Contains(out.String(), "64KiB") || !strings.Contains(out.String(), "only ever below the") {
		t.Errorf("range set --help: status %d:\n%s", code, out.String())
	}
}
