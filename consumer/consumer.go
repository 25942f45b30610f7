package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/retry"
)

// ErrNotRecorded means the handler succeeded but its work could not be
// confirmed in the store within the retry budget. The work happened; the key
// stays claimed until its lease runs out, and a delivery after that does the
// work again.
//
// What the broker should do: acknowledge the delivery and alert
// ([ActionFor] says AckAndAlert). Redelivering it is certain to do the work
// a second time (the redelivery claims the key once the lease runs out),
// while acknowledging it risks a second time only if yet another duplicate
// arrives. Every adapter acks (or commits) it and logs it at error level.
var ErrNotRecorded = errors.New("consumer: work done but not recorded")

// Idempotent wraps h so that a message delivered more than once is handled
// once. The key func names the work a message stands for (a message id, an
// order id); it must return a non-empty key.
//
// The returned handler claims the key in store and then:
//
//   - Claimed: it runs h under idem.KeepAlive, with the lease in h's
//     context (idem.LeaseFrom). When the lease is lost, h's context is
//     cancelled with cause idem.ErrLeaseLost. If h returns nil, the work is
//     confirmed, retried with backoff within the confirm budget on a context
//     detached from ctx's cancellation (a consumer shutting down after the
//     work is done must still record it), and nil is returned, also when
//     Confirm finds another delivery's confirmation kept (the hook hears
//     AlreadyConfirmed); if no Confirm succeeds, the error matches
//     ErrNotRecorded. If h returns an error or panics, the claim is
//     forgotten, so a redelivery does the work, and the error is returned
//     or the panic re-raised.
//   - Duplicate: h does not run; nil is returned. The broker should ack.
//   - InProgress: h does not run; an error matching idem.ErrInProgress is
//     returned. The broker should redeliver later, after a delay.
//   - Claimed after a crash (the claim took the key over from a delivery
//     whose lease ran out unconfirmed): as Claimed, with the take-over in
//     h's context (idem.TakeOverFrom: the earlier attempt and its last
//     checkpoint), so that h can ask whether that attempt's effect landed
//     before doing it again; idem.Checkpoint(ctx, data) records progress.
//   - Quarantined (the key's deliveries crashed more times in a row than
//     the store's MaxTakeOvers): h does not run; Claim's error, matching
//     idem.ErrQuarantined, is returned. Dead-letter it: no redelivery runs
//     until an operator settles the key (idem resolve).
//   - A store error, an empty key: h does not run, nothing was done, the
//     error is returned (an empty key matches idem.ErrInvalidKey and is
//     refused before any store call). The broker should redeliver, except for
//     an invalid key, which no redelivery fixes: dead-letter it.
//
// [ActionFor] maps the returned error to what the broker should do (see
// the package documentation's table); settle by it rather than by hand.
//
// opts holds at most one Options (see its fields for the defaults).
// Idempotent panics, in the caller's goroutine, when store (or the value
// in it) is nil, key or h is nil, or opts is more than one or holds a
// negative field.
//
// The returned handler is safe for concurrent use if h and key are.
func Idempotent[M any](store idem.Store, key func(M) string, h func(ctx context.Context, m M) error, opts ...Options[M]) func(ctx context.Context, m M) error {
	c, fp := setup("consumer.Idempotent", store, key, h, opts)
	w := &wrapper[M]{config: c, store: store, key: key, fingerprint: fp, h: h}
	return w.one
}

// wrapper is what an Idempotent or a Batch wrapper handles messages with.
type wrapper[M any] struct {
	*config
	store       idem.Store
	batcher     idem.Batcher // Batch: the store as a Batcher; nil when it is not one
	key         func(M) string
	fingerprint func(M) []byte // nil: none
	h           func(context.Context, M) error
}

// errEmptyKey answers a message whose key func returned "".
var errEmptyKey = fmt.Errorf("%w: the message's key is empty", idem.ErrInvalidKey)

// one is Idempotent's handler: it handles m and reports it to the
// Observer, then re-raises the handler's panic, if any.
func (w *wrapper[M]) one(ctx context.Context, m M) error {
	var rep report
	var p *panicValue
	var err error
	if w.observer == nil {
		_, p, err = w.handle(ctx, m)
	} else {
		start := time.Now()
		if s, ok := w.observer.(idem.Starter); ok {
			ctx = s.Start(ctx, idem.OpMessage)
		}
		rep, p, err = w.handle(ctx, m)
		w.observe(ctx, rep, start)
	}
	if p != nil {
		panic(p.v)
	}
	return err
}

// handle claims m's key and runs, confirms or forgets as Idempotent says.
// It returns the handler's panic instead of raising it, so that the
// message's event is observed first.
func (w *wrapper[M]) handle(ctx context.Context, m M) (report, *panicValue, error) {
	k := w.key(m)
	if k == "" {
		return report{err: errEmptyKey}, nil, errEmptyKey
	}
	var f []byte
	if w.fingerprint != nil {
		f = w.fingerprint(m)
	}
	cl, err := w.store.Claim(ctx, k, f)
	if err != nil {
		w.claimFailed(ctx, k, cl, err)
		// A fingerprint mismatch comes with its claim's outcome.
		return report{key: k, outcome: cl.Outcome, err: err}, nil, err
	}
	if cl.Outcome != idem.Claimed {
		err := w.notClaimed(ctx, k, cl)
		return report{key: k, outcome: cl.Outcome, err: err}, nil, err
	}
	rep := report{key: k, outcome: idem.Claimed, takeOver: cl.TakeOver}
	work, stop := idem.KeepAlive(w.tookOver(ctx, cl), w.store, cl.Lease)
	defer stop() // also when h calls runtime.Goexit
	p, err := call(work, w.h, m)
	stop() // no Renew in flight from here on
	lost := w.lost(ctx, work, cl.Lease)
	if err != nil || p != nil {
		w.forget(ctx, w.store, cl.Lease, lost)
		// The handler's own failure, error or panic, is not the
		// idempotency layer's: the report's err stays nil.
		return rep, p, err
	}
	rep.err = w.confirm(ctx, w.store, cl.Lease, lost)
	return rep, nil, rep.err
}

// report is what the Observer is told of a message: its key, its claim's
// outcome, and the error the idempotency layer answered with (not the
// handler's own).
type report struct {
	key      string
	outcome  idem.Outcome
	takeOver bool // the claim took the key over from a lapsed attempt
	err      error
}

// observe reports one message's event.
func (c *config) observe(ctx context.Context, rep report, start time.Time) {
	e := idem.Event{Op: idem.OpMessage, Outcome: rep.outcome, TakeOver: rep.takeOver, Items: 1, Took: time.Since(start), Err: rep.err}
	if rep.key != "" {
		e.KeyHash = c.keyHasher.Hash(rep.key)
	}
	c.observer.Observe(ctx, e)
}

// notClaimed answers a claim that found a confirmation or a live holder
// (with the same fingerprint: Claim reports a mismatch as an error).
func (c *config) notClaimed(ctx context.Context, key string, cl idem.Claim) error {
	var token int64
	if cl.Record != nil {
		token = cl.Record.Token
	}
	switch cl.Outcome {
	case idem.Duplicate:
		c.emit(ctx, DuplicateSkipped, key, token, nil)
		return nil
	case idem.InProgress:
		c.emit(ctx, InProgress, key, token, nil)
		return fmt.Errorf("%w: key#%s is held by another delivery (token %d)", idem.ErrInProgress, c.keyHasher.Hash(key), token)
	}
	return fmt.Errorf("consumer: unexpected claim outcome %v", cl.Outcome)
}

// tookOver returns the context the handler of cl's message runs in: ctx,
// with the take-over when cl took the key over (idem.TakeOverFrom), which
// the hook hears of.
func (c *config) tookOver(ctx context.Context, cl idem.Claim) context.Context {
	if !cl.TakeOver {
		return ctx
	}
	c.emit(ctx, TakeOver, cl.Lease.Key, cl.Lease.Token, nil)
	return idem.ContextWithTakeOver(ctx, idem.TakeOverOf(cl))
}

// claimFailed tells the hook of a claim refused because its key is
// quarantined.
func (c *config) claimFailed(ctx context.Context, key string, cl idem.Claim, err error) {
	if !errors.Is(err, idem.ErrQuarantined) {
		return
	}
	var token int64
	if cl.Record != nil {
		token = cl.Record.Token
	}
	c.emit(ctx, Quarantined, key, token, err)
}

// panicValue carries a handler's panic to where it is re-raised, after the
// claim has been forgotten.
type panicValue struct{ v any }

func call[M any](ctx context.Context, h func(context.Context, M) error, m M) (p *panicValue, err error) {
	defer func() {
		if v := recover(); v != nil {
			p = &panicValue{v}
		}
	}()
	return nil, h(ctx, m)
}

// lost reports (and tells the hook) whether KeepAlive lost the lease while
// the handler ran.
func (c *config) lost(ctx, work context.Context, l *idem.Lease) bool {
	cause := context.Cause(work)
	if !errors.Is(cause, idem.ErrLeaseLost) {
		return false
	}
	c.emit(ctx, LeaseLost, l.Key, l.Token, cause)
	return true
}

// detached returns a context for recording the outcome: it keeps ctx's
// values but not its cancellation, so a consumer that is shutting down still
// records work that was done, and it ends after d.
func detached(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), d)
}

// forget releases a failed delivery's claim, so a redelivery can do the work
// at once instead of waiting for the lease to run out. After a lost lease
// there is nothing of ours left to release.
func (c *config) forget(ctx context.Context, s idem.Store, l *idem.Lease, lost bool) {
	if lost {
		return
	}
	fctx, cancel := detached(ctx, c.budget(l))
	defer cancel()
	if err := s.Forget(fctx, l); err != nil && !errors.Is(err, idem.ErrLeaseLost) {
		c.emit(ctx, ForgetFailed, l.Key, l.Token, err)
	}
}

// confirm records a successful delivery, retrying within the budget.
func (c *config) confirm(ctx context.Context, s idem.Store, l *idem.Lease, lost bool) error {
	cctx, cancel := detached(ctx, c.budget(l))
	defer cancel()
	err := retry.Do(cctx, func(ctx context.Context) error { return s.Confirm(ctx, l, nil) })
	return c.recorded(ctx, l, lost, err)
}

// recorded turns the last Confirm error of a successful delivery (nil once
// confirmed) into the wrapper's answer, and tells the hook what it means.
func (c *config) recorded(ctx context.Context, l *idem.Lease, lost bool, err error) error {
	switch {
	case errors.Is(err, idem.ErrAlreadyConfirmed):
		// Another delivery's confirmation was kept: the work is recorded as
		// done, so the message is done (ack), though it was done twice.
		c.emit(ctx, AlreadyConfirmed, l.Key, l.Token, err)
	case err != nil:
		c.emit(ctx, ConfirmFailed, l.Key, l.Token, err)
		return fmt.Errorf("%w: key#%s token %d: %w", ErrNotRecorded, c.keyHasher.Hash(l.Key), l.Token, err)
	case lost:
		c.emit(ctx, LateConfirm, l.Key, l.Token, nil)
	}
	return nil
}
