// Package watermill is a deduplicating middleware for Watermill routers
// (github.com/ThreeDotsLabs/watermill): each message's work is done once
// however often the Pub/Sub delivers it, on any number of router instances
// that share an idem.Store (a RedisStore for the Redis-backed deduplicator).
//
// [Middleware] wraps a handler with consumer.Idempotent and answers the
// router by consumer.ActionFor of the wrapper's error:
//
//	outcome                              action        handler returns (router does)
//	handler succeeded                    Ack           its messages, nil   (ack, publish them)
//	duplicate (already done)             Ack           nil, nil            (ack; handler not run)
//	done but not recorded                AckAndAlert   its messages, nil   (ack; logged as an error)
//	  (consumer.ErrNotRecorded)
//	in progress elsewhere                Redeliver     idem.ErrInProgress  (nack: redelivered)
//	handler failed or store unavailable  Redeliver     the error           (nack: redelivered)
//	no key (empty UUID or metadata),     DeadLetter    the error           (nack, logged as an
//	  invalid or oversized key,                                              error; see below)
//	  fingerprint mismatch, damaged
//	  record, quarantined key
//	  (idem.ErrQuarantined)
//
// Watermill has no reject: an error is a nack, and a message that can never
// succeed is redelivered forever unless a poison queue takes it. Put
// middleware.PoisonQueueWithFilter outside this middleware with the filter
//
//	func(err error) bool { return consumer.ActionFor(err) == consumer.DeadLetter }
//
// Likewise, put middleware.Retry (with a delay) outside it so that an
// in-progress message is retried after a pause instead of spinning through
// the Pub/Sub.
//
// The package is named like Watermill's root package; import it under
// another name (idemwatermill) where both are used.
package watermill

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
)

// Options configure Middleware: one flat literal, passed by value. The zero
// value is valid: messages are keyed by their UUID.
type Options struct {
	// MetadataKey, when set, keys each message by this metadata field (an
	// event id set by the producer) instead of its UUID. Default: none.
	MetadataKey string
	// Key, when set, keys each message by what it returns; it overrides
	// MetadataKey. Default: none.
	Key func(msg *message.Message) string
	// Fingerprint returns a fingerprint of a message's content, as
	// consumer.Options.Fingerprint; a mismatch is an error matching
	// idem.ErrFingerprintMismatch (nack). Default: none.
	Fingerprint func(msg *message.Message) []byte
	// Logger receives unrecorded work (consumer.ErrNotRecorded) and
	// messages that can never succeed, keys as their KeyHasher hash.
	// Default: slog.Default().
	Logger *slog.Logger
	// Hook is told of the wrapped handler's notable outcomes, as
	// consumer.Options.Hook. Default: none.
	Hook consumer.Hook
	// Observer receives one idem.Event per message, as
	// consumer.Options.Observer. Default: none.
	Observer idem.Observer
	// KeyHasher hashes keys for the Logger, the Hook, the Observer and
	// errors. Give it the store's (idem.Options.KeyHasher) so that they
	// correlate. Default: the process's (idem.KeyHash).
	KeyHasher *idem.KeyHasher
	// ConfirmBudget bounds how long Confirm is retried after the handler
	// succeeded, as consumer.Options.ConfirmBudget. Negative panics.
	// Default: two thirds of the lease's TTL.
	ConfirmBudget time.Duration
}

// delivery is what the wrapped handler sees as its message type: the
// Watermill message and the handler's output.
type delivery struct {
	msg *message.Message
	h   message.HandlerFunc
	out []*message.Message
}

// Middleware returns a router middleware that runs each message's handler at
// most once per key, as the package documentation's table says. While the
// handler runs, msg.Context() carries the lease (idem.LeaseFrom) and is
// cancelled with cause idem.ErrLeaseLost if the lease is lost; afterwards
// the message's own context is restored. A duplicate produces no messages:
// the first run's were published when it was done.
//
// Middleware panics, in the caller's goroutine, when store (or the value in
// it) is nil or o.ConfirmBudget is negative, and the middleware it returns
// panics when given a nil handler: a mistake found on the first message
// would surface far from where it was made.
func Middleware(store idem.Store, o Options) message.HandlerMiddleware {
	switch {
	case isNil(store):
		panic("watermill.Middleware: nil store")
	case o.ConfirmBudget < 0:
		panic(fmt.Sprintf("watermill: ConfirmBudget: %v is negative; 0 means the default, two thirds of the lease's TTL", o.ConfirmBudget))
	}
	key := o.keyFunc()
	logger := o.Logger
	if logger == nil {
		logger = slog.Default()
	}
	wrapped := consumer.Idempotent(store, func(d *delivery) string { return key(d.msg) },
		func(ctx context.Context, d *delivery) error {
			orig := d.msg.Context()
			d.msg.SetContext(ctx)
			defer d.msg.SetContext(orig)
			out, err := d.h(d.msg)
			d.out = out
			return err
		}, o.consumer())
	return func(h message.HandlerFunc) message.HandlerFunc {
		if h == nil {
			panic("watermill.Middleware: nil handler")
		}
		return func(msg *message.Message) ([]*message.Message, error) {
			d := &delivery{msg: msg, h: h}
			err := wrapped(msg.Context(), d)
			switch consumer.ActionFor(err) {
			case consumer.Ack:
				return d.out, nil
			case consumer.AckAndAlert:
				// Redelivering would surely do the work again once the lease
				// runs out; acking risks it only if another duplicate comes.
				logger.LogAttrs(msg.Context(), slog.LevelError, "idem/watermill: work done but not recorded; acked so it is not done again now",
					slog.String("key_hash", o.KeyHasher.Hash(key(msg))), slog.Any("err", err))
				return d.out, nil
			case consumer.DeadLetter:
				// Still a nack (Watermill has no reject), for a poison queue
				// to take; logged, as no redelivery can succeed.
				logger.LogAttrs(msg.Context(), slog.LevelError, "idem/watermill: "+whyDead(err)+"; route it to a poison queue",
					slog.String("key_hash", o.KeyHasher.Hash(key(msg))), slog.Any("err", err))
			}
			return nil, err
		}
	}
}

// keyFunc returns the func that keys a message: Key, else MetadataKey's
// field, else the UUID.
func (o Options) keyFunc() func(*message.Message) string {
	switch {
	case o.Key != nil:
		return o.Key
	case o.MetadataKey != "":
		name := o.MetadataKey
		return func(msg *message.Message) string { return msg.Metadata.Get(name) }
	}
	return func(msg *message.Message) string { return msg.UUID }
}

// consumer returns the options of the wrapped handler.
func (o Options) consumer() consumer.Options[*delivery] {
	co := consumer.Options[*delivery]{Hook: o.Hook, Observer: o.Observer,
		KeyHasher: o.KeyHasher, ConfirmBudget: o.ConfirmBudget}
	if fp := o.Fingerprint; fp != nil {
		co.Fingerprint = func(d *delivery) []byte { return fp(d.msg) }
	}
	return co
}

// isNil reports whether v is nil or holds a nil pointer, map, slice,
// channel or function: a (*idem.RedisStore)(nil) given as an idem.Store is
// not == nil, and would panic on first use, far from the mistake.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch r := reflect.ValueOf(v); r.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Chan, reflect.Func, reflect.Interface:
		return r.IsNil()
	}
	return false
}

// whyDead says why a dead-lettered message cannot be handled: a
// quarantined key waits for an operator, anything else can never succeed.
func whyDead(err error) string {
	if errors.Is(err, idem.ErrQuarantined) {
		return "message's key is quarantined after repeated crashes, an operator must settle it (idem resolve)"
	}
	return "message can never succeed"
}
