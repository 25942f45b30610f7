package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/internal/testing/obstest"
	"github.com/redis/go-redis/v9"
)

var errHandler = errors.New("test: handler failed")

// batchCase runs one mixed batch and checks every per-message result:
// new, duplicate (confirmed earlier), held by another, twice in one batch
// (the second a duplicate of the first), failing, empty key.
func batchCase(t *testing.T, s idem.Store, b *spyStore) {
	ctx := context.Background()
	var ev events
	var mu sync.Mutex
	ran := map[string]int{}
	h := consumer.Batch(b.asStore(), msgKey, func(ctx context.Context, m msg) error {
		if l, ok := idem.LeaseFrom(ctx); !ok || l.Key != m.ID {
			t.Errorf("LeaseFrom in batch handler = %v, %v; want the lease of %q", l, ok, m.ID)
		}
		mu.Lock()
		ran[m.ID]++
		mu.Unlock()
		if m.Body == "fail" {
			return errHandler
		}
		return nil
	}, consumer.Options[msg]{Hook: ev.hook, Concurrency: 4})

	k := func(s string) string { return uniq(t, s) }
	pre := consumer.Idempotent(s, msgKey, func(context.Context, msg) error { return nil })
	if err := pre(ctx, msg{ID: k("done")}); err != nil {
		t.Fatal(err)
	}
	held, err := s.Claim(ctx, k("held"), nil)
	if err != nil || held.Outcome != idem.Claimed {
		t.Fatalf("Claim(held) = %v, %v", held.Outcome, err)
	}
	before := b.total()
	ms := []msg{{ID: k("new1")}, {ID: k("done")}, {ID: k("held")}, {ID: k("twice")}, {ID: k("twice")},
		{ID: k("bad"), Body: "fail"}, {ID: ""}, {ID: k("new2")}}
	errs := h(ctx, ms)
	if len(errs) != len(ms) {
		t.Fatalf("got %d results for %d messages", len(errs), len(ms))
	}
	want := []func(error) bool{
		isNil, isNil, is(idem.ErrInProgress), isNil, isNil, is(errHandler), is(idem.ErrInvalidKey), isNil,
	}
	for i, ok := range want {
		if !ok(errs[i]) {
			t.Errorf("result %d (%q) = %v; unexpected", i, ms[i].ID, errs[i])
		}
	}
	for _, id := range []string{k("new1"), k("twice"), k("new2")} {
		if ran[id] != 1 || !confirmed(t, s, id) {
			t.Errorf("%q: ran %d times, confirmed %v; want once and confirmed", id, ran[id], confirmed(t, s, id))
		}
	}
	if ran[k("done")] != 0 || ran[k("held")] != 0 {
		t.Errorf("duplicate ran %d, held ran %d; want neither run", ran[k("done")], ran[k("held")])
	}
	if _, err := s.Lookup(ctx, k("bad")); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("failed message's claim: Lookup = %v; want ErrNotFound (forgotten)", err)
	}
	if !ev.has(consumer.DuplicateSkipped) || !ev.has(consumer.InProgress) {
		t.Errorf("hook saw %v; want duplicate_skipped and in_progress", ev.kinds())
	}
	if _, isB := b.asStore().(idem.Batcher); isB {
		// The repeated key's second message is answered from the first's
		// outcome, confirmed: a duplicate, with no claim of its own.
		if c, f := b.count("claim_batch"), b.count("confirm_batch"); c != 1 || f != 1 || b.count("claim") != 0 {
			t.Errorf("batcher store: %d ClaimBatch, %d ConfirmBatch, %d Claim; want 1 ClaimBatch (the repeat follows its first message), 1 ConfirmBatch, no single claims",
				c, f, b.count("claim"))
		}
	} else if n := b.count("claim"); n != 6 {
		t.Errorf("plain store: %d Claims (of %d store calls since the start); want 6, one per distinct keyed message", n, b.total()-before)
	}
}

func isNil(err error) bool { return err == nil }
func is(target error) func(error) bool {
	return func(err error) bool { return errors.Is(err, target) }
}

// asStore returns the spy as a Batcher when its store is one.
func (s *spyStore) asStore() idem.Store {
	if _, ok := s.Store.(idem.Batcher); ok {
		return spyBatcher{s}
	}
	return s
}

func TestBatchMemory(t *testing.T) {
	s := memStore(idem.Options{})
	batchCase(t, s, spy(s))
}

func TestBatchPlainStore(t *testing.T) {
	s := memStore(idem.Options{})
	// Hiding the Batcher methods: the batch form claims one by one.
	batchCase(t, s, spy(struct{ idem.Store }{s}))
}

func TestBatchMiniredis(t *testing.T) {
	srv := miniredis.RunT(t)
	s, err := idem.NewRedisStore(redis.NewClient(&redis.Options{Addr: srv.Addr()}), idem.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	batchCase(t, s, spy(s))
}

func TestBatchConcurrencyBound(t *testing.T) {
	s := memStore(idem.Options{})
	var now, peak atomic.Int64
	h := consumer.Batch(s, msgKey, func(context.Context, msg) error {
		n := now.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(5 * time.Millisecond)
		now.Add(-1)
		return nil
	}, consumer.Options[msg]{Concurrency: 3})
	ms := make([]msg, 30)
	for i := range ms {
		ms[i] = msg{ID: uniq(t, string(rune('a'+i)))}
	}
	for i, err := range h(context.Background(), ms) {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	if p := peak.Load(); p > 3 || p < 2 {
		t.Fatalf("peak concurrency %d; want at most 3 (and more than 1: the batch runs in parallel)", p)
	}
}

func TestBatchPanicSettlesThenReraises(t *testing.T) {
	ctx := context.Background()
	s := memStore(idem.Options{})
	h := consumer.Batch(s, msgKey, func(_ context.Context, m msg) error {
		if m.Body == "panic" {
			panic("kaput")
		}
		return nil
	})
	func() {
		defer func() {
			if v := recover(); v != "kaput" {
				t.Fatalf("recovered %v; want the handler's panic re-raised", v)
			}
		}()
		h(ctx, []msg{{ID: "ok"}, {ID: "p", Body: "panic"}})
		t.Fatal("Batch returned; want the panic re-raised")
	}()
	if !confirmed(t, s, "ok") {
		t.Fatal("the batch's successful message was not confirmed before the panic was re-raised")
	}
	if _, err := s.Lookup(ctx, "p"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("panicked message: Lookup = %v; want ErrNotFound (forgotten)", err)
	}
}

func TestBatchConfirmRetriesOnlyFailed(t *testing.T) {
	ctx := context.Background()
	sp := spy(memStore(idem.Options{}))
	sp.setFail("confirm_batch", func(n int) error {
		if n == 1 {
			return errDown
		}
		return nil
	})
	h := consumer.Batch(sp.asStore(), msgKey, func(context.Context, msg) error { return nil })
	errs := h(ctx, []msg{{ID: "a"}, {ID: "b"}})
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("results %v; want nil after a retried ConfirmBatch", errs)
	}
	if n := sp.count("confirm_batch"); n != 2 {
		t.Fatalf("ConfirmBatch called %d times; want 2 (one failure, one retry)", n)
	}

	sp.setFail("confirm_batch", func(int) error { return errDown })
	h = consumer.Batch(sp.asStore(), msgKey, func(context.Context, msg) error { return nil },
		consumer.Options[msg]{ConfirmBudget: 50 * time.Millisecond})
	errs = h(ctx, []msg{{ID: "c"}})
	if !errors.Is(errs[0], consumer.ErrNotRecorded) {
		t.Fatalf("ConfirmBatch never succeeding: %v; want ErrNotRecorded", errs[0])
	}
}

func TestBatchClaimFails(t *testing.T) {
	sp := spy(memStore(idem.Options{}))
	sp.setFail("claim_batch", func(int) error { return errDown })
	ran := false
	h := consumer.Batch(sp.asStore(), msgKey, func(context.Context, msg) error { ran = true; return nil })
	errs := h(context.Background(), []msg{{ID: "a"}, {ID: "b"}})
	if !errors.Is(errs[0], errDown) || !errors.Is(errs[1], errDown) || ran {
		t.Fatalf("ClaimBatch failing: results %v, ran %v; want the store's error for each and no run", errs, ran)
	}
}

func TestBatchKeepsWaitingLeasesAlive(t *testing.T) {
	ctx := context.Background()
	s := memStore(idem.Options{LeaseTTL: idem.MinLeaseTTL})
	var ev events
	h := consumer.Batch(s, msgKey, func(context.Context, msg) error {
		time.Sleep(30 * time.Millisecond)
		return nil
	}, consumer.Options[msg]{Concurrency: 1, Hook: ev.hook})
	// Run one at a time, the last message waits 150ms for its turn: more
	// than its 60ms lease, which must be renewed meanwhile.
	ms := []msg{{ID: "a"}, {ID: "b"}, {ID: "c"}, {ID: "d"}, {ID: "e"}, {ID: "f"}}
	for i, err := range h(ctx, ms) {
		if err != nil {
			t.Errorf("message %d: %v", i, err)
		}
	}
	if k := ev.kinds(); len(k) != 0 {
		t.Fatalf("hook saw %v; want no lost leases while messages wait for a slot", k)
	}
}

func TestBatchLeaseLost(t *testing.T) {
	ctx := context.Background()
	s := memStore(idem.Options{LeaseTTL: idem.MinLeaseTTL})
	var ev events
	var cause error
	h := consumer.Batch(s, msgKey, func(ctx context.Context, m msg) error {
		if m.Body != "lose" {
			return nil
		}
		l, _ := idem.LeaseFrom(ctx)
		_ = s.Forget(context.Background(), l)
		<-ctx.Done()
		cause = context.Cause(ctx)
		return errHandler
	}, consumer.Options[msg]{Hook: ev.hook})
	errs := h(ctx, []msg{{ID: "x", Body: "lose"}, {ID: "y"}})
	if !errors.Is(cause, idem.ErrLeaseLost) || !errors.Is(errs[0], errHandler) || errs[1] != nil {
		t.Fatalf("cause %v, results %v; want ErrLeaseLost as the cause, the handler's error, and nil", cause, errs)
	}
	if !ev.has(consumer.LeaseLost) {
		t.Fatalf("hook saw %v; want lease_lost", ev.kinds())
	}
}

func TestBatchOversizedKeyFailsAlone(t *testing.T) {
	s := memStore(idem.Options{MaxKeyBytes: 16})
	h := consumer.Batch(s, msgKey, func(context.Context, msg) error { return nil })
	errs := h(context.Background(), []msg{{ID: "ok-1"}, {ID: strings.Repeat("x", 17)}, {ID: "ok-2"}})
	if errs[0] != nil || !errors.Is(errs[1], idem.ErrInvalidKey) || errs[2] != nil {
		t.Fatalf("results %v; want only the oversized key to fail (ErrInvalidKey), not the whole batch", errs)
	}
}

// In a batch too, a message whose Confirm finds another delivery's
// confirmation kept is done (nil), reported to the hook, and the rest of
// the batch is unaffected; on a Batcher (per item of ConfirmBatch) and on a
// plain store.
func TestBatchAlreadyConfirmed(t *testing.T) {
	for name, s := range map[string]idem.Store{
		"batcher": memStore(idem.Options{LeaseTTL: idem.MinLeaseTTL}),
		"plain":   struct{ idem.Store }{memStore(idem.Options{LeaseTTL: idem.MinLeaseTTL})},
	} {
		t.Run(name, func(t *testing.T) {
			var ev events
			h := consumer.Batch(s, msgKey, func(ctx context.Context, m msg) error {
				if m.Body == "twice" {
					takeOver(t, ctx, s)
				}
				return nil
			}, consumer.Options[msg]{Hook: ev.hook})
			errs := h(context.Background(), []msg{{ID: "a"}, {ID: "b", Body: "twice"}, {ID: "c"}})
			if errs[0] != nil || errs[1] != nil || errs[2] != nil {
				t.Fatalf("results %v; want all nil (done)", errs)
			}
			if !ev.has(consumer.AlreadyConfirmed) || ev.has(consumer.ConfirmFailed) || ev.has(consumer.LateConfirm) {
				t.Fatalf("hook saw %v; want already_confirmed, not confirm_failed or late_confirm", ev.kinds())
			}
			for _, id := range []string{"a", "b", "c"} {
				if !confirmed(t, s, id) {
					t.Errorf("%q not confirmed", id)
				}
			}
		})
	}
}

// lostReplies is a Batcher whose first ConfirmBatch records every lease
// but answers item 0 as confirmed by another lease first (for good) and
// the others as failed (their replies lost, worth another attempt).
type lostReplies struct {
	*idem.MemoryStore
	calls atomic.Int64
}

func (s *lostReplies) ConfirmBatch(ctx context.Context, ls []*idem.Lease, rs [][]byte) error {
	err := s.MemoryStore.ConfirmBatch(ctx, ls, rs)
	if s.calls.Add(1) > 1 || err != nil {
		return err
	}
	be := &idem.BatchError{Errs: make([]error, len(ls))}
	be.Errs[0] = fmt.Errorf("%w: test", idem.ErrAlreadyConfirmed)
	for i := 1; i < len(ls); i++ {
		be.Errs[i] = errDown
	}
	return be
}

// One item's final answer does not end the retries of the others: the
// items whose confirmation failed for a reason another attempt may mend
// are sent again.
func TestBatchConfirmRetriesPastAFinalItem(t *testing.T) {
	s := &lostReplies{MemoryStore: memStore(idem.Options{})}
	var ev events
	h := consumer.Batch(s, msgKey, func(context.Context, msg) error { return nil },
		consumer.Options[msg]{Hook: ev.hook, ConfirmBudget: time.Second})
	errs := h(context.Background(), []msg{{ID: "a"}, {ID: "b"}, {ID: "c"}})
	for i, err := range errs {
		if err != nil {
			t.Errorf("result %d = %v; want nil (a: already confirmed; b, c: confirmed on the retry)", i, err)
		}
	}
	if n := s.calls.Load(); n != 2 {
		t.Errorf("ConfirmBatch called %d times; want 2 (the retry of b and c)", n)
	}
	if got := ev.kinds(); !slices.Equal(got, []consumer.Kind{consumer.AlreadyConfirmed}) {
		t.Errorf("hook saw %v; want [already_confirmed]", got)
	}
}

// A batch that repeats keys runs each key's work once and settles every
// message: a later message of a key finds the earlier one's outcome
// (Duplicate once it is confirmed; Claimed again, and run, after it
// failed), never InProgress held by its own batch. With an Observer, each
// message gets its own event with that outcome.
func TestBatchRepeatedKeys(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func(idem.Store) idem.Store
	}{
		{"batcher", func(s idem.Store) idem.Store { return s }},
		{"plain", func(s idem.Store) idem.Store { return struct{ idem.Store }{s} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := memStore(idem.Options{})
			obs := &obstest.Log{}
			var mu sync.Mutex
			ran := map[string]int{}
			h := consumer.Batch(tc.store(s), msgKey, func(_ context.Context, m msg) error {
				mu.Lock()
				defer mu.Unlock()
				ran[m.ID]++
				// "flaky" fails its first run only: its next message
				// must run it again.
				if m.ID == uniq(t, "flaky") && ran[m.ID] == 1 {
					return errHandler
				}
				return nil
			}, consumer.Options[msg]{Concurrency: 4, Observer: obs})
			a, b, c, flaky := uniq(t, "a"), uniq(t, "b"), uniq(t, "c"), uniq(t, "flaky")
			ms := []msg{{ID: a}, {ID: b}, {ID: a}, {ID: flaky}, {ID: a}, {ID: c}, {ID: b}, {ID: flaky}, {ID: flaky}}
			errs := h(context.Background(), ms)
			want := []error{nil, nil, nil, errHandler, nil, nil, nil, nil, nil}
			for i, err := range errs {
				if !errors.Is(err, want[i]) || (want[i] == nil && err != nil) {
					t.Errorf("Batch: result %d (%q) = %v; want %v", i, ms[i].ID, err, want[i])
				}
			}
			for _, k := range []string{a, b, c} {
				if ran[k] != 1 || !confirmed(t, s, k) {
					t.Errorf("%q: ran %d times, confirmed %v; want once, confirmed", k, ran[k], confirmed(t, s, k))
				}
			}
			if ran[flaky] != 2 || !confirmed(t, s, flaky) {
				t.Errorf("%q (fails once): ran %d times, confirmed %v; want twice (again after the failure), confirmed",
					flaky, ran[flaky], confirmed(t, s, flaky))
			}
			got := obs.Of(idem.OpMessage)
			if len(got) != len(ms) {
				t.Fatalf("%d message events; want %d, one per message", len(got), len(ms))
			}
			outcomes := make(map[idem.Outcome]int)
			for _, e := range got {
				if e.Err != nil {
					t.Errorf("message event %+v; want no error (handler failures are not the store's)", e)
				}
				outcomes[e.Outcome]++
			}
			// Claimed: a, b, c, flaky twice; Duplicate: a twice, b, flaky.
			if outcomes[idem.Claimed] != 5 || outcomes[idem.Duplicate] != 4 {
				t.Errorf("message outcomes %v; want 5 Claimed, 4 Duplicate", outcomes)
			}
		})
	}
}

// A handler's panic in the first round re-raises after that round is
// settled; the repeated key's later message was never claimed, so the key
// is free for the redelivery.
func TestBatchRepeatedKeysPanic(t *testing.T) {
	s := memStore(idem.Options{})
	boom, other := uniq(t, "boom"), uniq(t, "other")
	ran := 0
	h := consumer.Batch(s, msgKey, func(_ context.Context, m msg) error {
		if m.ID == boom {
			ran++
			panic("boom")
		}
		return nil
	})
	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Errorf("Batch: recovered %v; want the handler's panic", v)
			}
		}()
		h(context.Background(), []msg{{ID: boom}, {ID: other}, {ID: boom}})
	}()
	if ran != 1 {
		t.Errorf("panicking handler ran %d times; want once (later rounds are not run)", ran)
	}
	if !confirmed(t, s, other) {
		t.Errorf("%q: not confirmed; want its round settled despite the panic", other)
	}
	if _, err := s.Lookup(context.Background(), boom); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Lookup(%q) = %v; want ErrNotFound (the panicking claim forgotten)", boom, err)
	}
}

// A repeated key whose first message's work was done but not recorded
// gives its later messages that answer (ack and alert), unclaimed: claimed,
// they would find the key in progress and be redelivered, to run the work
// again once the lease ran out.
func TestBatchRepeatedKeyNotRecorded(t *testing.T) {
	sp := spy(memStore(idem.Options{}))
	sp.setFail("confirm_batch", func(int) error { return errDown })
	k := uniq(t, "k")
	ran := 0
	h := consumer.Batch(sp.asStore(), msgKey, func(context.Context, msg) error { ran++; return nil },
		consumer.Options[msg]{ConfirmBudget: 50 * time.Millisecond})
	errs := h(context.Background(), []msg{{ID: k}, {ID: k}})
	for i, err := range errs {
		if a := consumer.ActionFor(err); a != consumer.AckAndAlert {
			t.Errorf("message %d: %v (%v); want ErrNotRecorded, ack and alert", i, err, a)
		}
	}
	if ran != 1 {
		t.Errorf("handler ran %d times; want once", ran)
	}
}

// A key's later messages in a batch follow its first message's outcome
// without a claim of their own when that outcome is what their claim would
// find: done (a duplicate, acked), held by another delivery (redelivered
// with it). Other outcomes (a handler failure, even one that wraps
// idem.ErrInProgress; a different fingerprint) leave them to a claim round
// of their own, as before.
func TestBatchRepeatFollowsFirst(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func(*spyStore) idem.Store
		claim string // the op that counts claim calls
	}{
		{"batcher", func(s *spyStore) idem.Store { return s.asStore() }, "claim_batch"},
		{"plain", func(s *spyStore) idem.Store { return s }, "claim"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Run("done", func(t *testing.T) {
				s := memStore(idem.Options{})
				sp := spy(s)
				if tc.name == "plain" {
					sp = spy(struct{ idem.Store }{s})
				}
				var ev events
				obs := &obstest.Log{}
				var mu sync.Mutex
				ran := map[string]int{}
				h := consumer.Batch(tc.store(sp), msgKey, func(_ context.Context, m msg) error {
					mu.Lock()
					defer mu.Unlock()
					ran[m.ID]++
					return nil
				}, consumer.Options[msg]{Hook: ev.hook, Observer: obs, Concurrency: 4})
				a, b := uniq(t, "a"), uniq(t, "b")
				ms := []msg{{ID: a}, {ID: b}, {ID: a}, {ID: a}}
				for i, err := range h(context.Background(), ms) {
					if err != nil {
						t.Errorf("message %d (%q): %v; want nil (done, or a duplicate of the done first message)", i, ms[i].ID, err)
					}
				}
				if ran[a] != 1 || ran[b] != 1 || !confirmed(t, s, a) || !confirmed(t, s, b) {
					t.Errorf("ran a %d, b %d times; want once each, both confirmed", ran[a], ran[b])
				}
				want := 2 // a and b
				if tc.claim == "claim_batch" {
					want = 1
				}
				if n := sp.count(tc.claim); n != want {
					t.Errorf("%d %s calls; want %d: a's repeats are not claimed", n, tc.claim, want)
				}
				r, err := s.Lookup(context.Background(), a)
				if err != nil {
					t.Fatal(err)
				}
				dups := 0
				for _, e := range ev.es {
					if e.Kind == consumer.DuplicateSkipped {
						dups++
						if e.Token != r.Token {
							t.Errorf("duplicate_skipped token %d; want the confirmation's, %d", e.Token, r.Token)
						}
					}
				}
				if dups != 2 {
					t.Errorf("hook saw %v; want two duplicate_skipped, one per repeat", ev.kinds())
				}
				outcomes := map[idem.Outcome]int{}
				for _, e := range obs.Of(idem.OpMessage) {
					outcomes[e.Outcome]++
				}
				if outcomes[idem.Claimed] != 2 || outcomes[idem.Duplicate] != 2 {
					t.Errorf("message outcomes %v; want 2 Claimed, 2 Duplicate", outcomes)
				}
			})
			t.Run("held", func(t *testing.T) {
				s := memStore(idem.Options{})
				sp := spy(s)
				if tc.name == "plain" {
					sp = spy(struct{ idem.Store }{s})
				}
				k := uniq(t, "k")
				if cl, err := s.Claim(context.Background(), k, nil); err != nil || cl.Outcome != idem.Claimed {
					t.Fatalf("Claim = %v, %v", cl.Outcome, err)
				}
				ran := 0
				h := consumer.Batch(tc.store(sp), msgKey, func(context.Context, msg) error { ran++; return nil })
				for i, err := range h(context.Background(), []msg{{ID: k}, {ID: k}}) {
					if a := consumer.ActionFor(err); !errors.Is(err, idem.ErrInProgress) || a != consumer.Redeliver {
						t.Errorf("message %d: %v (%v); want ErrInProgress, redelivered", i, err, a)
					}
				}
				if ran != 0 || sp.count(tc.claim) != 1 {
					t.Errorf("ran %d times, %d %s calls; want not run, one claim", ran, sp.count(tc.claim), tc.claim)
				}
			})
			t.Run("failed", func(t *testing.T) {
				s := memStore(idem.Options{})
				sp := spy(s)
				if tc.name == "plain" {
					sp = spy(struct{ idem.Store }{s})
				}
				k := uniq(t, "k")
				ran := 0
				// The first run fails with an error that wraps ErrInProgress
				// (say, a nested call found its own key held): that is the
				// handler's failure, not the key held by another delivery, so
				// the repeat is claimed and run again.
				h := consumer.Batch(tc.store(sp), msgKey, func(context.Context, msg) error {
					if ran++; ran == 1 {
						return fmt.Errorf("nested: %w", idem.ErrInProgress)
					}
					return nil
				})
				errs := h(context.Background(), []msg{{ID: k}, {ID: k}})
				if !errors.Is(errs[0], idem.ErrInProgress) || errs[1] != nil {
					t.Errorf("results %v; want the handler's failure, then nil (run again)", errs)
				}
				if ran != 2 || !confirmed(t, s, k) || sp.count(tc.claim) != 2 {
					t.Errorf("ran %d times, confirmed %v, %d %s calls; want twice, confirmed, two claims",
						ran, confirmed(t, s, k), sp.count(tc.claim), tc.claim)
				}
			})
			t.Run("fingerprint", func(t *testing.T) {
				s := memStore(idem.Options{})
				sp := spy(s)
				if tc.name == "plain" {
					sp = spy(struct{ idem.Store }{s})
				}
				k := uniq(t, "k")
				ran := 0
				h := consumer.Batch(tc.store(sp), msgKey, func(context.Context, msg) error { ran++; return nil },
					consumer.Options[msg]{Fingerprint: func(m msg) []byte { return []byte(m.Body) }})
				errs := h(context.Background(), []msg{{ID: k, Body: "x"}, {ID: k, Body: "x"}, {ID: k, Body: "y"}})
				if errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], idem.ErrFingerprintMismatch) {
					t.Errorf("results %v; want nil, nil (same content: a duplicate), ErrFingerprintMismatch (other content)", errs)
				}
				if want := map[string]int{"claim_batch": 2, "claim": 2}[tc.claim]; ran != 1 || sp.count(tc.claim) != want {
					t.Errorf("ran %d times, %d %s calls; want once, %d (the other content is claimed)", ran, sp.count(tc.claim), tc.claim, want)
				}
			})
		})
	}
}
