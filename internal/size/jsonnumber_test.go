package size

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestParseJSONNumber: a JSON number of bytes is accepted in any of
// JSON's notations when it is exactly a whole number in (0, 1 EiB]:
// 1e3 and 1073741824.0 are whole numbers and were refused as "not a
// whole number of bytes". What is not whole, however close (no float
// rounding), zero or negative, or over 1 EiB, is refused with a message
// that says which.
func TestParseJSONNumber(t *testing.T) {
	long := strings.Repeat("0", 1<<20-64)
	cases := []struct {
		in   string
		want int64
		err  string
	}{
		{"1", 1, ""},
		{"1e3", 1000, ""},
		{"1E3", 1000, ""},
		{"1e+3", 1000, ""},
		{"1073741824.0", 1 << 30, ""},
		{"1073741824.000", 1 << 30, ""},
		{"1.073741824e9", 1 << 30, ""},
		{"1.5e3", 1500, ""},
		{"0.5e1", 5, ""},
		{"10e-1", 1, ""},
		{"1000e-3", 1, ""},
		{"512.0", 512, ""},
		{"1.152921504606846976e18", Max, ""},
		{"1152921504606846976.0", Max, ""},
		{"1152921504606846976e0", Max, ""},
		{"0." + long + "1e" + strconv.Itoa(len(long)+1), 1, ""}, // 0.(n zeros)1 × 10^(n+1)
		{"1.5", 0, "not a whole number"},
		{"1e-3", 0, "not a whole number"},
		{"1.0000000000000000001e3", 0, "not a whole number"}, // float64 would say 1000
		{"1.5e0", 0, "not a whole number"},
		{"-1.5", 0, "not a whole number"},
		{"1e-99999999999999999999", 0, "not a whole number"},
		{"0", 0, "greater than zero"},
		{"-0", 0, "greater than zero"},
		{"0.0e5", 0, "greater than zero"},
		{"0e99999999999999999999", 0, "greater than zero"},
		{"-1", 0, "greater than zero"},
		{"-1e3", 0, "greater than zero"},
		{"-9223372036854775809", 0, "greater than zero"},
		{"1152921504606846977", 0, "exceeds the maximum"},
		{"1.152921504606846977e18", 0, "exceeds the maximum"}, // float64 would say 1 EiB
		{"9223372036854775807", 0, "exceeds the maximum"},
		{"9223372036854775808", 0, "exceeds the maximum"},
		{"9999999999999999999", 0, "exceeds the maximum"},
		{"1e19", 0, "exceeds the maximum"},
		{"1e999999999", 0, "exceeds the maximum"},
		{"1e99999999999999999999", 0, "exceeds the maximum"},
		{"1" + long, 0, "exceeds the maximum"},
		{"1" + long + "e-" + "1048000", 0, "exceeds the maximum"},
		{"", 0, "not a number"},
		{"true", 0, "not a number"},
		{"null", 0, "not a number"},
		{"1e", 0, "not a number"},
		{"1.", 0, "not a number"},
		{".5", 0, "not a number"},
		{"0x10", 0, "not a number"},
	}
	for _, c := range cases {
		in := c.in
		start := time.Now()
		n, err := ParseJSONNumber(in)
		if d := time.Since(start); d > time.Second {
			t.Errorf("ParseJSONNumber(%s) took %v", shorten(in), d)
		}
		switch {
		case c.err == "" && (err != nil || n != c.want):
			t.Errorf("ParseJSONNumber(%s) = %d, %v; want %d", shorten(in), n, err, c.want)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("ParseJSONNumber(%s) = %d, %v; want an error saying %q", shorten(in), n, err, c.err)
		}
		if err != nil && len(err.Error()) > 200 {
			t.Errorf("ParseJSONNumber(%s): message of %d bytes echoes the literal", shorten(in), len(err.Error()))
		}
	}
}
