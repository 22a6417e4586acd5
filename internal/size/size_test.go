package size

import (
	"math"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	good := map[string]int64{
		"1":          1,
		"512MiB":     512 << 20,
		"10GiB":      10 << 30,
		"1TiB":       1 << 40,
		"10G":        10 << 30,
		"10g":        10 << 30,
		"10GB":       10 << 30,
		"1.5GiB":     3 << 29,
		" 4096 ":     4096,
		"64 GiB":     64 << 30,
		"1048576":    1 << 20,
		"1PiB":       1 << 50,
		"1024PiB":    Max,
		"4k":         4096,
		"0.5K":       512,
		"1073741824": 1 << 30,
	}
	for in, want := range good {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	bad := map[string]string{
		"":                        "empty",
		"0":                       "greater than zero",
		"0GiB":                    "greater than zero",
		"-1":                      "negative",
		"-10GiB":                  "negative",
		"abc":                     "unknown unit",
		"10XiB":                   "unknown unit",
		"1.2.3":                   "not a number",
		".5G":                     "not a number",
		"5.G":                     "not a number",
		"0.3":                     "whole number",
		"1025PiB":                 "maximum",
		"99999999999999999999999": "maximum",
		"GiB":                     "not a number",
	}
	for in, want := range bad {
		_, err := Parse(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) error = %v; want it to mention %q", in, err, want)
		}
	}
}

func TestFormat(t *testing.T) {
	for n, want := range map[int64]string{
		1:             "1 B",
		1024:          "1 KiB",
		10 << 30:      "10 GiB",
		3 << 29:       "1.5 GiB",
		3 << 20:       "3 MiB",
		1<<40 + 1:     "1.0 TiB",
		-1024:         "-1 KiB",
		math.MinInt64: "-8 EiB", // its negation is itself: once endless recursion
	} {
		if got := Format(n); got != want {
			t.Errorf("Format(%d) = %q, want %q", n, got, want)
		}
	}
}

// FuzzParse checks Parse's invariants on arbitrary input: no panic, a
// positive bounded result, and Format/Parse round-trips for exact units.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"1", "10GiB", "1.5G", "-1", "0", "1e9", "9223372036854775807", "1.0000000001K"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := Parse(s)
		if err != nil {
			return
		}
		if n <= 0 || n > Max {
			t.Fatalf("Parse(%q) = %d out of range", s, n)
		}
		if f := Format(n); !strings.Contains(f, ".") {
			m, err := Parse(strings.ReplaceAll(f, " ", ""))
			if err != nil || m != n {
				t.Fatalf("round trip %q -> %d -> %q -> %d, %v", s, n, f, m, err)
			}
		}
	})
}
