package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemgo/idem"
	"github.com/redis/go-redis/v9"
)

// Charge an order once, however many times the request comes: the first
// call runs the function and records its receipt; every later call of the
// key gets that receipt without running it.
func ExampleDo() {
	ctx := context.Background()
	store, err := idem.NewMemoryStore(idem.Options{}) // NewRedisStore, sqlstore.New in production
	if err != nil {
		log.Fatal(err)
	}

	type Receipt struct {
		ID     string
		Amount int
	}
	charges := 0
	charge := func(ctx context.Context) (Receipt, error) {
		l, _ := idem.LeaseFrom(ctx) // l.Token fences the payment provider's write
		charges++
		return Receipt{ID: fmt.Sprintf("rcpt-%d", l.Token), Amount: 1250}, nil
	}
	for range 3 {
		r, err := idem.Do(ctx, store, "charge:order-17", charge,
			idem.DoOptions{Fingerprint: []byte("amount=1250")})
		fmt.Println(r, err)
	}
	fmt.Println("charged", charges, "time")
	// Output:
	// {rcpt-1 1250} <nil>
	// {rcpt-1 1250} <nil>
	// {rcpt-1 1250} <nil>
	// charged 1 time
}

// A declined card is the key's answer: marked Permanent, the error is
// recorded and every retry gets it back, still matching its sentinel. An
// unmarked error (a timeout) would forget the key, and the retry would run
// the function again.
func ExamplePermanent() {
	ctx := context.Background()
	store, err := idem.NewMemoryStore(idem.Options{})
	if err != nil {
		log.Fatal(err)
	}
	errDeclined := errors.New("card declined")
	charge := func(context.Context) (string, error) {
		return "", fmt.Errorf("order 18: %w", idem.Permanent(errDeclined))
	}
	o := idem.DoOptions{Errors: []error{errDeclined}}

	_, err = idem.Do(ctx, store, "charge:order-18", charge, o)
	fmt.Println(err, errors.Is(err, errDeclined))
	_, err = idem.Do(ctx, store, "charge:order-18", charge, o)
	var p *idem.PermanentError
	fmt.Println(err, errors.Is(err, errDeclined), errors.As(err, &p) && p.Replayed)
	// Output:
	// order 18: card declined true
	// order 18: card declined true true
}

// A message handler that may see the same message twice: the first delivery
// does the work, the second finds the confirmation.
func Example() {
	ctx := context.Background()
	srv, _ := miniredis.Run() // an embedded Redis; use your own in production
	defer srv.Close()
	store, err := idem.NewRedisStore(redis.NewClient(&redis.Options{Addr: srv.Addr()}), idem.RedisOptions{})
	if err != nil {
		panic(err)
	}

	charge := func(orderID string) (string, error) {
		c, err := store.Claim(ctx, "charge:"+orderID, nil)
		if err != nil {
			return "", err // nothing was done: let the broker redeliver
		}
		switch c.Outcome {
		case idem.Duplicate:
			return "already charged: " + string(c.Record.Result), nil
		case idem.InProgress:
			return "", idem.ErrInProgress // redeliver later
		}
		work, stop := idem.KeepAlive(ctx, store, c.Lease)
		receipt, err := chargeCard(work, orderID)
		stop()
		if err != nil {
			_ = store.Forget(ctx, c.Lease) // the next delivery tries again
			return "", err
		}
		return "charged: " + receipt, store.Confirm(ctx, c.Lease, []byte(receipt))
	}

	fmt.Println(charge("order-17"))
	fmt.Println(charge("order-17"))
	// Output:
	// charged: receipt-order-17 <nil>
	// already charged: receipt-order-17 <nil>
}

func chargeCard(ctx context.Context, orderID string) (string, error) {
	return "receipt-" + orderID, ctx.Err()
}

// Two deliveries of the same key while the first is still at work: the
// second is told to come back later, and sees who holds the key.
func ExampleStore_Claim_inProgress() {
	ctx := context.Background()
	store, err := idem.NewMemoryStore(idem.Options{Worker: "worker-1"})
	if err != nil {
		log.Fatal(err)
	}

	first, _ := store.Claim(ctx, "msg-42", []byte("body-hash"))
	second, _ := store.Claim(ctx, "msg-42", []byte("body-hash"))
	fmt.Println(first.Outcome, second.Outcome, second.Record.Owner, second.Record.Token == first.Lease.Token)

	// The first delivery fails: forgetting the claim lets the retry in.
	_ = store.Forget(ctx, first.Lease)
	retry, _ := store.Claim(ctx, "msg-42", []byte("body-hash"))
	fmt.Println(retry.Outcome, retry.Lease.Token > first.Lease.Token)
	// Output:
	// claimed in_progress worker-1 true
	// claimed true
}

// A key reused for a different request: Claim says so, with the record it
// found, and the first request's result is never replayed to the second.
func ExampleStore_Claim_fingerprintMismatch() {
	ctx := context.Background()
	store, err := idem.NewMemoryStore(idem.Options{})
	if err != nil {
		log.Fatal(err)
	}

	c, _ := store.Claim(ctx, "refund-7", []byte("amount=10"))
	_ = store.Confirm(ctx, c.Lease, []byte("refunded 10"))

	again, err := store.Claim(ctx, "refund-7", []byte("amount=10"))
	fmt.Println(again.Outcome, string(again.Record.Result), err)
	other, err := store.Claim(ctx, "refund-7", []byte("amount=99"))
	fmt.Println(other.Outcome, errors.Is(err, idem.ErrFingerprintMismatch))
	// Output:
	// duplicate refunded 10 <nil>
	// duplicate true
}

// Claim and confirm a whole delivery batch in two round trips.
func ExampleRedisStore_ClaimBatch() {
	ctx := context.Background()
	srv, _ := miniredis.Run()
	defer srv.Close()
	store, _ := idem.NewRedisStore(redis.NewClient(&redis.Options{Addr: srv.Addr()}), idem.RedisOptions{})

	keys := []string{"m1", "m2", "m1"} // m1 delivered twice in one batch
	claims, err := store.ClaimBatch(ctx, keys, nil)
	if err != nil {
		panic(err)
	}
	var leases []*idem.Lease
	for i, c := range claims {
		fmt.Println(keys[i], c.Outcome)
		if c.Outcome == idem.Claimed {
			leases = append(leases, c.Lease) // ... after doing its work
		}
	}
	fmt.Println(store.ConfirmBatch(ctx, leases, nil))
	again, _ := store.ClaimBatch(ctx, []string{"m1", "m2"}, nil)
	fmt.Println(again[0].Outcome, again[1].Outcome)
	// Output:
	// m1 claimed
	// m2 claimed
	// m1 in_progress
	// <nil>
	// duplicate duplicate
}

// KeepAlive renews the lease while the work runs and cancels the work's
// context when the lease is lost.
func ExampleKeepAlive() {
	ctx := context.Background()
	store, err := idem.NewMemoryStore(idem.Options{LeaseTTL: time.Second})
	if err != nil {
		log.Fatal(err)
	}
	c, _ := store.Claim(ctx, "job-7", nil)

	work, stop := idem.KeepAlive(ctx, store, c.Lease)
	defer stop()
	_ = store.Forget(ctx, c.Lease) // the lease is taken away behind the worker's back
	<-work.Done()
	fmt.Println(errors.Is(context.Cause(work), idem.ErrLeaseLost))
	// Output: true
}
