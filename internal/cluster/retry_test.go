package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
)

// retryUnavailable runs a step again only while the metadata is
// unavailable, within its bound.
func TestRetryUnavailable(t *testing.T) {
	unavailable := errs.New(errs.KindUnavailable, errs.CodeMetadataUnavailable, "no quorum")
	other := errors.New("other")
	for _, c := range []struct {
		name    string
		answers []error
		within  time.Duration
		calls   int
		want    error
	}{
		{"at once", []error{nil}, time.Minute, 1, nil},
		{"after an election", []error{unavailable, unavailable, nil}, time.Minute, 3, nil},
		{"another error", []error{other, nil}, time.Minute, 1, other},
		{"out of time", []error{unavailable, unavailable, unavailable}, 0, 1, unavailable},
	} {
		t.Run(c.name, func(t *testing.T) {
			calls := 0
			err := retryUnavailable(context.Background(), c.within, func() error {
				calls++
				return c.answers[calls-1]
			})
			if calls != c.calls || !errors.Is(err, c.want) {
				t.Fatalf("%d calls, %v; want %d, %v", calls, err, c.calls, c.want)
			}
		})
	}
}
