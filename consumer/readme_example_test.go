package consumer_test

import (
	"context"
	"log"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
)

// The README's consumer blocks, compiled (their parameters are the
// reader's own names); ExampleIdempotent runs the same calls.
var _ = []any{readmeIdempotent, readmeOptions}

func readmeIdempotent(store idem.Store, charge func(context.Context, Order, int64) error) func(context.Context, Order) error {
	// README: consumer
	handle := consumer.Idempotent(store,
		func(m Order) string { return "order:" + m.ID },
		func(ctx context.Context, m Order) error {
			l, _ := idem.LeaseFrom(ctx) // l.Token fences downstream writes
			return charge(ctx, m, l.Token)
		})
	// README end
	return handle
}

func readmeOptions(store idem.Store, orderKey func(Order) string, chargeOrder func(context.Context, Order) error,
	orderHash func(Order) []byte, obs idem.Observer) func(context.Context, Order) error {
	// README: consumer-options
	handle := consumer.Idempotent(store, orderKey, chargeOrder, consumer.Options[Order]{
		Fingerprint: func(m Order) []byte { return orderHash(m) }, // func(M) []byte
		Hook: func(ctx context.Context, e consumer.Event) { // consumer.Hook: notable outcomes
			if e.Kind == consumer.LeaseLost {
				log.Printf("lease lost on %s: %v", e.KeyHash, e.Err)
			}
		},
		Observer:      obs,             // idem.Observer: one event per message
		ConfirmBudget: 2 * time.Second, // time.Duration
	})
	// README end
	return handle
}
