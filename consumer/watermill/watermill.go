// Package watermill is a deduplicating middleware for Watermill routers
// (github.com/ThreeDotsLabs/watermill): each message's work is done once
// however often the Pub/Sub delivers it, on any number of router instances
// that share an idem.Store (a RedisStore for the Redis-backed deduplicator).
//
// [Middleware] wraps a handler with consumer.Idempotent:
//
//	outcome                              handler returns (router does)
//	handler succeeded                    its messages, nil          (ack, publish them)
//	duplicate (already done)             nil, nil                   (ack; handler not run)
//	in progress elsewhere                idem.ErrInProgress         (nack: redelivered)
//	handler failed or store unavailable  the error                  (nack: redelivered)
//	no key (empty UUID or metadata)      idem.ErrInvalidKey         (nack; see below)
//	done but not recorded                its messages, nil          (ack; logged as an error)
//
// Watermill has no reject: an error is a nack, and a message that can never
// succeed (no key, fingerprint mismatch) is redelivered forever unless a
// poison queue takes it. Put middleware.PoisonQueueWithFilter outside this
// middleware with a filter matching idem.ErrInvalidKey and
// idem.ErrFingerprintMismatch. Likewise, put middleware.Retry (with a
// delay) outside it so that an in-progress message is retried after a pause
// instead of spinning through the Pub/Sub.
//
// The package is named like Watermill's root package; import it under
// another name (idemwatermill) where both are used.
package watermill

import (
	"context"
	"errors"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
)

// Options configure Middleware. The zero value is valid: messages are keyed
// by their UUID.
type Options struct {
	// MetadataKey, when set, keys each message by this metadata field (an
	// event id set by the producer) instead of its UUID. Default: none.
	MetadataKey string
	// Key, when set, keys each message by what it returns; it overrides
	// MetadataKey. Default: none.
	Key func(msg *message.Message) string
	// Logger receives unrecorded work (consumer.ErrNotRecorded), keys as
	// their KeyHasher hash. Default: slog.Default().
	Logger *slog.Logger
	// KeyHasher hashes keys for the Logger, and for the wrapped handler's
	// hook, observer and errors (consumer.WithKeyHasher, which an option
	// in Consumer overrides). Give it the store's (idem.Options.KeyHasher)
	// so that they correlate. Default: the process's (idem.KeyHash).
	KeyHasher *idem.KeyHasher
	// Consumer options for the wrapped handler: hooks, observer
	// (consumer.WithObserver), fingerprint
	// (consumer.WithFingerprint[*watermill.Delivery]), confirm budget.
	Consumer []consumer.Option
}

// Delivery is what the wrapped handler sees as its message type: the
// Watermill message and the handler's output. It is exported only so that
// consumer.WithFingerprint can name it.
type Delivery struct {
	Msg *message.Message
	h   message.HandlerFunc
	out []*message.Message
}

// Middleware returns a router middleware that runs each message's handler at
// most once per key, as the package documentation's table says. While the
// handler runs, msg.Context() carries the lease (idem.LeaseFrom) and is
// cancelled with cause idem.ErrLeaseLost if the lease is lost; afterwards
// the message's own context is restored. A duplicate produces no messages:
// the first run's were published when it was done.
func Middleware(store idem.Store, o Options) message.HandlerMiddleware {
	key := o.Key
	switch {
	case key != nil:
	case o.MetadataKey != "":
		name := o.MetadataKey
		key = func(msg *message.Message) string { return msg.Metadata.Get(name) }
	default:
		key = func(msg *message.Message) string { return msg.UUID }
	}
	logger := o.Logger
	if logger == nil {
		logger = slog.Default()
	}
	wrapped := consumer.Idempotent(store, func(d *Delivery) string { return key(d.Msg) },
		func(ctx context.Context, d *Delivery) error {
			orig := d.Msg.Context()
			d.Msg.SetContext(ctx)
			defer d.Msg.SetContext(orig)
			out, err := d.h(d.Msg)
			d.out = out
			return err
		}, append([]consumer.Option{consumer.WithKeyHasher(o.KeyHasher)}, o.Consumer...)...)
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			d := &Delivery{Msg: msg, h: h}
			err := wrapped(msg.Context(), d)
			switch {
			case err == nil:
				return d.out, nil
			case errors.Is(err, consumer.ErrNotRecorded):
				// Redelivering would surely do the work again once the lease
				// runs out; acking risks it only if another duplicate comes.
				logger.LogAttrs(msg.Context(), slog.LevelError, "idem/watermill: work done but not recorded; acked so it is not done again now",
					slog.String("key_hash", o.KeyHasher.Hash(key(msg))), slog.Any("err", err))
				return d.out, nil
			}
			return nil, err
		}
	}
}
