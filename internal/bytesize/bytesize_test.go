package bytesize

import "testing"

func TestParseAndFormat(t *testing.T) {
	for _, c := range []struct {
		in   string
		want uint64
		out  string
	}{
		{"0", 0, "0"},
		{"65536", 65536, "64KiB"},
		{"256MiB", 256 << 20, "256MiB"},
		{"256mib", 256 << 20, "256MiB"},
		{"1.5GiB", 3 << 29, "1536MiB"},
		{"10GB", 10e9, "9765625KiB"},
		{"1000", 1000, "1KB"},
		{"1001", 1001, "1001"},
	} {
		got, err := Parse(c.in)
		if err != nil || got != c.want {
			t.Errorf("Parse(%q) = %d, %v, want %d", c.in, got, err, c.want)
		}
		if f := Format(got); f != c.out {
			t.Errorf("Format(%d) = %q, want %q", got, f, c.out)
		}
		if back, err := Parse(Format(got)); err != nil || back != got {
			t.Errorf("Parse(Format(%d)) = %d, %v", got, back, err)
		}
	}
	for _, bad := range []string{"", "-1", "x", "1.5", "MiB"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) = nil error, want one", bad)
		}
	}
}
