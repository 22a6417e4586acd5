package api

import (
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/errs"
)

// TestSizeNumberOutOfRangeMessage: a JSON number of bytes beyond int64
// is refused with a message that says what is wrong with it. It said
// "is not a whole number of bytes" of 99999999999999999999, which is one,
// sending the caller looking for a fraction where the size is too large
// (or, negative, not greater than zero).
func TestSizeNumberOutOfRangeMessage(t *testing.T) {
	for in, want := range map[string]string{
		`99999999999999999999`:  "exceeds the maximum of 1 EiB",
		`9223372036854775808`:   "exceeds the maximum of 1 EiB",
		`-9223372036854775809`:  "greater than zero",
		`-99999999999999999999`: "greater than zero",
	} {
		var s Size
		err := s.UnmarshalJSON([]byte(in))
		e, ok := errs.As(err)
		if !ok || e.Code != errs.CodeInvalidSize || !strings.Contains(e.Message, want) {
			t.Errorf("UnmarshalJSON(%s): %v; want InvalidSize saying %q", in, err, want)
		}
	}
}
