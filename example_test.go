package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/middleware"
	"github.com/redis/go-redis/v9"
)

// Charge an order once, however many times the request comes: the first
// call runs the function and records its receipt; every later call of the
// key gets that receipt without running it.
func ExampleDo() {
	ctx := context.Background()
	// README: do
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
	// README: permanent
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

// A message handler that may see the same message twice, by hand: the
// first delivery claims the key, does the work under KeepAlive and
// confirms it; the second finds the confirmation and answers as the first
// time. This is the README's raw API block, as it is there.
func Example() {
	ctx := context.Background()
	srv, _ := miniredis.Run() // an embedded Redis; use your own in production
	defer srv.Close()
	store, err := idem.NewRedisStore(redis.NewClient(&redis.Options{Addr: srv.Addr()}), idem.RedisOptions{})
	if err != nil {
		log.Fatal(err)
	}
	reply := func(receipt []byte) error { fmt.Println("already charged:", string(receipt)); return nil }
	reject := func(err error) error { fmt.Println("rejected:", err); return nil }

	handle := func(orderID string, fingerprint []byte) error {
		// README: raw
		c, err := store.Claim(ctx, "charge:"+orderID, fingerprint)
		if errors.Is(err, idem.ErrFingerprintMismatch) {
			return reject(err) // another request reuses the key: never answer it with this one's result
		}
		if err != nil {
			return err // nothing was done: let the broker redeliver
		}
		switch c.Outcome {
		case idem.Duplicate:
			return reply(c.Record.Result) // done before: answer as the first time
		case idem.InProgress:
			return idem.ErrInProgress // another worker is at it: redeliver later
		}
		work, stop := idem.KeepAlive(ctx, store, c.Lease) // renew while the work runs
		receipt, err := chargeCard(work, orderID, c.Lease.Token)
		stop()
		if err != nil {
			_ = store.Forget(ctx, c.Lease) // the next delivery tries again
			return err
		}
		err = store.Confirm(ctx, c.Lease, receipt)
		if errors.Is(err, idem.ErrAlreadyConfirmed) {
			log.Printf("charged twice: %v", err) // another delivery confirmed first; its receipt stays
			return nil
		}
		return err
		// README end
	}

	fmt.Println(handle("order-17", []byte("amount=1250")))
	fmt.Println(handle("order-17", []byte("amount=1250")))
	// Output:
	// charged order-17
	// <nil>
	// already charged: receipt-order-17
	// <nil>
}

// chargeCard is the payment provider's side of the examples: the token
// would fence its write.
func chargeCard(ctx context.Context, orderID string, token int64) ([]byte, error) {
	fmt.Println("charged", orderID)
	return []byte("receipt-" + orderID), ctx.Err()
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

// The README's Do block and its Reconcile block, pasted together as a
// reader would, across a crash: a worker charged order-19 and died before
// recording it; the next call takes the key over, Reconcile finds the
// charge, and its receipt is recorded without charging again. (A test, not
// an Example: the Do block's own Output comment is inside it.)
func TestREADMEDoReconcile(t *testing.T) {
	ctx := context.Background()
	// README: do-paired
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
	// README end

	// The crash: a worker claims order-19, the provider charges it, and
	// the worker dies before recording it. Its lease runs out (the
	// store's clock is moved past it).
	now := time.Now()
	store, _ = idem.NewMemoryStoreClock(idem.Options{}, func() time.Time { return now })
	orderID := "order-19"
	_, _ = store.Claim(ctx, "charge:"+orderID, nil)
	payments.charges[orderID] = &providerCharge{ID: "ch_19", Amount: 1250}
	now = now.Add(time.Minute)

	// README: reconcile
	v, err := idem.Do(ctx, store, "charge:"+orderID, charge, idem.DoOptions{
		Reconcile: func(ctx context.Context, t *idem.TakeOver) (any, bool, error) {
			// The earlier attempt (t.Prior) may have charged the card.
			ch, err := payments.FindCharge(ctx, orderID)
			if err != nil || ch == nil {
				return nil, false, err // unknown: retried later; nil: charge
			}
			return Receipt{ID: ch.ID, Amount: ch.Amount}, true, nil // landed: recorded, not charged again
		},
	})
	// README end
	want := Receipt{ID: "ch_19", Amount: 1250}
	if v != want || err != nil {
		t.Errorf("Do after the take-over = %v, %v; want Reconcile's %v, <nil>", v, err, want)
	}
	v, err = idem.Do(ctx, store, "charge:"+orderID, charge, idem.DoOptions{})
	if v != want || err != nil {
		t.Errorf("Do again = %v, %v; want the recorded %v, <nil>", v, err, want)
	}
	if charges != 1 {
		t.Errorf("charged %d times; want 1: Reconcile found the charge", charges)
	}
}

// payments stands for a payment provider's API, which the README's
// examples ask whether a charge landed.
var payments = &paymentsAPI{charges: map[string]*providerCharge{}}

type paymentsAPI struct{ charges map[string]*providerCharge }

type providerCharge struct {
	ID     string
	Amount int
}

// FindCharge returns the charge of an order, or nil when there is none.
func (p *paymentsAPI) FindCharge(ctx context.Context, orderID string) (*providerCharge, error) {
	return p.charges[orderID], ctx.Err()
}

// Order is the message of the README's consumer blocks.
type Order struct {
	ID     string
	Amount int
}

// The README blocks below are compiled, not run: they need a real Redis,
// or names of the reader's own program (their parameters here).
var _ = []any{readmeAfterCrash, readmeCache, readmeKeyHasher}

func readmeAfterCrash(ctx context.Context, store idem.Store, key string, fp []byte) error {
	// README: after-crash
	c, err := store.Claim(ctx, key, fp)
	if errors.Is(err, idem.ErrQuarantined) {
		return err // a crash loop: an operator settles it (idem resolve)
	}
	if c.Outcome == idem.Claimed && c.TakeOver {
		// An earlier attempt (c.Prior) may have done part of the work:
		// ask the downstream system before doing it again, and resume
		// after c.Checkpoint.
	}
	// ... step 1 ...
	err = store.(idem.Checkpointer).Checkpoint(ctx, c.Lease, []byte("charged:ch_123"))
	// README end
	return err
}

func readmeCache(redisClient redis.UniversalClient, obs idem.Observer, tenant func(*http.Request) (string, error),
	key func(Order) string, h func(context.Context, Order) error) error {
	// README: cache
	store, err := idem.NewRedisStore(redisClient, idem.RedisOptions{Observer: obs})
	if err != nil {
		return err
	}
	cache, err := idem.NewCache(store, idem.CacheOptions{Observer: obs}) // 32 MiB, 1s
	if err != nil {
		return err
	}
	mw, err := middleware.New(middleware.Options{Store: cache, Scope: tenant}) // replays from memory
	if err != nil {
		return err
	}
	handle := consumer.Idempotent(cache, key, h) // redeliveries too
	// README end
	_, _ = mw, handle
	return nil
}

func readmeKeyHasher(secretFromYourVault []byte, client redis.UniversalClient, obs idem.Observer,
	tenant func(*http.Request) (string, error), key func(Order) string, h func(context.Context, Order) error) error {
	// README: key-hasher
	hasher, err := idem.NewKeyHasher(secretFromYourVault) // at least 16 bytes
	if err != nil {
		return err
	}
	store, err := idem.NewRedisStore(client, idem.RedisOptions{
		Logger: slog.Default(), Observer: obs, KeyHasher: hasher})
	if err != nil {
		return err
	}
	mw, err := middleware.New(middleware.Options{Store: store, Scope: tenant, Observer: obs, KeyHasher: hasher})
	if err != nil {
		return err
	}
	handle := consumer.Idempotent(store, key, h, consumer.Options[Order]{Observer: obs, KeyHasher: hasher})
	// README end
	_, _ = mw, handle
	return nil
}
