// Package amqp makes a RabbitMQ consumer (github.com/rabbitmq/amqp091-go)
// handle each message once, however often the broker delivers it.
//
// [Handler] wraps a delivery handler with consumer.Idempotent and settles
// every delivery itself, by consumer.ActionFor of the wrapper's error:
//
//	outcome                                  action        settlement
//	handler succeeded, or a duplicate        Ack           Ack
//	done but not recorded                    AckAndAlert   Ack, logged as an error
//	  (consumer.ErrNotRecorded)
//	handler failed, key in progress,         Redeliver     Nack with requeue, after a delay
//	  store unavailable                                      that grows with each retry of
//	                                                         the key
//	no key (no MessageId), invalid or        DeadLetter    Reject without requeue (to the
//	  oversized key, fingerprint mismatch,                   queue's dead-letter exchange),
//	  damaged record, quarantined key                        logged: never acked as done
//	  (idem.ErrQuarantined)
//	handler panicked                         -             Nack with requeue at once, panic
//	                                                         re-raised
//
// The package is named amqp like the broker's protocol; import it under
// another name (idemamqp) next to amqp091-go, which is usually imported as
// amqp.
package amqp

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/internal/badopt"
	"github.com/idemgo/idem/internal/nilcheck"
	"github.com/idemgo/idem/internal/retry"
	amqp091 "github.com/rabbitmq/amqp091-go"
)

// Action is how a delivery was settled.
type Action uint8

// The settlements of a delivery.
const (
	Ack    Action = iota + 1 // done (now or before): removed from the queue
	Nack                     // requeued, after Settlement.Delay
	Reject                   // not requeued: dead-lettered if the queue has a dead-letter exchange, else dropped
)

func (a Action) String() string {
	switch a {
	case Ack:
		return "ack"
	case Nack:
		return "nack"
	case Reject:
		return "reject"
	}
	return "action(" + strconv.Itoa(int(a)) + ")"
}

// Settlement reports how one delivery was settled, for metrics and tests.
type Settlement struct {
	Action Action
	// Delay is how long a Nack waited before requeueing; zero otherwise.
	Delay time.Duration
	// Err is the wrapped handler's error; nil for a plain Ack.
	Err error
	// SettleErr is the broker's error for the Ack, Nack or Reject itself.
	SettleErr error
}

// Options configure Handler: one flat literal, passed by value. The zero
// value is valid; a zero field means its default.
type Options struct {
	// Key names the work a delivery stands for. Default: its MessageId.
	// An empty key is rejected without requeue.
	Key func(d *amqp091.Delivery) string
	// Fingerprint returns a fingerprint of a delivery's content, as
	// consumer.Options.Fingerprint; a mismatch is rejected without requeue.
	// Default: none.
	Fingerprint func(d *amqp091.Delivery) []byte
	// MinDelay is the wait before the first requeue of a key; each further
	// requeue of the same key doubles it, up to MaxDelay, so that a busy
	// key or a failing handler does not spin through the broker. The
	// delivery stays unacknowledged meanwhile, counting against the
	// channel's prefetch. Negative panics. Default 50ms.
	MinDelay time.Duration
	// MaxDelay bounds the requeue delay. Negative panics. Default 5s.
	MaxDelay time.Duration
	// Logger receives rejections and unrecorded work. Keys are logged as
	// their KeyHasher hash, never raw. Default: slog.Default().
	Logger *slog.Logger
	// Hook is told of the wrapped handler's notable outcomes, as
	// consumer.Options.Hook. Default: none.
	Hook consumer.Hook
	// Observer receives one idem.Event per delivery with a key, as
	// consumer.Options.Observer. Default: none.
	Observer idem.Observer
	// KeyHasher hashes keys and message ids for the Logger, the Hook, the
	// Observer and errors. Give it the store's (idem.Options.KeyHasher) so
	// that they correlate. Default: the process's (idem.KeyHash).
	KeyHasher *idem.KeyHasher
	// ConfirmBudget bounds how long Confirm is retried after the handler
	// succeeded, as consumer.Options.ConfirmBudget. Negative panics.
	// Default: two thirds of the lease's TTL.
	ConfirmBudget time.Duration
	// OnSettle, when set, is called after each settlement, on the goroutine
	// that settles (for a Nack, a timer's). It must be quick and safe for
	// concurrent use. Default: none.
	OnSettle func(d *amqp091.Delivery, s Settlement)
}

// Defaults of Options.
const (
	DefaultMinDelay = 50 * time.Millisecond
	DefaultMaxDelay = 5 * time.Second
)

// maxTracked bounds the per-key retry counts kept for the growing delay;
// past it they are all forgotten (delays restart from MinDelay), so that
// keys that never succeed cannot grow the map without bound.
const maxTracked = 1 << 16

// Handler returns a func that handles one delivery with h at most once per
// key (see consumer.Idempotent) and then acks, nacks or rejects it as the
// package documentation's table says. The delivery must come from a
// consumer with auto-ack off. Nacks are sent from a timer after their delay,
// so the returned func does not block for it; if the channel closes
// meanwhile, the broker requeues the delivery itself.
//
// If h panics, the delivery is nacked with requeue at once and the panic
// re-raised. The returned func is safe for concurrent use if h is.
//
// Handler panics, in the caller's goroutine, when store (or the value in
// it) or h is nil, or a duration in o is negative: a mistake found on the
// first delivery would surface far from where it was made.
func Handler(store idem.Store, h func(ctx context.Context, d amqp091.Delivery) error, o Options) func(ctx context.Context, d amqp091.Delivery) {
	switch {
	case nilcheck.Nil(store):
		panic("amqp.Handler: nil store")
	case h == nil:
		panic("amqp.Handler: nil handler")
	}
	a := &adapter{o: o.withDefaults(), retries: map[string]int{}}
	key := a.o.Key
	a.wrapped = consumer.Idempotent(store, func(d amqp091.Delivery) string { return key(&d) }, h, a.o.consumer())
	return a.handle
}

// withDefaults returns o checked, with its defaults filled in. A negative
// duration panics, naming the field.
func (o Options) withDefaults() Options {
	switch {
	case o.MinDelay < 0:
		panic(badopt.Default("amqp", "MinDelay", o.MinDelay, DefaultMinDelay, "is negative").Error())
	case o.MaxDelay < 0:
		panic(badopt.Default("amqp", "MaxDelay", o.MaxDelay, DefaultMaxDelay, "is negative").Error())
	case o.ConfirmBudget < 0:
		panic(badopt.Default("amqp", "ConfirmBudget", o.ConfirmBudget, "two thirds of the lease's TTL", "is negative").Error())
	}
	if o.MinDelay == 0 {
		o.MinDelay = DefaultMinDelay
	}
	if o.MaxDelay == 0 {
		o.MaxDelay = DefaultMaxDelay
	}
	o.MaxDelay = max(o.MaxDelay, o.MinDelay)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Key == nil {
		o.Key = func(d *amqp091.Delivery) string { return d.MessageId }
	}
	return o
}

// consumer returns the options of the wrapped handler.
func (o Options) consumer() consumer.Options[amqp091.Delivery] {
	co := consumer.Options[amqp091.Delivery]{Hook: o.Hook, Observer: o.Observer,
		KeyHasher: o.KeyHasher, ConfirmBudget: o.ConfirmBudget}
	if fp := o.Fingerprint; fp != nil {
		co.Fingerprint = func(d amqp091.Delivery) []byte { return fp(&d) }
	}
	return co
}

type adapter struct {
	o       Options // withDefaults
	wrapped func(context.Context, amqp091.Delivery) error

	mu      sync.Mutex
	retries map[string]int // requeues per key since its last ack
}

// handle runs d through the wrapped handler and settles it.
func (a *adapter) handle(ctx context.Context, d amqp091.Delivery) {
	k := a.o.Key(&d)
	if k == "" {
		// Checked here too, to say why: without an id the delivery cannot be
		// told from its duplicates, and acking it as one would drop it.
		a.reject(ctx, &d, errors.New("idem/amqp: delivery without a key (MessageId) cannot be deduplicated"))
		return
	}
	settled := false
	defer func() {
		if !settled {
			a.settle(&d, Nack, 0, errors.New("idem/amqp: handler panicked"), d.Nack(false, true))
		}
	}()
	err := a.wrapped(ctx, d)
	settled = true
	switch consumer.ActionFor(err) {
	case consumer.Ack:
		a.ack(&d, k, nil)
	case consumer.AckAndAlert:
		a.o.Logger.LogAttrs(ctx, slog.LevelError, "idem/amqp: work done but not recorded; acked so it is not done again now",
			slog.String("key_hash", a.o.KeyHasher.Hash(k)), slog.Any("err", err))
		a.ack(&d, k, err)
	case consumer.DeadLetter:
		a.reject(ctx, &d, err)
	default: // consumer.Redeliver
		a.nackLater(&d, k, err)
	}
}

func (a *adapter) settle(d *amqp091.Delivery, act Action, delay time.Duration, err, settleErr error) {
	if settleErr != nil {
		a.o.Logger.Warn("idem/amqp: settling a delivery failed", slog.String("action", act.String()), slog.Any("err", settleErr))
	}
	if a.o.OnSettle != nil {
		a.o.OnSettle(d, Settlement{Action: act, Delay: delay, Err: err, SettleErr: settleErr})
	}
}

func (a *adapter) ack(d *amqp091.Delivery, key string, err error) {
	a.mu.Lock()
	delete(a.retries, key)
	a.mu.Unlock()
	a.settle(d, Ack, 0, err, d.Ack(false))
}

func (a *adapter) reject(ctx context.Context, d *amqp091.Delivery, err error) {
	a.mu.Lock()
	delete(a.retries, a.o.Key(d))
	a.mu.Unlock()
	a.o.Logger.LogAttrs(ctx, slog.LevelError, "idem/amqp: delivery rejected without requeue",
		slog.String("key_hash", a.o.KeyHasher.Hash(a.o.Key(d))), slog.String("message_id_hash", a.o.KeyHasher.Hash(d.MessageId)),
		slog.Uint64("delivery_tag", d.DeliveryTag), slog.Any("err", err))
	a.settle(d, Reject, 0, err, d.Reject(false))
}

// nackLater requeues d after a delay that doubles with each requeue of key.
func (a *adapter) nackLater(d *amqp091.Delivery, key string, err error) {
	a.mu.Lock()
	if len(a.retries) >= maxTracked {
		clear(a.retries)
	}
	n := a.retries[key]
	a.retries[key] = n + 1
	a.mu.Unlock()
	delay := retry.Doubling(a.o.MinDelay, a.o.MaxDelay, n)
	time.AfterFunc(delay, func() { a.settle(d, Nack, delay, err, d.Nack(false, true)) })
}
