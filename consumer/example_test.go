package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strconv"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
)

type Order struct {
	ID     string
	Amount int
}

// A handler behind an at-least-once broker: the second delivery of an order
// is acknowledged without charging it again, and a delivery that arrives
// while another holds the order is told to come back later.
func ExampleIdempotent() {
	ctx := context.Background()
	store, err := idem.NewMemoryStore(idem.Options{}) // a RedisStore in production
	if err != nil {
		log.Fatal(err)
	}

	charge := consumer.Idempotent(store, func(o Order) string { return "charge:" + o.ID },
		func(ctx context.Context, o Order) error {
			l, _ := idem.LeaseFrom(ctx) // l.Token fences downstream writes
			fmt.Printf("charging %s %d (token %d)\n", o.ID, o.Amount, l.Token)
			return nil
		})

	fmt.Println(charge(ctx, Order{"o-1", 42})) // first delivery: charged
	fmt.Println(charge(ctx, Order{"o-1", 42})) // redelivery: acked, not charged

	held, _ := store.Claim(ctx, "charge:o-2", nil) // another consumer is at work on o-2
	err = charge(ctx, Order{"o-2", 7})
	fmt.Println(errors.Is(err, idem.ErrInProgress), held.Outcome)
	// Output:
	// charging o-1 42 (token 1)
	// <nil>
	// <nil>
	// true claimed
}

// Options in one literal, typed by the message: a fingerprint of the
// order's content, so that a different order reusing a key is refused
// rather than skipped as its duplicate, and a hook that hears of the
// skipped duplicates.
func ExampleIdempotent_options() {
	ctx := context.Background()
	store, err := idem.NewMemoryStore(idem.Options{})
	if err != nil {
		log.Fatal(err)
	}
	charge := consumer.Idempotent(store, func(o Order) string { return "charge:" + o.ID },
		func(ctx context.Context, o Order) error {
			fmt.Printf("charging %s %d\n", o.ID, o.Amount)
			return nil
		},
		consumer.Options[Order]{
			Fingerprint: func(o Order) []byte { return []byte(strconv.Itoa(o.Amount)) },
			Hook: func(_ context.Context, e consumer.Event) {
				fmt.Println("hook:", e.Kind)
			},
		})

	fmt.Println(charge(ctx, Order{"o-1", 42}))
	fmt.Println(charge(ctx, Order{"o-1", 42})) // the same order again: skipped
	err = charge(ctx, Order{"o-1", 7})         // another order under o-1's key
	fmt.Println(errors.Is(err, idem.ErrFingerprintMismatch))
	// Output:
	// charging o-1 42
	// <nil>
	// hook: duplicate_skipped
	// <nil>
	// true
}

// A delivery batch: claimed in one call, run in parallel, confirmed in one
// call, one result per message.
func ExampleBatch() {
	ctx := context.Background()
	store, err := idem.NewMemoryStore(idem.Options{})
	if err != nil {
		log.Fatal(err)
	}
	handle := consumer.Batch(store, func(o Order) string { return o.ID },
		func(ctx context.Context, o Order) error {
			if o.Amount < 0 {
				return errors.New("negative amount")
			}
			return nil
		})

	batch := []Order{{"a", 1}, {"b", -1}, {"a", 1}, {"c", 3}}
	for i, err := range handle(ctx, batch) {
		// The second "a" is handled after the first, and found done: a
		// duplicate, acked (nil) without running the handler again.
		fmt.Println(batch[i].ID, err == nil)
	}
	// Output:
	// a true
	// b false
	// a true
	// c true
}

// Settling a broker of one's own by the wrapper's error: every adapter of
// this module does it through ActionFor, so that none decides on its own.
func ExampleActionFor() {
	ctx := context.Background()
	store, err := idem.NewMemoryStore(idem.Options{})
	if err != nil {
		log.Fatal(err)
	}
	charge := consumer.Idempotent(store, func(o Order) string { return o.ID },
		func(ctx context.Context, o Order) error {
			if o.Amount <= 0 {
				return errors.New("nothing to charge")
			}
			return nil
		})
	settle := func(o Order) {
		var what string
		switch consumer.ActionFor(charge(ctx, o)) {
		case consumer.Ack:
			what = "ack"
		case consumer.AckAndAlert:
			what = "ack, and alert: done but not recorded"
		case consumer.Redeliver:
			what = "redeliver later"
		case consumer.DeadLetter:
			what = "dead-letter"
		}
		fmt.Printf("%q: %s\n", o.ID, what)
	}
	settle(Order{"o-1", 42}) // done
	settle(Order{"o-1", 42}) // a duplicate
	settle(Order{"o-2", 0})  // the handler failed
	settle(Order{"", 5})     // no key: no redelivery can fix it
	// Output:
	// "o-1": ack
	// "o-1": ack
	// "o-2": redeliver later
	// "": dead-letter
}
