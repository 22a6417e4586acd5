package size

import (
	"strings"
	"testing"
	"time"
)

// TestParseLongNumbers: a size of many digits — up to the API's 1 MiB
// request body of them, a string "size" — is judged in time linear in
// its length, and as its value says: leading zeros and a fraction's
// trailing zeros change nothing, too many decimals are no whole number
// of bytes, too many whole digits exceed 1 EiB. The exact arithmetic
// took the digits whole, in time growing with their square: a request
// of one such size kept a CPU busy for seconds.
func TestParseLongNumbers(t *testing.T) {
	const n = 1<<20 - 64
	zeros := strings.Repeat("0", n)
	cases := []struct {
		in   string
		want int64
		err  string
	}{
		{zeros + "1", 1, ""},
		{zeros + "512.5" + zeros + "KiB", 512<<10 + 512, ""},
		{"1." + zeros + "GiB", 1 << 30, ""},
		{"0." + zeros, 0, "greater than zero"},
		{"1" + zeros, 0, "exceeds the maximum"},
		{"1" + zeros + "EiB", 0, "exceeds the maximum"},
		{"0." + zeros + "1", 0, "not a whole number"},
		{"0." + zeros + "1EiB", 0, "not a whole number"},
		{"1" + zeros + ".5", 0, "not a whole number"},
		// Decimals that do make whole bytes, at the limit: 2^-60 EiB.
		{"0.000000000000000000867361737988403547205962240695953369140625EiB", 1, ""},
		{"1152921504606846976", Max, ""},
		{"0001152921504606846976.000B", Max, ""},
		{"1152921504606846977", 0, "exceeds the maximum"},
		{"10000000000000000000", 0, "exceeds the maximum"},
	}
	for _, c := range cases {
		start := time.Now()
		got, err := Parse(c.in)
		took := time.Since(start)
		name := c.in
		if len(name) > 40 {
			name = name[:20] + "…" + name[len(name)-20:]
		}
		switch {
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("Parse(%q) = %d, %v; want %d", name, got, err, c.want)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("Parse(%q) = %d, %v; want an error saying %q", name, got, err, c.err)
		}
		if took > 250*time.Millisecond {
			t.Errorf("Parse(%q) of %d bytes took %v", name, len(c.in), took)
		}
	}
}
