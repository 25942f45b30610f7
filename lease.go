package idem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Lease is a claim held by this caller: proof that it, and no one else, is
// doing the work of Key until the lease runs out.
//
// A Lease is a value: stores read it and never modify it, so it may be shared
// by goroutines (the handler reading Token while KeepAlive renews).
type Lease struct {
	Key string
	// Token is the fencing token: strictly greater than the token of every
	// earlier lease on Key for as long as the store remembers the key, so a
	// downstream write guarded by "WHERE fence < token" refuses a worker that
	// stalled past its lease. See the package documentation for where the
	// guarantee ends.
	Token int64
	// Owner is the Worker of the store that claimed it.
	Owner string
	// TTL is what the store granted; KeepAlive renews at TTL/3.
	TTL time.Duration
	// Expires is a local, conservative estimate of when the lease runs out
	// unless renewed: the time the claim was sent plus TTL. The store's
	// clock, not this one, decides. Renew does not update it.
	Expires time.Time
	// Fingerprint is as given to Claim, so that a late Confirm records it.
	Fingerprint []byte
}

// KeepAlive renews l every l.TTL/3 until the returned stop function is
// called or ctx is done, and returns a context derived from ctx for the work.
//
// When a renewal finds the lease gone, the returned context is cancelled with
// cause ErrLeaseLost (context.Cause): the work should stop, because another
// worker may now hold the key. A transient store error is retried within
// what remains of the lease; only when the lease has surely run out without a
// successful renewal is the context cancelled, again with ErrLeaseLost
// (wrapping the last error).
//
// stop cancels the returned context and waits for the renewing goroutine to
// exit, so no Renew is in flight once stop returns: call it before Confirm or
// Forget. stop may be called more than once.
func KeepAlive(ctx context.Context, s Store, l *Lease) (context.Context, func()) {
	work, cancel := context.WithCancelCause(ctx)
	if l == nil || l.TTL <= 0 {
		cancel(fmt.Errorf("%w: KeepAlive needs a lease with a TTL", ErrLeaseLost))
		return work, func() {}
	}
	done := make(chan struct{})
	quit := make(chan struct{})
	go func() {
		defer close(done)
		keepAlive(work, quit, s, l, cancel)
	}()
	var once sync.Once
	return work, func() {
		once.Do(func() {
			cancel(context.Canceled) // also cuts short a renewal in flight
			close(quit)
			<-done
		})
	}
}

func keepAlive(ctx context.Context, quit <-chan struct{}, s Store, l *Lease, cancel context.CancelCauseFunc) {
	interval := l.TTL / 3
	// Retries of a failed renewal come faster, so that a short outage does
	// not use up the lease.
	retry := max(interval/4, time.Millisecond)
	deadline := l.Expires
	timer := time.NewTimer(interval)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-quit:
			return
		case <-timer.C:
		}
		sent := time.Now()
		// A renewal must not outlive the lease it tries to save.
		rctx, rcancel := context.WithDeadline(ctx, deadline)
		err := s.Renew(rctx, l)
		rcancel()
		switch {
		case err == nil:
			deadline = sent.Add(l.TTL)
			timer.Reset(interval)
		case errors.Is(err, ErrLeaseLost):
			cancel(err)
			return
		case ctx.Err() != nil:
			return
		case !time.Now().Before(deadline):
			cancel(fmt.Errorf("%w: no renewal succeeded before the lease ran out: %w", ErrLeaseLost, err))
			return
		default:
			timer.Reset(min(retry, time.Until(deadline)))
		}
	}
}
