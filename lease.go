package idem

import (
	"context"
	"errors"
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
	held       held           // what the work's context carries
}

func hold(fn string, ctx context.Context, s Store, l *Lease) (context.Context, *holding) {
	if nilcheck.Nil(s) {
		panic("idem: " + fn + " with a nil Store")
	}
	if l == nil {
		panic("idem: " + fn + " with a nil *Lease")
	}
	h := &holding{ls: [1]renew.Lease{{TTL: l.TTL, Expires: l.Expires}}, held: held{lease: l, store: s}}
	// The lease and its store in one value, kept in h: no allocation
	// beyond ContextWithLease's.
	work, cancel := context.WithCancelCause(context.WithValue(ctx, ctxLeaseKey{}, &h.held))
	h.cancel = cancel
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

// held is a lease with the store that granted it, as KeepAlive's context
// carries them: Checkpoint needs both.
type held struct {
	lease *Lease
	store Store
}

// ContextWithLease returns a copy of ctx carrying l, for LeaseFrom. KeepAlive
// and the wrappers put the lease there themselves.
func ContextWithLease(ctx context.Context, l *Lease) context.Context {
	return context.WithValue(ctx, ctxLeaseKey{}, l)
}

type ctxStoreKey struct{}

// ContextWithStore returns a copy of ctx carrying s, the store that
// granted the lease of the work ctx will carry (ContextWithLease): for
// Checkpoint, which records progress in it. KeepAlive and Hold put the
// store beside the lease themselves; this is for work kept alive another
// way (a batch's one renewing goroutine, where one context value serves
// every message).
func ContextWithStore(ctx context.Context, s Store) context.Context {
	return context.WithValue(ctx, ctxStoreKey{}, s)
}

// LeaseFrom returns the lease that KeepAlive's context, and so the context
// of a handler run by the middleware or the consumer wrapper, carries: its
// Token is the fencing token to pass to a downstream write.
func LeaseFrom(ctx context.Context) (*Lease, bool) {
	switch v := ctx.Value(ctxLeaseKey{}).(type) {
	case *Lease:
		return v, v != nil
	case *held:
		return v.lease, v.lease != nil
	}
	return nil, false
}

// TakeOver is what the holder of a key is told when its claim took the key
// over from an earlier attempt whose lease ran out unconfirmed (see
// Claim.TakeOver): that attempt crashed or stalled, and may have done part
// of the work, or all of it. Ask the downstream system whether its effect
// landed before doing it again, and resume after Checkpoint.
type TakeOver struct {
	// Prior is the attempt taken over: its owner (the Worker of the store
	// that held it), fencing token, and when it was claimed.
	Prior Attempt
	// TakeOvers counts the key's take-overs in a row, this one included
	// (1 on the first). At the store's MaxTakeOvers the next lapse
	// quarantines the key.
	TakeOvers int
	// Checkpoint is the last progress an earlier holder recorded (see
	// Checkpointer), carried across take-overs; nil when none was.
	Checkpoint []byte
}

// TakeOverOf returns the take-over c reports, or nil when c did not take
// its key over (a fresh key, a Duplicate, an InProgress, a claim after a
// Forget).
func TakeOverOf(c Claim) *TakeOver {
	if !c.TakeOver {
		return nil
	}
	t := &TakeOver{TakeOvers: c.TakeOvers, Checkpoint: c.Checkpoint}
	if c.Prior != nil {
		t.Prior = *c.Prior
	}
	return t
}

type ctxTakeOverKey struct{}

// ContextWithTakeOver returns a copy of ctx carrying t, for TakeOverFrom;
// ctx itself when t is nil. Do, the consumer wrappers, the middleware and
// the gRPC interceptor put the take-over of the claim they hold in the
// context of the work they run.
func ContextWithTakeOver(ctx context.Context, t *TakeOver) context.Context {
	if t == nil {
		return ctx
	}
	return context.WithValue(ctx, ctxTakeOverKey{}, t)
}

// TakeOverFrom returns the take-over that ctx carries: set when the claim
// the work runs under took the key over from an attempt whose lease ran
// out unconfirmed. false when the claim was a fresh one.
func TakeOverFrom(ctx context.Context) (*TakeOver, bool) {
	t, ok := ctx.Value(ctxTakeOverKey{}).(*TakeOver)
	return t, ok && t != nil
}

// Checkpoint records data as the progress of the work ctx runs: in the
// store that granted the lease ctx carries (KeepAlive's and Hold's
// context, so the context of Do's fn and of a handler run by the consumer
// wrappers, the middleware or the gRPC interceptor). It is
// Checkpointer.Checkpoint on that store, with its contract: written only
// while the lease is the key's live lease (else ErrLeaseLost), at most
// MaxCheckpointBytes, handed to the next holder after a take-over in
// TakeOver.Checkpoint.
//
// A context without a lease and its store (ContextWithLease alone), or a
// store that does not implement Checkpointer, is an error before any I/O
// (the latter matching errors.ErrUnsupported).
func Checkpoint(ctx context.Context, data []byte) error {
	var l *Lease
	var s Store
	switch v := ctx.Value(ctxLeaseKey{}).(type) {
	case *held:
		l, s = v.lease, v.store
	case *Lease:
		l = v
		s, _ = ctx.Value(ctxStoreKey{}).(Store)
	}
	if l == nil || s == nil {
		return errors.New("idem: Checkpoint: the context carries no lease with its store; run the work under KeepAlive, Hold, Do or a wrapper of this module")
	}
	cp, ok := s.(Checkpointer)
	if !ok {
		return fmt.Errorf("idem: Checkpoint: the store %T does not implement idem.Checkpointer: %w", s, errors.ErrUnsupported)
	}
	return cp.Checkpoint(ctx, l, data)
}
