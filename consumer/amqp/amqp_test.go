package amqp_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	idemamqp "github.com/idemgo/idem/consumer/amqp"
	amqp091 "github.com/rabbitmq/amqp091-go"
)

// settlements records what Handler did with each delivery.
type settlements struct {
	mu sync.Mutex
	s  []idemamqp.Settlement
	ch chan idemamqp.Settlement
}

func newSettlements() *settlements { return &settlements{ch: make(chan idemamqp.Settlement, 100)} }

func (s *settlements) on(_ *amqp091.Delivery, st idemamqp.Settlement) {
	s.mu.Lock()
	s.s = append(s.s, st)
	s.mu.Unlock()
	s.ch <- st
}

func (s *settlements) next(t *testing.T) idemamqp.Settlement {
	t.Helper()
	select {
	case st := <-s.ch:
		return st
	case <-time.After(5 * time.Second):
		t.Fatal("no settlement within 5s")
	}
	return idemamqp.Settlement{}
}

// acker is an amqp091.Acknowledger that records calls.
type acker struct {
	mu    sync.Mutex
	calls []string
}

func (a *acker) record(s string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls = append(a.calls, s)
	return nil
}
func (a *acker) Ack(uint64, bool) error { return a.record("ack") }
func (a *acker) Nack(_ uint64, _ bool, requeue bool) error {
	if requeue {
		return a.record("nack-requeue")
	}
	return a.record("nack")
}
func (a *acker) Reject(_ uint64, requeue bool) error {
	if requeue {
		return a.record("reject-requeue")
	}
	return a.record("reject")
}

func (a *acker) last() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.calls) == 0 {
		return ""
	}
	return a.calls[len(a.calls)-1]
}

func delivery(a *acker, id string) amqp091.Delivery {
	return amqp091.Delivery{Acknowledger: a, MessageId: id, DeliveryTag: 1}
}

func TestHandlerSettlements(t *testing.T) {
	ctx := context.Background()
	store := memStore(idem.Options{})
	var logs bytes.Buffer
	st := newSettlements()
	fail := errors.New("handler failed")
	runs := map[string]int{}
	h := idemamqp.Handler(store, func(ctx context.Context, d amqp091.Delivery) error {
		runs[d.MessageId]++
		if string(d.Body) == "fail" {
			return fail
		}
		return nil
	}, idemamqp.Options{MinDelay: 10 * time.Millisecond, MaxDelay: 25 * time.Millisecond, OnSettle: st.on,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})

	a := &acker{}
	h(ctx, delivery(a, "m1"))
	if s := st.next(t); s.Action != idemamqp.Ack || a.last() != "ack" {
		t.Fatalf("first delivery: %v, broker saw %q; want ack", s.Action, a.last())
	}
	h(ctx, delivery(a, "m1"))
	if s := st.next(t); s.Action != idemamqp.Ack || runs["m1"] != 1 {
		t.Fatalf("duplicate: %v after %d runs; want ack without running again", s.Action, runs["m1"])
	}

	// No MessageId: rejected without requeue and logged, never acked as a duplicate.
	h(ctx, delivery(a, ""))
	if s := st.next(t); s.Action != idemamqp.Reject || a.last() != "reject" || runs[""] != 0 {
		t.Fatalf("no MessageId: %v, broker saw %q, ran %d; want reject without requeue and no run", s.Action, a.last(), runs[""])
	}
	if !strings.Contains(logs.String(), "rejected without requeue") {
		t.Fatalf("log = %q; want the rejection logged", logs.String())
	}

	// A failing handler: nacked with requeue after a growing, bounded delay.
	var delays []time.Duration
	for range 3 {
		d := delivery(a, "m2")
		d.Body = []byte("fail")
		h(ctx, d)
		s := st.next(t)
		if s.Action != idemamqp.Nack || !errors.Is(s.Err, fail) || a.last() != "nack-requeue" {
			t.Fatalf("failing handler: %+v, broker saw %q; want nack with requeue and the handler's error", s, a.last())
		}
		delays = append(delays, s.Delay)
	}
	want := []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 25 * time.Millisecond}
	for i := range want {
		if delays[i] != want[i] {
			t.Fatalf("requeue delays %v; want %v (doubling, bounded by MaxDelay)", delays, want)
		}
	}

	// In progress: nacked with requeue.
	if _, err := store.Claim(ctx, "m3", nil); err != nil {
		t.Fatal(err)
	}
	h(ctx, delivery(a, "m3"))
	if s := st.next(t); s.Action != idemamqp.Nack || !errors.Is(s.Err, idem.ErrInProgress) || runs["m3"] != 0 {
		t.Fatalf("in progress: %+v, ran %d; want nack with ErrInProgress, no run", s, runs["m3"])
	}
}

// A handler's success whose Confirm fails past its budget is acked and
// logged as an error, never requeued: a redelivery would claim the key once
// the lease runs out and do the work a second time.
func TestHandlerNotRecordedIsAcked(t *testing.T) {
	store := unconfirmable{memStore(idem.Options{})}
	st := newSettlements()
	var logs bytes.Buffer
	runs := 0
	h := idemamqp.Handler(store, func(context.Context, amqp091.Delivery) error { runs++; return nil },
		idemamqp.Options{OnSettle: st.on, Logger: slog.New(slog.NewTextHandler(&logs, nil)), ConfirmBudget: 20 * time.Millisecond})
	a := &acker{}
	h(context.Background(), delivery(a, "m"))
	s := st.next(t)
	if s.Action != idemamqp.Ack || !errors.Is(s.Err, consumer.ErrNotRecorded) {
		t.Fatalf("unrecorded work: %+v; want ack (redelivery would surely redo it) with ErrNotRecorded", s)
	}
	time.Sleep(2 * idemamqp.DefaultMinDelay) // a delayed Nack would have come by now
	a.mu.Lock()
	calls := append([]string(nil), a.calls...)
	a.mu.Unlock()
	if len(calls) != 1 || calls[0] != "ack" || runs != 1 {
		t.Fatalf("unrecorded work: broker saw %q after %d runs; want [ack] after 1, never a requeue", calls, runs)
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "not recorded") {
		t.Fatalf("log = %q; want the unrecorded work reported at error level", logs.String())
	}
}

// A fingerprint too large for any store never succeeds: rejected without
// requeue, like every error consumer.ActionFor dead-letters, not requeued
// forever.
func TestHandlerOversizedFingerprintIsRejected(t *testing.T) {
	st := newSettlements()
	runs := 0
	h := idemamqp.Handler(memStore(idem.Options{}), func(context.Context, amqp091.Delivery) error { runs++; return nil },
		idemamqp.Options{OnSettle: st.on, Logger: slog.New(slog.DiscardHandler),
			Fingerprint: func(*amqp091.Delivery) []byte { return make([]byte, idem.MaxFingerprintBytes+1) }})
	a := &acker{}
	h(context.Background(), delivery(a, "m"))
	if s := st.next(t); s.Action != idemamqp.Reject || !errors.Is(s.Err, idem.ErrTooLarge) || a.last() != "reject" || runs != 0 {
		t.Fatalf("oversized fingerprint: %+v, broker saw %q, ran %d; want reject without requeue, ErrTooLarge, no run",
			s, a.last(), runs)
	}
}

// Work whose confirmation lost to another delivery's is done: acked, and
// the hook hears it was done twice.
func TestHandlerAlreadyConfirmedIsAcked(t *testing.T) {
	store := confirmedElsewhere{memStore(idem.Options{})}
	st := newSettlements()
	var kinds []consumer.Kind
	h := idemamqp.Handler(store, func(context.Context, amqp091.Delivery) error { return nil },
		idemamqp.Options{OnSettle: st.on, Hook: func(_ context.Context, e consumer.Event) { kinds = append(kinds, e.Kind) }})
	a := &acker{}
	h(context.Background(), delivery(a, "m"))
	if s := st.next(t); s.Action != idemamqp.Ack || s.Err != nil || a.last() != "ack" {
		t.Fatalf("confirmed by another delivery first: %+v, broker saw %q; want a plain ack", s, a.last())
	}
	if len(kinds) != 1 || kinds[0] != consumer.AlreadyConfirmed {
		t.Fatalf("hook saw %v; want [already_confirmed]", kinds)
	}
}

// confirmedElsewhere is a store in which another lease always confirmed
// the key first.
type confirmedElsewhere struct{ idem.Store }

func (confirmedElsewhere) Confirm(_ context.Context, l *idem.Lease, _ []byte) error {
	return fmt.Errorf("%w: confirm of %s", idem.ErrAlreadyConfirmed, l.Key)
}

type unconfirmable struct{ idem.Store }

func (unconfirmable) Confirm(context.Context, *idem.Lease, []byte) error {
	return errors.New("store down")
}

func TestHandlerPanicNacks(t *testing.T) {
	store := memStore(idem.Options{})
	st := newSettlements()
	h := idemamqp.Handler(store, func(context.Context, amqp091.Delivery) error { panic("kaput") },
		idemamqp.Options{OnSettle: st.on})
	a := &acker{}
	func() {
		defer func() {
			if v := recover(); v != "kaput" {
				t.Fatalf("recovered %v; want the panic re-raised", v)
			}
		}()
		h(context.Background(), delivery(a, "p"))
	}()
	if s := st.next(t); s.Action != idemamqp.Nack || a.last() != "nack-requeue" {
		t.Fatalf("panic: %+v, broker saw %q; want an immediate nack with requeue", s, a.last())
	}
}

func TestHandlerNackDoesNotBlock(t *testing.T) {
	store := memStore(idem.Options{})
	st := newSettlements()
	const delay = 300 * time.Millisecond
	h := idemamqp.Handler(store, func(context.Context, amqp091.Delivery) error { return errors.New("fail") },
		idemamqp.Options{MinDelay: delay, OnSettle: st.on})
	start := time.Now()
	h(context.Background(), delivery(&acker{}, "slow"))
	returned := time.Since(start)
	st.next(t)
	settled := time.Since(start)
	if returned >= delay || settled < delay {
		t.Fatalf("Handler returned after %v, nacked after %v; want it to return at once and nack after the %v delay",
			returned, settled, delay)
	}
}

// Options.KeyHasher hashes the keys in the adapter's log lines and, through
// the wrapped handler, in its hook's events.
func TestHandlerKeyHasher(t *testing.T) {
	hasher, err := idem.NewKeyHasher([]byte("the fleet's shared secret"))
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	var hooked []string
	long := strings.Repeat("k", 2000) // over MaxKeyBytes: rejected
	st := newSettlements()
	h := idemamqp.Handler(memStore(idem.Options{}), func(context.Context, amqp091.Delivery) error { return nil },
		idemamqp.Options{OnSettle: st.on, Logger: slog.New(slog.NewTextHandler(&logs, nil)), KeyHasher: hasher,
			Key: func(d *amqp091.Delivery) string {
				if d.MessageId == "too-long" {
					return long
				}
				return d.MessageId
			},
			Hook: func(_ context.Context, e consumer.Event) { hooked = append(hooked, e.KeyHash) }})
	a := &acker{}
	ctx := context.Background()
	h(ctx, delivery(a, "too-long"))
	if s := st.next(t); s.Action != idemamqp.Reject {
		t.Fatalf("an oversized key: %v; want reject", s.Action)
	}
	for _, want := range []string{"key_hash=" + hasher.Hash(long), "message_id_hash=" + hasher.Hash("too-long")} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log %q lacks %s", logs.String(), want)
		}
	}
	h(ctx, delivery(a, "m"))
	h(ctx, delivery(a, "m")) // a duplicate: the hook hears of it
	st.next(t)
	st.next(t)
	if len(hooked) != 1 || hooked[0] != hasher.Hash("m") {
		t.Errorf("hook saw key hashes %v; want [%s]", hooked, hasher.Hash("m"))
	}
}

// Options.Fingerprint reaches the store: a second delivery of a key with
// other content is rejected without requeue, never acked as a duplicate.
func TestHandlerFingerprintMismatchRejected(t *testing.T) {
	st := newSettlements()
	runs := 0
	h := idemamqp.Handler(memStore(idem.Options{}), func(context.Context, amqp091.Delivery) error { runs++; return nil },
		idemamqp.Options{OnSettle: st.on, Logger: slog.New(slog.DiscardHandler),
			Fingerprint: func(d *amqp091.Delivery) []byte { return d.Body }})
	a := &acker{}
	for _, body := range []string{"a", "a", "b"} {
		d := delivery(a, "m")
		d.Body = []byte(body)
		h(context.Background(), d)
	}
	if s := st.next(t); s.Action != idemamqp.Ack {
		t.Fatalf("first delivery: %v; want ack", s.Action)
	}
	if s := st.next(t); s.Action != idemamqp.Ack || runs != 1 {
		t.Fatalf("same key, same body: %v after %d runs; want ack without running again", s.Action, runs)
	}
	if s := st.next(t); s.Action != idemamqp.Reject || !errors.Is(s.Err, idem.ErrFingerprintMismatch) || runs != 1 {
		t.Fatalf("same key, other body: %+v after %d runs; want reject with ErrFingerprintMismatch", s, runs)
	}
}

// A mistake in building the handler panics at once, in the caller's
// goroutine, naming what is wrong, rather than on the first delivery.
func TestHandlerMistakesPanic(t *testing.T) {
	store := memStore(idem.Options{})
	nop := func(context.Context, amqp091.Delivery) error { return nil }
	for _, tc := range []struct {
		name  string
		store idem.Store
		h     func(context.Context, amqp091.Delivery) error
		o     idemamqp.Options
		want  string
	}{
		{"valid", store, nop, idemamqp.Options{}, ""},
		{"nil store", nil, nop, idemamqp.Options{}, "amqp.Handler: nil store"},
		{"typed nil store", (*idem.RedisStore)(nil), nop, idemamqp.Options{}, "amqp.Handler: nil store"},
		{"nil handler", store, nil, idemamqp.Options{}, "amqp.Handler: nil handler"},
		{"negative MinDelay", store, nop, idemamqp.Options{MinDelay: -time.Second}, "amqp: MinDelay: -1s is negative; 0 means the default, 50ms"},
		{"negative MaxDelay", store, nop, idemamqp.Options{MaxDelay: -time.Second}, "amqp: MaxDelay: -1s is negative; 0 means the default, 5s"},
		{"negative ConfirmBudget", store, nop, idemamqp.Options{ConfirmBudget: -time.Second}, "amqp: ConfirmBudget: -1s is negative; 0 means the default, two thirds of the lease's TTL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := func() (msg string) {
				defer func() {
					if v := recover(); v != nil {
						msg = fmt.Sprint(v)
					}
				}()
				idemamqp.Handler(tc.store, tc.h, tc.o)
				return ""
			}()
			if got != tc.want {
				t.Errorf("Handler with %s: panic %q; want %q", tc.name, got, tc.want)
			}
		})
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

// quarantine crashes key's claim on s until s quarantines it: a message
// that killed every consumer that took it (s's MaxTakeOvers + 1 times).
func quarantine(t *testing.T, s idem.Store, key string, crashes int) {
	t.Helper()
	for range crashes {
		c, err := s.Claim(context.Background(), key, nil)
		if err != nil || c.Outcome != idem.Claimed {
			t.Fatalf("Claim(%q) = %v, %v; want Claimed", key, c.Outcome, err)
		}
		time.Sleep(c.Lease.TTL + 20*time.Millisecond) // the consumer died: the lease runs out
	}
}

// A quarantined message (its key's deliveries crashed more times in a row
// than MaxTakeOvers) is rejected without requeue, as consumer.ActionFor
// dead-letters it: the handler does not run, and no redelivery would.
func TestHandlerQuarantinedRejected(t *testing.T) {
	store := memStore(idem.Options{LeaseTTL: idem.MinLeaseTTL, MaxTakeOvers: 1})
	quarantine(t, store, "poison", 2)
	st := newSettlements()
	runs := 0
	h := idemamqp.Handler(store, func(context.Context, amqp091.Delivery) error { runs++; return nil },
		idemamqp.Options{OnSettle: st.on, Logger: slog.New(slog.DiscardHandler)})
	a := &acker{}
	h(context.Background(), delivery(a, "poison"))
	if s := st.next(t); s.Action != idemamqp.Reject || !errors.Is(s.Err, idem.ErrQuarantined) || a.last() != "reject" || runs != 0 {
		t.Fatalf("quarantined: %+v, broker saw %q, ran %d; want reject without requeue with ErrQuarantined, no run", s, a.last(), runs)
	}
}
