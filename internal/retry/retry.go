// Package retry is the one retry loop of idem's wrappers (the HTTP
// middleware and the message consumer): recording work that was done must
// survive a short store outage, and must stop at once on an error that no
// retry can fix.
package retry

import (
	"context"
	"errors"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/backoff"
)

// Permanent reports errors that no retry fixes: bad input, a damaged record,
// a lease that is gone, a key that is another request's or already
// confirmed by another lease.
func Permanent(err error) bool {
	for _, p := range permanent {
		if errors.Is(err, p) {
			return true
		}
	}
	return false
}

var permanent = []error{idem.ErrInvalidKey, idem.ErrTooLarge, idem.ErrInvalidLease, idem.ErrDamaged,
	idem.ErrLeaseLost, idem.ErrFingerprintMismatch, idem.ErrAlreadyConfirmed}

// Do calls f until it succeeds, fails with a Permanent error, or ctx ends,
// sleeping a doubling backoff (from 5ms up to 250ms, jittered so that many
// workers retrying after one outage do not move in step) between calls. It
// returns f's last error, joined with ctx's when ctx ended first.
func Do(ctx context.Context, f func(context.Context) error) error {
	return backoff.Retry(ctx, f, Permanent)
}

// Doubling is the n-th redelivery delay of a broker adapter (n = 0, 1,
// ...): first doubled n times, capped at most (and at most when doubling
// overflows).
func Doubling(first, most time.Duration, n int) time.Duration {
	d := first << min(n, 30)
	if d <= 0 || d > most {
		return most
	}
	return d
}
