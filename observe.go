package idem

import (
	"context"
	"errors"
	"time"
)

// Op names an operation in an Event.
type Op uint8

// The operations reported to an Observer: the stores' own, and those of the
// wrappers (package middleware, package consumer) that drive them.
const (
	OpClaim Op = iota + 1
	OpRenew
	OpConfirm
	OpForget
	OpLookup
	OpClaimBatch
	OpConfirmBatch
	// OpRun is Run of the SQL store (package sqlstore): Outcome Claimed
	// when the write ran, Duplicate when a committed result was replayed.
	OpRun
	// OpRequest is one request through a wrapper that records responses:
	// an HTTP request through the middleware, a unary call through the
	// gRPC server interceptor.
	OpRequest
	// OpMessage is one message through the consumer wrapper.
	OpMessage
	// OpCheckpoint is a holder's Checkpoint (see Checkpointer).
	OpCheckpoint
	// OpResolve is an operator's Resolve of a quarantined key (see
	// Resolver).
	OpResolve
	// OpCheck is a store's check of its server, reported only for what
	// it tolerates but an operator must hear of: a Redis Cluster node
	// down, failing or serving no slot (ErrClusterDegraded).
	OpCheck
	// OpAbandon is a holder's Abandon (see Abandoner): it gave its key up
	// unfinished and said why.
	OpAbandon
)

var opNames = [...]string{"", "claim", "renew", "confirm", "forget", "lookup", "claim_batch", "confirm_batch", "run", "request", "message", "checkpoint", "resolve", "check", "abandon"}

// String returns the operation's name in snake case, for metric labels.
func (op Op) String() string {
	if int(op) < len(opNames) && op != 0 {
		return opNames[op]
	}
	return "op"
}

// Event describes one operation. It never carries the key itself, which may
// hold personal data: KeyHash stands in for it.
type Event struct {
	Op Op
	// Outcome is the Claim's outcome (for OpClaim, OpRun, and for OpRequest
	// and OpMessage the outcome of the claim they made); zero for other
	// operations and when the claim failed.
	Outcome Outcome
	// TakeOver is Claim.TakeOver: a claim replaced an expired one. A
	// Claim refused because the key is quarantined has Err wrapping
	// ErrQuarantined (ClassQuarantined).
	TakeOver bool
	// Prior is Claim.Prior on a take-over: the attempt taken over, and in
	// its Ended how it ended (empty: its lease ran out, a crash or a
	// stall).
	Prior *Attempt
	// Items is the number of keys a batch operation carried; 1 otherwise.
	Items int
	// Late is set on a Confirm that recorded after its lease was lost.
	Late bool
	// Took is the operation's duration as the caller saw it.
	Took time.Duration
	// Err is the operation's error; nil on success. ErrLeaseLost and
	// ErrNotFound are reported here too: Class tells them from failures.
	Err error
	// KeyHash is the keyed hash of the operation's key (see KeyHasher);
	// empty for batch operations.
	KeyHash string
	// Cache is set on the operations of a Cache's Claim, Lookup and
	// ClaimBatch: CacheHit on the event the Cache reports for what it
	// answered from memory (for a batch, Items is the keys it answered),
	// CacheMiss on the store's event of the call the Cache passed on.
	// Zero for operations made without a Cache.
	Cache CacheResult
}

// CacheResult says how a Cache handled an operation (Event.Cache).
type CacheResult uint8

const (
	// CacheHit: the cache answered from memory; the store was not called.
	CacheHit CacheResult = iota + 1
	// CacheMiss: the cache had no live entry for the key and passed the
	// call on to the store.
	CacheMiss
)

// String returns "hit" or "miss" ("" for the zero value), for metric
// labels.
func (r CacheResult) String() string {
	switch r {
	case CacheHit:
		return "hit"
	case CacheMiss:
		return "miss"
	}
	return ""
}

// cacheMissKey is the context key missContext sets.
type cacheMissKey struct{}

// missContext marks the context of a call the cache passes on to its
// store, whose event then says CacheMiss (see Core.Observe).
func missContext(ctx context.Context) context.Context {
	return context.WithValue(ctx, cacheMissKey{}, CacheMiss)
}

// cacheResult is what ctx says of the cache: CacheMiss for the context of
// a call a Cache passed on, else zero.
func cacheResult(ctx context.Context) CacheResult {
	r, _ := ctx.Value(cacheMissKey{}).(CacheResult)
	return r
}

// ErrorClass sorts an Event's error for metrics and alerting.
type ErrorClass uint8

// Error classes, from the contract's answers to failures.
const (
	// ClassNone: no error.
	ClassNone ErrorClass = iota
	// ClassLeaseLost: ErrLeaseLost, the lease expired or was taken over.
	ClassLeaseLost
	// ClassNotFound: ErrNotFound from Lookup.
	ClassNotFound
	// ClassInvalid: the caller's input was refused before any I/O
	// (ErrInvalidKey, ErrTooLarge, a bad lease).
	ClassInvalid
	// ClassConflict: ErrInProgress, ErrFingerprintMismatch or
	// ErrAlreadyConfirmed: the key is another request's, or another lease
	// confirmed it first.
	ClassConflict
	// ClassCanceled: the caller's context ended.
	ClassCanceled
	// ClassDamaged: ErrDamaged, a record the store cannot read.
	ClassDamaged
	// ClassStore: anything else, usually the store being unreachable.
	ClassStore
	// ClassQuarantined: ErrQuarantined, a key whose work crashed
	// repeatedly, waiting for an operator.
	ClassQuarantined
)

var classNames = [...]string{"", "lease_lost", "not_found", "invalid", "conflict", "canceled", "damaged", "store", "quarantined"}

// String returns the class's name in snake case ("" for ClassNone), for
// metric labels.
func (c ErrorClass) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return "class"
}

// Class sorts e.Err.
func (e *Event) Class() ErrorClass {
	err := e.Err
	switch {
	case err == nil:
		return ClassNone
	case errors.Is(err, ErrLeaseLost):
		return ClassLeaseLost
	case errors.Is(err, ErrQuarantined):
		return ClassQuarantined
	case errors.Is(err, ErrNotFound):
		return ClassNotFound
	case errors.Is(err, ErrInvalidKey), errors.Is(err, ErrTooLarge), errors.Is(err, ErrInvalidLease):
		return ClassInvalid
	case errors.Is(err, ErrInProgress), errors.Is(err, ErrFingerprintMismatch), errors.Is(err, ErrAlreadyConfirmed):
		return ClassConflict
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		if onlyContext(err) {
			return ClassCanceled
		}
		// A failure joined with the end of a retry budget (the consumer's
		// ErrNotRecorded) is the failure's.
		return ClassStore
	case errors.Is(err, ErrDamaged):
		return ClassDamaged
	}
	return ClassStore
}

// onlyContext reports whether every error err is built from (the leaves of
// its wrap tree) is a context's end.
func onlyContext(err error) bool {
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if !onlyContext(e) {
				return false
			}
		}
		return true
	case interface{ Unwrap() error }:
		if next := u.Unwrap(); next != nil {
			return onlyContext(next)
		}
	}
	return err == context.Canceled || err == context.DeadlineExceeded
}

// Observer receives one Event per operation, synchronously on the caller's
// goroutine after the operation ends: it must be quick and safe for
// concurrent use. A nil Observer costs nothing: no event is built and no key
// is hashed.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// Observers returns an Observer that passes each event to every non-nil one
// of obs in turn, or nil when there is none.
func Observers(obs ...Observer) Observer {
	var all multiObserver
	for _, o := range obs {
		if o != nil {
			all = append(all, o)
		}
	}
	switch len(all) {
	case 0:
		return nil
	case 1:
		return all[0]
	}
	return all
}

type multiObserver []Observer

func (m multiObserver) Observe(ctx context.Context, e Event) {
	for _, o := range m {
		o.Observe(ctx, e)
	}
}

// Starter is implemented by an Observer that wants to know when a wrapper's
// request (OpRequest) or message (OpMessage) begins, to open a span that the
// store operations made on its behalf nest under. The middleware and the
// consumer wrapper call Start, when their Observer implements it, before
// their first store call; they pass the returned context to every store call
// and to the user's handler (so that the handler's own spans nest too), and
// end with one Observe of the op on that context. Start must be quick and
// safe for concurrent use, and must return a context derived from ctx.
type Starter interface {
	Start(ctx context.Context, op Op) context.Context
}

// Start calls the Starter of every observer that has one, in turn, each on
// the context the one before returned.
func (m multiObserver) Start(ctx context.Context, op Op) context.Context {
	for _, o := range m {
		if s, ok := o.(Starter); ok {
			ctx = s.Start(ctx, op)
		}
	}
	return ctx
}
