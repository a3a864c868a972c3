// Package bytesize reads the byte counts that tenure's flags take: plain
// bytes or a number with a binary (KiB, MiB, GiB, TiB, PiB) or decimal (KB,
// MB, GB, TB, PB) unit, case-insensitive.
package bytesize

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// sizeUnits are the size suffixes, lower case, longest first so "kib" is
// not read as "b".
var sizeUnits = []struct {
	suffix string
	mult   uint64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40}, {"pib", 1 << 50},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12}, {"pb", 1e15},
	{"b", 1},
}

// Parse reads a byte count: "65536", "64KiB", "1.5GiB", "10GB", "0" or
// "unlimited" (0). Fractions are allowed only when the result is whole.
func Parse(s string) (uint64, error) {
	in := strings.TrimSpace(s)
	low := strings.ToLower(in)
	if low == "unlimited" || low == "0" {
		return 0, nil
	}
	num, mult := low, uint64(1)
	for _, u := range sizeUnits {
		if n, ok := strings.CutSuffix(low, u.suffix); ok {
			num, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	if num == "" {
		return 0, fmt.Errorf("size %q: want a number of bytes or a number with a unit (64KiB, 512MiB, 1GiB, 10GB), or 0/unlimited", s)
	}
	if n, err := strconv.ParseUint(num, 10, 64); err == nil {
		if n > math.MaxUint64/mult {
			return 0, fmt.Errorf("size %q is too large", s)
		}
		return n * mult, nil
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		if strings.HasPrefix(num, "-") {
			return 0, fmt.Errorf("size %q is negative; 0 or unlimited means no limit", s)
		}
		return 0, fmt.Errorf("size %q: want a number of bytes or a number with a unit (64KiB, 512MiB, 1GiB, 10GB), or 0/unlimited", s)
	}
	v := f * float64(mult)
	if v >= math.MaxUint64 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	if v != math.Trunc(v) {
		return 0, fmt.Errorf("size %q is not a whole number of bytes", s)
	}
	return uint64(v), nil
}

// Format prints n exactly, in the largest binary unit that divides it, else
// the largest decimal one, else bytes ("0" for 0): what Parse reads back.
func Format(n uint64) string {
	if n == 0 {
		return "0"
	}
	for _, u := range []struct {
		suffix string
		mult   uint64
	}{{"PiB", 1 << 50}, {"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
		{"PB", 1e15}, {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}} {
		if n%u.mult == 0 {
			return strconv.FormatUint(n/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatUint(n, 10)
}
