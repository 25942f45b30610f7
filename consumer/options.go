package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/idemgo/idem"
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
)

var kindNames = [...]string{"", "duplicate_skipped", "in_progress", "lease_lost", "late_confirm", "confirm_failed", "forget_failed"}

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
	// KeyHash is the keyed hash of the message's key (WithKeyHasher).
	KeyHash string
	// Token is the fencing token of this delivery's lease (LeaseLost,
	// LateConfirm, ConfirmFailed, ForgetFailed), or of the record found
	// (DuplicateSkipped: the confirmation; InProgress: the holder).
	Token int64
	// Err is the error behind the event, where there is one.
	Err error
}

// Hook is called synchronously, on the goroutine that handles the message,
// once per notable outcome. It must be quick and safe for concurrent use.
type Hook func(ctx context.Context, e Event)

// Option configures Idempotent and Batch.
type Option func(*config)

// WithHook reports notable outcomes to h. Default: none.
func WithHook(h Hook) Option {
	return func(c *config) { c.hook = h }
}

// WithFingerprint gives the store a fingerprint of each message's content
// (a hash, at most idem.MaxFingerprintBytes). A delivery whose key was
// claimed or confirmed with another fingerprint is not handled: the wrapper
// returns an error matching idem.ErrFingerprintMismatch, which will never
// succeed on redelivery (dead-letter it). M must be the message type of the
// wrapper the option is given to; Idempotent and Batch panic otherwise.
// Default: no fingerprint.
func WithFingerprint[M any](f func(M) []byte) Option {
	return func(c *config) { c.fingerprint = f }
}

// WithConfirmBudget bounds how long a failing Confirm is retried, with
// backoff, after the handler succeeded. Default: two thirds of the lease's
// TTL, which is what a lease kept alive by idem.KeepAlive surely has left
// when the handler returns; retrying past the lease would let another
// delivery claim the key and do the work again while this one still tries to
// record it.
func WithConfirmBudget(d time.Duration) Option {
	return func(c *config) { c.confirmBudget = d }
}

// WithConcurrency bounds how many handlers of one batch run at once (Batch
// only; n < 1 means the default). Default 16.
func WithConcurrency(n int) Option {
	return func(c *config) { c.concurrency = n }
}

// DefaultConcurrency is Batch's default bound on concurrent handlers.
const DefaultConcurrency = 16

// WithObserver reports each message to o as one idem.Event with Op
// idem.OpMessage (Batch: one per message of the batch), after it is
// settled: Outcome is its claim's outcome (zero when the claim failed),
// Took the whole message, handler included, KeyHash the keyed hash of its
// key (WithKeyHasher). Err is the idempotency layer's answer, not the
// handler's: nil when it did its part, even if the handler failed or
// panicked (the claim was then forgotten); an error matching idem.ErrInProgress or
// idem.ErrFingerprintMismatch (Class conflict); ErrNotRecorded joined with
// the store's error; the Claim's error; idem.ErrInvalidKey for an empty
// key. When o is an idem.Starter, it is started for each message before
// its claim, and its context is the one the handler, the message's own
// store calls and its event get, so that spans nest (Batch's ClaimBatch and
// ConfirmBatch serve many messages and run on the batch's context). Give
// the store the same Observer to see its operations too. With no Observer
// nothing is measured and nothing is allocated for it. Default: none.
func WithObserver(o idem.Observer) Option {
	return func(c *config) { c.observer = o }
}

// WithKeyHasher hashes keys for the Hook, the Observer and error messages.
// Give it the store's (idem.Options.KeyHasher) so that they correlate with
// the store's events and log lines. Default: the process's (idem.KeyHash).
func WithKeyHasher(h *idem.KeyHasher) Option {
	return func(c *config) { c.keyHasher = h }
}

type config struct {
	observer      idem.Observer
	keyHasher     *idem.KeyHasher
	hook          Hook
	fingerprint   any
	confirmBudget time.Duration
	concurrency   int
}

func newConfig(opts []Option) *config {
	c := &config{}
	for _, o := range opts {
		o(c)
	}
	if c.concurrency < 1 {
		c.concurrency = DefaultConcurrency
	}
	return c
}

// fingerprintFunc returns the configured fingerprint func for messages of
// type M, nil when there is none. A func for another type is a programming
// error, reported when the wrapper is built rather than on the first message.
func fingerprintFunc[M any](c *config) func(M) []byte {
	if c.fingerprint == nil {
		return nil
	}
	f, ok := c.fingerprint.(func(M) []byte)
	if !ok {
		var m M
		panic(fmt.Sprintf("consumer: WithFingerprint given a %T, want func(%T) []byte", c.fingerprint, m))
	}
	return f
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
