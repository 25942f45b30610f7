// Package renew is idem's one lease-renewal loop: idem.KeepAlive runs it for
// one lease, the consumer's batches for all the leases of a batch from one
// goroutine (per-message goroutines cost more CPU than a batch's two round
// trips).
package renew

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Lease is one lease kept alive; Run keeps its state in it.
type Lease struct {
	// TTL is what the store granted: the lease is renewed every TTL/3.
	TTL time.Duration
	// Expires is the local, conservative estimate of when the lease runs
	// out unless renewed: a renewal must not outlive it.
	Expires time.Time

	deadline, next time.Time
	over           bool
}

// Deadline is when the lease runs out as far as Run knows: Expires, or the
// send time of the last renewal that succeeded plus TTL, whichever is
// later. Read it once Run has returned.
func (l *Lease) Deadline() time.Time {
	if l.deadline.After(l.Expires) {
		return l.deadline
	}
	return l.Expires
}

// Funcs act on lease i of Run's slice.
type Funcs struct {
	// Renew renews lease i once.
	Renew func(ctx context.Context, i int) error
	// Lost ends lease i's work with cause; Run calls it at most once per
	// lease.
	Lost func(i int, cause error)
	// Finished reports that lease i's work is over and needs no more
	// renewals; nil means never (until Run returns).
	Finished func(i int) bool
}

// Run renews every lease every TTL/3 until ctx is done or quit is closed.
//
// When a renewal fails with an error matching lost (idem.ErrLeaseLost), the
// lease is lost at once: Lost(i, err). Any other error is retried sooner,
// within what remains of the lease; once the lease has surely run out
// without a successful renewal, Lost gets lost wrapping the last error. A
// lost or finished lease is not renewed again, and Run returns when no
// lease is left.
func Run(ctx context.Context, quit <-chan struct{}, leases []Lease, f Funcs, lost error) {
	now := time.Now()
	for i := range leases {
		l := &leases[i]
		l.deadline, l.next, l.over = l.Expires, now.Add(l.TTL/3), l.TTL <= 0
	}
	finished := func(i int) bool { return f.Finished != nil && f.Finished(i) }
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		live, wake := false, time.Time{}
		for i := range leases {
			l := &leases[i]
			if l.over || finished(i) {
				l.over = true
				continue
			}
			if !live || l.next.Before(wake) {
				wake = l.next
			}
			live = true
		}
		if !live {
			return
		}
		timer.Reset(time.Until(wake))
		select {
		case <-ctx.Done():
			return
		case <-quit:
			return
		case <-timer.C:
			// Both may be ready at once, and select picks at random: no
			// renewal goes out after the work's end.
			if ctx.Err() != nil {
				return
			}
		}
		for i := range leases {
			l := &leases[i]
			if l.over || time.Now().Before(l.next) || finished(i) {
				continue
			}
			sent := time.Now()
			// A renewal must not outlive the lease it tries to save.
			rctx, cancel := context.WithDeadline(ctx, l.deadline)
			err := f.Renew(rctx, i)
			cancel()
			switch {
			case err == nil:
				l.deadline = sent.Add(l.TTL)
				l.next = time.Now().Add(l.TTL / 3)
			case errors.Is(err, lost):
				l.over = true
				f.Lost(i, err)
			case ctx.Err() != nil:
				return
			case !time.Now().Before(l.deadline):
				l.over = true
				f.Lost(i, fmt.Errorf("%w: no renewal succeeded before the lease ran out: %w", lost, err))
			default:
				// Retries come faster, so that a short outage does not
				// use up the lease.
				l.next = time.Now().Add(min(max(l.TTL/12, time.Millisecond), time.Until(l.deadline)))
			}
		}
	}
}
