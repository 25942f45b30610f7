package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/badopt"
	"github.com/idemgo/idem/internal/nilcheck"
)

// Kind names a notable outcome reported to a Hook.
type Kind uint8

// The outcomes a Hook is told about. Plain successes are not reported: the
// store's Observer already counts every operation.
const (
	// DuplicateSkipped: the key was confirmed done; the handler did not run.
	DuplicateSkipped Kind = iota + 1
	// InProgress: another delivery holds the key; the wrapper returned
	// idem.ErrInProgress without running the handler.
	InProgress
	// LeaseLost: the lease was lost while the handler ran; its context was
	// cancelled with cause idem.ErrLeaseLost. Event.Err is that cause.
	LeaseLost
	// LateConfirm: the handler succeeded after its lease was lost, and the
	// work was confirmed anyway (it happened). Another worker may have done
	// it too.
	LateConfirm
	// ConfirmFailed: the handler succeeded but no Confirm did within the
	// retry budget; the wrapper returned ErrNotRecorded. Event.Err is the
	// last Confirm error.
	ConfirmFailed
	// ForgetFailed: the handler failed and its claim could not be released,
	// so the key stays claimed until the lease runs out. Event.Err is the
	// Forget error.
	ForgetFailed
	// AlreadyConfirmed: the handler succeeded, but another delivery's
	// confirmation of the key was kept first: the work was done twice (this
	// lease was lost or ran out, and another took the key over). The
	// wrapper returns nil, as the message is done. Event.Err is Confirm's
	// error, matching idem.ErrAlreadyConfirmed.
	AlreadyConfirmed
	// TakeOver: the claim took the key over from an earlier delivery whose
	// lease ran out unconfirmed (it crashed or stalled, maybe after its
	// effect); the handler runs with the take-over in its context
	// (idem.TakeOverFrom). Token is the new lease's.
	TakeOver
	// Quarantined: the key's deliveries crashed more times in a row than
	// the store's MaxTakeOvers; the handler did not run, and the wrapper
	// returned Claim's error, matching idem.ErrQuarantined (dead-letter
	// it). Token is the last attempt's; Event.Err is Claim's error.
	Quarantined
)

var kindNames = [...]string{"", "duplicate_skipped", "in_progress", "lease_lost", "late_confirm", "confirm_failed", "forget_failed", "already_confirmed", "take_over", "quarantined"}

// String returns the kind's name in snake case ("duplicate_skipped",
// "lease_lost"), as idem.Op.String and idem.ErrorClass.String name theirs,
// for logs and metric labels.
func (k Kind) String() string {
	if k != 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Event describes one notable outcome. It carries a hash of the key, never
// the key itself: keys may hold personal data.
type Event struct {
	Kind Kind
	// KeyHash is the keyed hash of the message's key (Options.KeyHasher).
	KeyHash string
	// Token is the fencing token of this delivery's lease (LeaseLost,
	// LateConfirm, ConfirmFailed, ForgetFailed, AlreadyConfirmed,
	// TakeOver), or of the record found (DuplicateSkipped: the
	// confirmation; InProgress: the holder; Quarantined: its last
	// attempt).
	Token int64
	// Err is the error behind the event, where there is one.
	Err error
}

// Hook is called synchronously, on the goroutine that handles the message,
// once per notable outcome. It must be quick and safe for concurrent use.
type Hook func(ctx context.Context, e Event)

// Options configure Idempotent and Batch: one flat literal, passed by value
// (consumer.Options[Order]{Hook: h, Observer: obs}). The zero value is
// valid; a zero field means its default.
type Options[M any] struct {
	// Fingerprint returns a fingerprint of a message's content (a hash, at
	// most idem.MaxFingerprintBytes), stored with its claim. A delivery
	// whose key was claimed or confirmed with another non-empty fingerprint
	// is not handled: the wrapper returns Claim's error matching
	// idem.ErrFingerprintMismatch, which no redelivery fixes. Default: none.
	Fingerprint func(M) []byte
	// Hook is told of each notable outcome (see Kind), synchronously.
	// Default: none.
	Hook Hook
	// Observer receives one idem.Event with Op idem.OpMessage per message
	// (Batch: per message of the batch) once it is settled; its Err is the
	// idempotency layer's answer, not the handler's (see Observing in the
	// package documentation). Default: none.
	Observer idem.Observer
	// KeyHasher hashes keys for the Hook, the Observer and error messages.
	// Give it the store's (idem.Options.KeyHasher) so that they correlate.
	// Default: the process's (idem.KeyHash).
	KeyHasher *idem.KeyHasher
	// ConfirmBudget bounds how long Confirm is retried, with backoff, after
	// the handler succeeded, and how long Forget may take after it failed.
	// Negative panics. Default: two thirds of the lease's TTL.
	ConfirmBudget time.Duration
	// Concurrency bounds how many handlers of one batch run at once (Batch
	// only). Negative panics. Default DefaultConcurrency.
	Concurrency int
}

// DefaultConcurrency is Batch's default bound on concurrent handlers.
const DefaultConcurrency = 16

// defaultConfirmBudget is what a zero ConfirmBudget means, as the message
// refusing a negative one says it.
const defaultConfirmBudget = "two thirds of the lease's TTL"

// config is Options without the message type, checked, with defaults
// filled in.
type config struct {
	observer      idem.Observer
	keyHasher     *idem.KeyHasher
	hook          Hook
	confirmBudget time.Duration
	concurrency   int
}

// setup checks the arguments of the wrapper fn (Idempotent, Batch) and
// returns its config and fingerprint func. Mistakes panic here, in the
// caller's goroutine, naming the argument or field: found on the first
// message, they would surface far from where they were made (a nil store
// in a goroutine of KeepAlive's, a nil handler after the claim).
func setup[M any](fn string, store idem.Store, key func(M) string, h func(context.Context, M) error, opts []Options[M]) (*config, func(M) []byte) {
	switch {
	case store == nil:
		panic(fn + ": nil store")
	case nilcheck.Nil(store):
		panic(fmt.Sprintf("%s: store (%T)(nil) is nil and would panic on the first message", fn, store))
	case key == nil:
		panic(fn + ": nil key func")
	case h == nil:
		panic(fn + ": nil handler")
	case len(opts) > 1:
		panic(fmt.Sprintf("%s: %d Options; want at most one", fn, len(opts)))
	}
	var o Options[M]
	if len(opts) == 1 {
		o = opts[0]
	}
	switch {
	case o.ConfirmBudget < 0:
		panic(badopt.Default("consumer", "ConfirmBudget", o.ConfirmBudget, defaultConfirmBudget, "is negative").Error())
	case o.Concurrency < 0:
		panic(badopt.Default("consumer", "Concurrency", o.Concurrency, DefaultConcurrency, "is negative").Error())
	}
	c := &config{observer: o.Observer, keyHasher: o.KeyHasher, hook: o.Hook,
		confirmBudget: o.ConfirmBudget, concurrency: o.Concurrency}
	if c.concurrency == 0 {
		c.concurrency = DefaultConcurrency
	}
	return c, o.Fingerprint
}

func (c *config) emit(ctx context.Context, k Kind, key string, token int64, err error) {
	if c.hook == nil {
		return
	}
	c.hook(ctx, Event{Kind: k, KeyHash: c.keyHasher.Hash(key), Token: token, Err: err})
}

// budget is how long Confirm and Forget may be retried for l.
func (c *config) budget(l *idem.Lease) time.Duration {
	if c.confirmBudget > 0 {
		return c.confirmBudget
	}
	return max(l.TTL*2/3, time.Millisecond)
}
