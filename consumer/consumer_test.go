package consumer_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/internal/regrant"
	"github.com/idemgo/idem/internal/testing/obstest"
	"github.com/redis/go-redis/v9"
)

func TestIdempotentOnceThenDuplicate(t *testing.T) {
	ctx := context.Background()
	s := memStore(idem.Options{})
	var ev events
	var runs atomic.Int64
	var token int64
	h := consumer.Idempotent(s, msgKey, func(ctx context.Context, m msg) error {
		l, ok := idem.LeaseFrom(ctx)
		if !ok || l.Key != m.ID {
			t.Errorf("LeaseFrom(handler ctx) = %v, %v; want the lease of %q", l, ok, m.ID)
		} else {
			token = l.Token
		}
		runs.Add(1)
		return nil
	}, consumer.Options[msg]{Hook: ev.hook})

	m := msg{ID: "m1"}
	if err := h(ctx, m); err != nil {
		t.Fatalf("first delivery: %v; want nil", err)
	}
	if err := h(ctx, m); err != nil {
		t.Fatalf("second delivery: %v; want nil (duplicate)", err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times for two deliveries of one message; want 1", n)
	}
	if !confirmed(t, s, "m1") {
		t.Fatal("m1 not confirmed after a successful delivery")
	}
	if got := ev.kinds(); !slices.Equal(got, []consumer.Kind{consumer.DuplicateSkipped}) {
		t.Fatalf("hook saw %v; want [duplicate_skipped]", got)
	}
	if ev.es[0].Token != token || ev.es[0].KeyHash != idem.KeyHash("m1") {
		t.Fatalf("duplicate event = %+v; want token %d and the key's hash", ev.es[0], token)
	}
	if _, ok := idem.LeaseFrom(ctx); ok {
		t.Fatal("LeaseFrom(background) reported a lease")
	}
}

func TestIdempotentErrorForgets(t *testing.T) {
	ctx := context.Background()
	s := memStore(idem.Options{})
	boom := errors.New("boom")
	var runs atomic.Int64
	h := consumer.Idempotent(s, msgKey, func(ctx context.Context, m msg) error {
		if runs.Add(1) == 1 {
			return boom
		}
		return nil
	})
	if err := h(ctx, msg{ID: "m"}); !errors.Is(err, boom) {
		t.Fatalf("failing handler: got %v; want the handler's error", err)
	}
	if _, err := s.Lookup(ctx, "m"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Lookup after a failure = %v; want ErrNotFound (the claim forgotten so a redelivery runs at once)", err)
	}
	if err := h(ctx, msg{ID: "m"}); err != nil {
		t.Fatalf("redelivery: %v; want nil", err)
	}
	if runs.Load() != 2 || !confirmed(t, s, "m") {
		t.Fatalf("runs = %d, confirmed = %v; want 2 runs and a confirmation", runs.Load(), confirmed(t, s, "m"))
	}
}

func TestIdempotentPanicForgetsAndReraises(t *testing.T) {
	ctx := context.Background()
	s := memStore(idem.Options{})
	h := consumer.Idempotent(s, msgKey, func(ctx context.Context, m msg) error { panic("kaput") })
	func() {
		defer func() {
			if v := recover(); v != "kaput" {
				t.Fatalf("recovered %v; want the handler's panic value re-raised", v)
			}
		}()
		_ = h(ctx, msg{ID: "p"})
		t.Fatal("the wrapper returned; want the panic re-raised")
	}()
	if _, err := s.Lookup(ctx, "p"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Lookup after a panic = %v; want ErrNotFound (claim forgotten)", err)
	}
}

func TestIdempotentInProgress(t *testing.T) {
	ctx := context.Background()
	s := memStore(idem.Options{})
	var ev events
	held, _ := s.Claim(ctx, "busy", nil)
	ran := false
	h := consumer.Idempotent(s, msgKey, func(context.Context, msg) error { ran = true; return nil }, consumer.Options[msg]{Hook: ev.hook})
	err := h(ctx, msg{ID: "busy"})
	if !errors.Is(err, idem.ErrInProgress) || ran {
		t.Fatalf("delivery of a held key: err %v, ran %v; want ErrInProgress without running", err, ran)
	}
	// One form for a key's hash in every error: key#<hash>, as the stores write it.
	if !strings.Contains(err.Error(), "key#") {
		t.Errorf("error %q; want the key named key#<hash>, as the stores name it", err)
	}
	if !ev.has(consumer.InProgress) || ev.es[0].Token != held.Lease.Token {
		t.Fatalf("hook saw %+v; want in_progress with the holder's token %d", ev.es, held.Lease.Token)
	}
}

func TestIdempotentStoreErrorAndBadKey(t *testing.T) {
	ctx := context.Background()
	s := spy(memStore(idem.Options{}))
	ran := false
	h := consumer.Idempotent(s, msgKey, func(context.Context, msg) error { ran = true; return nil })

	if err := h(ctx, msg{ID: ""}); !errors.Is(err, idem.ErrInvalidKey) {
		t.Fatalf("empty key: %v; want ErrInvalidKey", err)
	}
	if n := s.total(); n != 0 || ran {
		t.Fatalf("empty key: %d store calls, ran %v; want none before the key is checked", n, ran)
	}
	s.setFail("claim", func(int) error { return errDown })
	if err := h(ctx, msg{ID: "x"}); !errors.Is(err, errDown) || ran {
		t.Fatalf("store down: err %v, ran %v; want the store's error and no run", err, ran)
	}
}

func TestIdempotentLeaseLost(t *testing.T) {
	ctx := context.Background()
	s := memStore(idem.Options{LeaseTTL: idem.MinLeaseTTL})
	var ev events
	var cause error
	h := consumer.Idempotent(s, msgKey, func(ctx context.Context, m msg) error {
		l, _ := idem.LeaseFrom(ctx)
		steal(t, s, l) // taken away behind the handler's back
		<-ctx.Done()
		cause = context.Cause(ctx)
		return nil // the work was done anyway
	}, consumer.Options[msg]{Hook: ev.hook})
	if err := h(ctx, msg{ID: "lost"}); err != nil {
		t.Fatalf("late success: %v; want nil (the work is confirmed late)", err)
	}
	if !errors.Is(cause, idem.ErrLeaseLost) {
		t.Fatalf("handler ctx cause = %v; want ErrLeaseLost", cause)
	}
	if got := ev.kinds(); !slices.Equal(got, []consumer.Kind{consumer.LeaseLost, consumer.LateConfirm}) {
		t.Fatalf("hook saw %v; want [lease_lost late_confirm]", got)
	}
	if !confirmed(t, s, "lost") {
		t.Fatal("a late success was not confirmed; the work happened and must be recorded")
	}
}

func TestIdempotentConfirmRetried(t *testing.T) {
	ctx := context.Background()
	s := spy(memStore(idem.Options{}))
	s.setFail("confirm", func(n int) error {
		if n < 3 {
			return errDown
		}
		return nil
	})
	h := consumer.Idempotent(s, msgKey, func(context.Context, msg) error { return nil })
	if err := h(ctx, msg{ID: "r"}); err != nil {
		t.Fatalf("confirm failing twice: %v; want nil after retries", err)
	}
	if n := s.count("confirm"); n != 3 || !confirmed(t, s, "r") {
		t.Fatalf("Confirm called %d times, confirmed %v; want 3 and true", n, confirmed(t, s, "r"))
	}
}

func TestIdempotentConfirmFails(t *testing.T) {
	ctx := context.Background()
	s := spy(memStore(idem.Options{}))
	s.setFail("confirm", func(int) error { return errDown })
	var ev events
	h := consumer.Idempotent(s, msgKey, func(context.Context, msg) error { return nil },
		consumer.Options[msg]{Hook: ev.hook, ConfirmBudget: 80 * time.Millisecond})
	start := time.Now()
	err := h(ctx, msg{ID: "f"})
	if !errors.Is(err, consumer.ErrNotRecorded) || !errors.Is(err, errDown) {
		t.Fatalf("confirm never succeeding: %v; want ErrNotRecorded wrapping the store's error (never success)", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("gave up after %v; want within the 80ms budget", took)
	}
	if n := s.count("confirm"); n < 2 || !ev.has(consumer.ConfirmFailed) {
		t.Fatalf("Confirm tried %d times, hook %v; want retries and confirm_failed", n, ev.kinds())
	}
}

func TestIdempotentConfirmDetachedFromCancel(t *testing.T) {
	s := memStore(idem.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	h := consumer.Idempotent(s, msgKey, func(context.Context, msg) error {
		cancel() // the consumer shuts down after the work is done
		return nil
	})
	if err := h(ctx, msg{ID: "c"}); err != nil {
		t.Fatalf("cancelled after the work: %v; want nil", err)
	}
	if !confirmed(t, s, "c") {
		t.Fatal("work done before a cancellation was not confirmed; a redelivery would do it again")
	}
}

func TestIdempotentFingerprint(t *testing.T) {
	ctx := context.Background()
	s := memStore(idem.Options{})
	h := consumer.Idempotent(s, msgKey, func(context.Context, msg) error { return nil },
		consumer.Options[msg]{Fingerprint: func(m msg) []byte { return []byte(m.Body) }})
	if err := h(ctx, msg{ID: "k", Body: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := h(ctx, msg{ID: "k", Body: "a"}); err != nil {
		t.Fatalf("same key, same body: %v; want nil (duplicate)", err)
	}
	if err := h(ctx, msg{ID: "k", Body: "b"}); !errors.Is(err, idem.ErrFingerprintMismatch) {
		t.Fatalf("same key, other body: %v; want ErrFingerprintMismatch", err)
	}
	// Claim decides, by the store's rule: a record made without a
	// fingerprint is not compared, so the key held without one is in
	// progress, not a mismatch.
	if _, err := s.Claim(ctx, "bare", nil); err != nil {
		t.Fatal(err)
	}
	if err := h(ctx, msg{ID: "bare", Body: "a"}); !errors.Is(err, idem.ErrInProgress) || errors.Is(err, idem.ErrFingerprintMismatch) {
		t.Fatalf("key held without a fingerprint: %v; want ErrInProgress only", err)
	}
}

// A fingerprint mismatch is reported with the outcome of the claim that
// found it (done, or in flight), as a conflict, and runs nothing: for Batch
// per item, whether the store claims the batch in one call or not.
func TestFingerprintMismatchObserved(t *testing.T) {
	for name, open := range map[string]func(t *testing.T) idem.Store{
		"memory": func(*testing.T) idem.Store { return memStore(idem.Options{}) },
		"plain":  func(*testing.T) idem.Store { return struct{ idem.Store }{memStore(idem.Options{})} },
		"miniredis": func(t *testing.T) idem.Store {
			s, err := idem.NewRedisStore(redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()}), idem.RedisOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	} {
		t.Run(name, func(t *testing.T) { fingerprintMismatchObserved(t, open(t)) })
	}
}

func fingerprintMismatchObserved(t *testing.T, s idem.Store) {
	ctx := context.Background()
	obs := &obstest.Log{}
	ran := 0
	o := consumer.Options[msg]{Observer: obs, Fingerprint: func(m msg) []byte { return []byte(m.Body) }}
	h := consumer.Idempotent(s, msgKey, func(context.Context, msg) error { ran++; return nil }, o)
	b := consumer.Batch(s, msgKey, func(context.Context, msg) error { ran++; return nil }, o)
	if err := h(ctx, msg{ID: "done", Body: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, "held", []byte("a")); err != nil {
		t.Fatal(err)
	}
	obs.Reset()
	for _, m := range []msg{{ID: "done", Body: "b"}, {ID: "held", Body: "b"}} {
		if err := h(ctx, m); !errors.Is(err, idem.ErrFingerprintMismatch) {
			t.Errorf("Idempotent(%q, other body) = %v; want ErrFingerprintMismatch", m.ID, err)
		}
	}
	for i, err := range b(ctx, []msg{{ID: "done", Body: "b"}, {ID: "held", Body: "b"}, {ID: "new", Body: "b"}}) {
		if want := i < 2; errors.Is(err, idem.ErrFingerprintMismatch) != want {
			t.Errorf("Batch item %d = %v; want a mismatch %v", i, err, want)
		}
	}
	got := obs.Of(idem.OpMessage)
	if len(got) != 5 || ran != 2 {
		t.Fatalf("%d message events, %d runs; want 5 events and only the first and the new key run", len(got), ran)
	}
	for i, want := range []idem.Outcome{idem.Duplicate, idem.InProgress, idem.Duplicate, idem.InProgress, idem.Claimed} {
		class := idem.ClassConflict
		if want == idem.Claimed {
			class = idem.ClassNone
		}
		if got[i].Outcome != want || got[i].Class() != class {
			t.Errorf("event %d: %v class %q; want %v class %q", i, got[i].Outcome, got[i].Class(), want, class)
		}
	}
}

// Kind names are metric labels: snake case, as idem.Op and
// idem.ErrorClass name theirs.
func TestKindString(t *testing.T) {
	for k, want := range map[consumer.Kind]string{
		consumer.DuplicateSkipped: "duplicate_skipped",
		consumer.InProgress:       "in_progress",
		consumer.LeaseLost:        "lease_lost",
		consumer.LateConfirm:      "late_confirm",
		consumer.ConfirmFailed:    "confirm_failed",
		consumer.ForgetFailed:     "forget_failed",
		consumer.AlreadyConfirmed: "already_confirmed",
		0:                         "kind(0)",
		99:                        "kind(99)",
	} {
		if got := k.String(); got != want {
			t.Errorf("Kind(%d).String() = %q; want %q", uint8(k), got, want)
		}
	}
}

// takeOver, called in a handler, makes another delivery take the key over
// and confirm it, as one would after this lease ran out: the handler's own
// Confirm then finds the other's confirmation kept. It returns the other's
// token once the handler's context is cancelled for the lost lease. It may
// run on a handler's goroutine: it reports with t.Errorf.
func takeOver(t *testing.T, ctx context.Context, s idem.Store) int64 {
	t.Helper()
	bg := context.Background()
	l, _ := idem.LeaseFrom(ctx)
	steal(t, s, l)
	other, err := s.Claim(bg, l.Key, nil)
	if err != nil || other.Outcome != idem.Claimed {
		t.Errorf("Claim(%q) by another delivery = %v, %v; want claimed", l.Key, other.Outcome, err)
		return 0
	}
	if err := s.Confirm(bg, other.Lease, nil); err != nil {
		t.Errorf("Confirm(%q) by another delivery = %v", l.Key, err)
	}
	<-ctx.Done() // the renewal finds the lease gone
	return other.Lease.Token
}

// A handler that succeeded after another delivery's confirmation was kept
// is done, not failed: the wrapper returns nil (ack), tells the hook the
// work was done twice, and leaves the first confirmation in place.
func TestIdempotentAlreadyConfirmed(t *testing.T) {
	ctx := context.Background()
	s := memStore(idem.Options{LeaseTTL: idem.MinLeaseTTL})
	var ev events
	var mine, kept int64
	h := consumer.Idempotent(s, msgKey, func(ctx context.Context, m msg) error {
		l, _ := idem.LeaseFrom(ctx)
		mine = l.Token
		kept = takeOver(t, ctx, s)
		return nil
	}, consumer.Options[msg]{Hook: ev.hook})
	if err := h(ctx, msg{ID: "twice"}); err != nil {
		t.Fatalf("success after another's confirmation: %v; want nil (done: ack)", err)
	}
	if got := ev.kinds(); !slices.Equal(got, []consumer.Kind{consumer.LeaseLost, consumer.AlreadyConfirmed}) {
		t.Fatalf("hook saw %v; want [lease_lost already_confirmed]", got)
	}
	if e := ev.es[1]; e.Token != mine || !errors.Is(e.Err, idem.ErrAlreadyConfirmed) {
		t.Fatalf("already_confirmed event = %+v; want this delivery's token %d and ErrAlreadyConfirmed", e, mine)
	}
	if r, err := s.Lookup(ctx, "twice"); err != nil || !r.Confirmed || r.Token != kept {
		t.Fatalf("Lookup = %+v, %v; want the other delivery's confirmation (token %d) kept", r, err, kept)
	}
}

// memStore is idem.NewMemoryStore for tests, whose options are valid.
func memStore(o idem.Options) *idem.MemoryStore {
	return must(idem.NewMemoryStore(o))
}

// must returns v, or panics with err: for constructors given options a
// test knows are valid.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// steal deletes l's claim as a lease that ran out would vanish, without
// forgetting l itself (the handler never said its work failed): it
// forgets a copy of another lease of s, rewritten to be l.
func steal(t *testing.T, s idem.Store, l *idem.Lease) {
	t.Helper()
	bg := context.Background()
	donor, err := s.Claim(bg, "steal/"+l.Key, nil)
	if err != nil || donor.Outcome != idem.Claimed {
		t.Errorf("Claim of a donor key = %v, %v; want claimed", donor.Outcome, err)
		return
	}
	c := regrant.Lease(donor.Lease, l.Key, l.Token, l.Owner).(*idem.Lease)
	c.Fingerprint = l.Fingerprint
	if err := s.Forget(bg, c); err != nil {
		t.Errorf("Forget(%q) = %v", l.Key, err)
	}
}
