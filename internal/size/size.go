// Package size parses and formats byte sizes the way basalt's users write
// them: "512MiB", "10GiB", "1TiB", "10G" (a binary gigabyte, as qemu-img reads
// it) and plain byte counts.
//
// Invariant: Parse never returns a value <= 0 without an error, never
// overflows int64, and accepts exactly the grammar
//
//	digits [ "." digits ] [ unit ]
//
// where unit is one of B, K, KiB, M, MiB, G, GiB, T, TiB, P, PiB, E, EiB (case-insensitive;
// "KB", "MB", ... are read as binary units too, matching qemu-img). A
// fractional number must come out as a whole number of bytes.
package size

import (
	"fmt"
	"math"
	"math/big"
	"strings"
)

// Max is the largest size basalt accepts: 8 EiB - 1 would overflow the
// file-size arithmetic of most file systems, so cap at 1 EiB.
const Max int64 = 1 << 60

var units = map[string]int64{
	"":  1,
	"b": 1,
	"k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
	"m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
	"g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
	"t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40,
	"p": 1 << 50, "pb": 1 << 50, "pib": 1 << 50,
	"e": 1 << 60, "eb": 1 << 60, "eib": 1 << 60,
}

// Parse reads a positive size in bytes.
func Parse(s string) (int64, error) {
	orig := shorten(s)
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, fmt.Errorf("empty size")
	}
	if s[0] == '-' {
		return 0, fmt.Errorf("size %q is negative", orig)
	}
	i := 0
	for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.') {
		i++
	}
	num, unit := s[:i], strings.ToLower(strings.TrimSpace(s[i:]))
	mult, ok := units[unit]
	if !ok {
		return 0, fmt.Errorf("size %q has unknown unit %q (use B, KiB, MiB, GiB, TiB, PiB, EiB)", orig, shorten(s[i:]))
	}
	if num == "" || strings.Count(num, ".") > 1 || num[0] == '.' || num[len(num)-1] == '.' {
		return 0, fmt.Errorf("size %q is not a number", orig)
	}
	// Digits that cannot change the outcome go before the exact
	// arithmetic, whose cost grows with the square of the digits (a
	// request body of a MiB of them kept a CPU busy for seconds):
	// leading zeros, and a fraction's trailing zeros. Of what is left,
	// more than 60 decimals are no whole number of bytes (d/10^k times
	// at most 2^60, d not ending in 0, is whole only for k <= 60), and
	// more than 19 whole digits exceed 1 EiB.
	whole, frac, _ := strings.Cut(num, ".")
	whole, frac = strings.TrimLeft(whole, "0"), strings.TrimRight(frac, "0")
	if len(frac) > 60 {
		return 0, fmt.Errorf("size %q is not a whole number of bytes", orig)
	}
	// Exact rational arithmetic: "1.5GiB" is fine, "0.3B" is not. The
	// whole part times mult is whole: the fraction decides.
	fr, ok := new(big.Rat).SetString("0." + frac + "0")
	if !ok {
		return 0, fmt.Errorf("size %q is not a number", orig)
	}
	if !fr.Mul(fr, new(big.Rat).SetInt64(mult)).IsInt() {
		return 0, fmt.Errorf("size %q is not a whole number of bytes", orig)
	}
	if len(whole) > 19 {
		return 0, fmt.Errorf("size %q exceeds the maximum of 1 EiB", orig)
	}
	r, ok := new(big.Rat).SetString("0" + whole)
	if !ok {
		return 0, fmt.Errorf("size %q is not a number", orig)
	}
	r.Mul(r, new(big.Rat).SetInt64(mult)).Add(r, fr)
	n := r.Num()
	if n.Sign() == 0 {
		return 0, fmt.Errorf("size must be greater than zero")
	}
	if !n.IsInt64() || n.Int64() > Max {
		return 0, fmt.Errorf("size %q exceeds the maximum of 1 EiB", orig)
	}
	return n.Int64(), nil
}

// shorten is s for an error message: a size is short, and what is not
// (a request body of digits) is cut, not echoed whole.
func shorten(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return s[:max/2] + "…" + s[len(s)-max/2:]
}

// Format renders bytes in the largest binary unit not above it: exactly when
// it is a whole number of that unit ("10 GiB"), else with one decimal,
// rounded down ("1.5 GiB").
func Format(n int64) string {
	if n < 0 {
		if n == math.MinInt64 { // -n is n
			return "-8 EiB"
		}
		return "-" + Format(-n)
	}
	names := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	i := 0
	for i+1 < len(names) && n >= int64(1)<<(10*(i+1)) {
		i++
	}
	u := int64(1) << (10 * i)
	if n%u == 0 {
		return fmt.Sprintf("%d %s", n/u, names[i])
	}
	return fmt.Sprintf("%.1f %s", math.Floor(float64(n)/float64(u)*10)/10, names[i])
}

// Bytes renders n for a message a person reads and a script may parse:
// "20 GiB (21474836480 bytes)", or "512 bytes" below a KiB.
func Bytes(n int64) string {
	if n >= 0 && n < 1<<10 {
		return fmt.Sprintf("%d bytes", n)
	}
	return fmt.Sprintf("%s (%d bytes)", Format(n), n)
}
