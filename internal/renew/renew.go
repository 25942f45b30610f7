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

// Lease is one lease kept alive.
type Lease struct {
	// TTL is what the store granted: the lease is renewed every TTL/3.
	TTL time.Duration
	// Expires is the local, conservative estimate of when the lease runs
	// out unless renewed: a renewal must not outlive it.
	Expires time.Time
	// Renew renews the lease once.
	Renew func(ctx context.Context) error
	// Lost ends the lease's work with cause; Run calls it at most once.
	Lost func(cause error)
	// Finished reports that the work is over and needs no more renewals;
	// nil means never (until Run returns).
	Finished func() bool
}

// Run renews every lease every TTL/3 until ctx is done or quit is closed.
//
// When a renewal fails with an error matching lost (idem.ErrLeaseLost), the
// lease is lost at once: Lost(err). Any other error is retried sooner,
// within what remains of the lease; once the lease has surely run out
// without a successful renewal, Lost gets lost wrapping the last error. A lost or finished lease is not
// renewed again, and Run returns when no lease is left.
func Run(ctx context.Context, quit <-chan struct{}, leases []Lease, lost error) {
	type state struct {
		deadline, next time.Time
		interval       time.Duration
		over           bool
	}
	now := time.Now()
	st := make([]state, len(leases))
	for i, l := range leases {
		iv := l.TTL / 3
		st[i] = state{deadline: l.Expires, next: now.Add(iv), interval: iv}
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		live, wake := false, time.Time{}
		for i := range st {
			if st[i].over {
				continue
			}
			if f := leases[i].Finished; f != nil && f() {
				st[i].over = true
				continue
			}
			if !live || st[i].next.Before(wake) {
				wake = st[i].next
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
		}
		for i, l := range leases {
			s := &st[i]
			if s.over || time.Now().Before(s.next) || (l.Finished != nil && l.Finished()) {
				continue
			}
			sent := time.Now()
			// A renewal must not outlive the lease it tries to save.
			rctx, cancel := context.WithDeadline(ctx, s.deadline)
			err := l.Renew(rctx)
			cancel()
			switch {
			case err == nil:
				s.deadline = sent.Add(l.TTL)
				s.next = time.Now().Add(s.interval)
			case errors.Is(err, lost):
				s.over = true
				l.Lost(err)
			case ctx.Err() != nil:
				return
			case !time.Now().Before(s.deadline):
				s.over = true
				l.Lost(fmt.Errorf("%w: no renewal succeeded before the lease ran out: %w", lost, err))
			default:
				// Retries come faster, so that a short outage does not
				// use up the lease.
				s.next = time.Now().Add(min(max(s.interval/4, time.Millisecond), time.Until(s.deadline)))
			}
		}
	}
}
