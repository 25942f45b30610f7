package idem

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/idemgo/idem/internal/nilcheck"
	"github.com/idemgo/idem/internal/renew"
)

// Lease is a claim held by this caller: proof that it, and no one else, is
// doing the work of Key until the lease runs out.
//
// A Lease is a value: stores read its fields and never modify them, so it
// may be shared by goroutines (the handler reading Token while KeepAlive
// renews). It belongs to the store that granted it: another store (another
// kind, Prefix or table) refuses it with ErrInvalidLease, as it refuses a
// Lease built by hand, or a copy whose Key, Token or Owner was changed (a
// copy left whole is the same lease). Forget marks it (and its copies) forgotten, so that
// a later Confirm or Renew of it is ErrLeaseLost without touching the
// store.
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

	// grant ties the lease to the store that granted it, and records its
	// Forget; copies of the lease share it. A Lease not made by a Claim has
	// none, and every store refuses it.
	grant *grant
}

// KeepAlive renews l every l.TTL/3 until the returned stop function is
// called or ctx is done, and returns a context derived from ctx for the work,
// carrying l (LeaseFrom).
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
//
// KeepAlive panics, in the caller's goroutine, when s is nil (or a typed
// nil) or l is nil: the renewals would otherwise fail later, in a goroutine
// of their own.
func KeepAlive(ctx context.Context, s Store, l *Lease) (context.Context, func()) {
	work, h := hold("KeepAlive", ctx, s, l)
	return work, h.halt
}

// Hold is KeepAlive for work whose result is recorded next: its stop
// function, once the renewals have stopped, also returns when l runs out
// now, a conservative estimate (l.Expires, or the send time of the last
// renewal that succeeded plus l.TTL, whichever is later) that bounds the
// Confirm or Forget that follows. Every call of stop returns the same
// time.
func Hold(ctx context.Context, s Store, l *Lease) (context.Context, func() time.Time) {
	work, h := hold("Hold", ctx, s, l)
	return work, h.stop
}

// holding is one lease kept alive by KeepAlive or Hold.
type holding struct {
	once       sync.Once
	cancel     context.CancelCauseFunc
	quit, done chan struct{}
	ls         [1]renew.Lease // settled once done is closed
}

func hold(fn string, ctx context.Context, s Store, l *Lease) (context.Context, *holding) {
	if nilcheck.Nil(s) {
		panic("idem: " + fn + " with a nil Store")
	}
	if l == nil {
		panic("idem: " + fn + " with a nil *Lease")
	}
	work, cancel := context.WithCancelCause(ContextWithLease(ctx, l))
	h := &holding{cancel: cancel, ls: [1]renew.Lease{{TTL: l.TTL, Expires: l.Expires}}}
	if l.TTL <= 0 {
		cancel(fmt.Errorf("%w: %s needs a lease with a TTL", ErrLeaseLost, fn))
		h.once.Do(func() {}) // nothing to stop
		return work, h
	}
	h.quit, h.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(h.done)
		renew.Run(work, h.quit, h.ls[:], renew.Funcs{
			Renew: func(ctx context.Context, _ int) error { return s.Renew(ctx, l) },
			Lost:  func(_ int, cause error) { cancel(cause) },
		}, ErrLeaseLost)
	}()
	return work, h
}

// stop ends the renewals, waits for the renewing goroutine to exit, and
// returns when the lease runs out now.
func (h *holding) stop() time.Time {
	h.halt()
	return h.ls[0].Deadline() // settled: the renewing goroutine is gone
}

// halt is stop without its answer: KeepAlive's stop.
func (h *holding) halt() {
	h.once.Do(func() {
		h.cancel(context.Canceled) // also cuts short a renewal in flight
		close(h.quit)
		<-h.done
	})
}

type ctxLeaseKey struct{}

// ContextWithLease returns a copy of ctx carrying l, for LeaseFrom. KeepAlive
// and the wrappers put the lease there themselves.
func ContextWithLease(ctx context.Context, l *Lease) context.Context {
	return context.WithValue(ctx, ctxLeaseKey{}, l)
}

// LeaseFrom returns the lease that KeepAlive's context, and so the context
// of a handler run by the middleware or the consumer wrapper, carries: its
// Token is the fencing token to pass to a downstream write.
func LeaseFrom(ctx context.Context) (*Lease, bool) {
	l, ok := ctx.Value(ctxLeaseKey{}).(*Lease)
	return l, ok
}
