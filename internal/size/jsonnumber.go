package size

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseJSONNumber reads a size written as a JSON number of bytes, in any
// of JSON's notations: 1073741824, 1073741824.0, 1e3, 1.5e3, 0.5e1.
// JSON does not tell an integer from a float; a client that builds its
// body from a float (JavaScript, Python's json of a float, jq) writes
// 1e3 or 1073741824.0 for a whole number of bytes, and refusing those
// as "not a whole number" was wrong.
//
// The literal is judged exactly, never through float64 (whose 53-bit
// mantissa would round 1152921504606846977, over the maximum, down to
// 1 EiB, and make 1.0000000000000000001e3 whole): the value is
// digits × 10^k, decided by counting digits and zeros, in time linear
// in the literal's length whatever its exponent (1e999999999 must not
// make anyone compute 10^999999999).
//
// A value that is no whole number fails with "not a whole number of
// bytes"; zero or negative with "greater than zero"; above Max with
// "exceeds the maximum of 1 EiB".
func ParseJSONNumber(lit string) (int64, error) {
	orig := shorten(lit)
	s := strings.TrimSpace(lit)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	// JSON's grammar: int [ "." digits ] [ ("e"|"E") [ "+"|"-" ] digits ].
	mant, exp, hasExp := strings.Cut(s, "e")
	if !hasExp {
		mant, exp, hasExp = strings.Cut(s, "E")
	}
	whole, frac, hasFrac := strings.Cut(mant, ".")
	if !allDigits(whole) || hasFrac && !allDigits(frac) {
		return 0, fmt.Errorf("size %s is not a number", orig)
	}
	e := int64(0)
	if hasExp {
		sign := int64(1)
		switch {
		case strings.HasPrefix(exp, "+"):
			exp = exp[1:]
		case strings.HasPrefix(exp, "-"):
			exp, sign = exp[1:], -1
		}
		if !allDigits(exp) {
			return 0, fmt.Errorf("size %s is not a number", orig)
		}
		// Beyond ±2^40 only the exponent's sign matters: the literal
		// has at most a request body (1 MiB) of digits, far fewer.
		exp = strings.TrimLeft(exp, "0")
		if len(exp) > 13 {
			e = sign << 40
		} else if n, err := strconv.ParseInt("0"+exp, 10, 64); err != nil || n > 1<<40 {
			e = sign << 40
		} else {
			e = sign * n
		}
	}
	// The value is digits × 10^k, with digits = whole and fraction run
	// together, k = e - len(frac).
	digits := strings.TrimLeft(whole+frac, "0")
	k := e - int64(len(frac))
	if digits == "" {
		return 0, fmt.Errorf("size must be greater than zero")
	}
	// Trailing zeros move into k: digits then ends in 1-9, so
	// digits × 10^k for k < 0 is no whole number.
	t := strings.TrimRight(digits, "0")
	k += int64(len(digits) - len(t))
	digits = t
	if k < 0 {
		return 0, fmt.Errorf("size %s is not a whole number of bytes", orig)
	}
	if neg {
		return 0, fmt.Errorf("size must be greater than zero")
	}
	// Max, 2^60, has 19 digits: a longer value exceeds it; a value of
	// 19 digits fits int64 (whose maximum has 19 digits too) unless it
	// is above 9223372036854775807, which ParseInt reports.
	if int64(len(digits))+k > 19 {
		return 0, fmt.Errorf("size %s exceeds the maximum of 1 EiB", orig)
	}
	n, err := strconv.ParseInt(digits+strings.Repeat("0", int(k)), 10, 64)
	if err != nil || n > Max {
		return 0, fmt.Errorf("size %s exceeds the maximum of 1 EiB", orig)
	}
	return n, nil
}

// allDigits reports whether s is one or more ASCII digits.
func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
