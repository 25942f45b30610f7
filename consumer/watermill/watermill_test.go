package watermill_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	idemwatermill "github.com/idemgo/idem/consumer/watermill"
)

func TestMiddlewareDirect(t *testing.T) {
	store := memStore(idem.Options{})
	runs := 0
	h := idemwatermill.Middleware(store, idemwatermill.Options{})(func(msg *message.Message) ([]*message.Message, error) {
		runs++
		if l, ok := idem.LeaseFrom(msg.Context()); !ok || l.Key != msg.UUID {
			t.Errorf("LeaseFrom(msg.Context()) = %v, %v; want the lease of %q", l, ok, msg.UUID)
		}
		return []*message.Message{message.NewMessage("out-"+msg.UUID, nil)}, nil
	})

	out, err := h(message.NewMessage("u1", nil))
	if err != nil || len(out) != 1 || out[0].UUID != "out-u1" {
		t.Fatalf("first delivery: %v, %v; want the handler's message and nil", out, err)
	}
	out, err = h(message.NewMessage("u1", nil))
	if err != nil || out != nil || runs != 1 {
		t.Fatalf("duplicate: %v, %v after %d runs; want nil, nil (ack) without running again", out, err, runs)
	}

	if _, err := h(message.NewMessage("", nil)); !errors.Is(err, idem.ErrInvalidKey) || runs != 1 {
		t.Fatalf("empty UUID: %v, runs %d; want ErrInvalidKey without running (never acked as a duplicate)", err, runs)
	}

	if _, err := store.Claim(context.Background(), "busy", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := h(message.NewMessage("busy", nil)); !errors.Is(err, idem.ErrInProgress) || runs != 1 {
		t.Fatalf("held key: %v, runs %d; want ErrInProgress (nack) without running", err, runs)
	}
}

func TestMiddlewareMetadataKeyAndFailure(t *testing.T) {
	store := memStore(idem.Options{})
	fail := errors.New("handler failed")
	runs := 0
	h := idemwatermill.Middleware(store, idemwatermill.Options{MetadataKey: "event_id"})(
		func(msg *message.Message) ([]*message.Message, error) {
			if runs++; runs == 1 {
				return nil, fail
			}
			return nil, nil
		})
	msg := func(uuid, event string) *message.Message {
		m := message.NewMessage(uuid, nil)
		m.Metadata.Set("event_id", event)
		return m
	}
	if _, err := h(msg("a", "e1")); !errors.Is(err, fail) {
		t.Fatalf("failing handler: %v; want its error (nack)", err)
	}
	if _, err := h(msg("b", "e1")); err != nil {
		t.Fatalf("redelivery under another UUID: %v; want nil (the failure was forgotten)", err)
	}
	if _, err := h(msg("c", "e1")); err != nil || runs != 2 {
		t.Fatalf("third delivery of event e1: %v, runs %d; want a duplicate (keyed by metadata, not UUID)", err, runs)
	}
}

// Through a real router on Watermill's GoChannel: 500 events, 100 of them
// published twice, every 20th failing once. Every event's effect once;
// every published message eventually acked.
func testRouter(t *testing.T, store idem.Store) {
	const events, dups = 500, 100
	logger := watermill.NopLogger{}
	pubsub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: events + dups}, logger)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	ledger := map[string]int{}
	failed := map[string]bool{}
	var acked, nacked, busy atomic.Int64
	done := make(chan struct{})
	count := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if errors.Is(err, idem.ErrInProgress) {
				busy.Add(1) // a duplicate delivered while the first still runs
			} else if err != nil {
				nacked.Add(1)
			} else if acked.Add(1) == events+dups {
				close(done)
			}
			return out, err
		}
	}
	topic := "events-" + t.Name()
	handler := router.AddConsumerHandler("idem", topic, pubsub, func(msg *message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		n, _ := strconv.Atoi(msg.UUID)
		if n%20 == 0 && !failed[msg.UUID] {
			failed[msg.UUID] = true
			return fmt.Errorf("first attempt of %s fails", msg.UUID)
		}
		ledger[msg.UUID]++
		return nil
	})
	handler.AddMiddleware(count, idemwatermill.Middleware(store, idemwatermill.Options{}))

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go func() { _ = router.Run(ctx) }()
	defer router.Close()
	<-router.Running()

	for i := range events + dups {
		id := strconv.Itoa(i % events) // the last 100 repeat the first 100
		if err := pubsub.Publish(topic, message.NewMessage(id, []byte(id))); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("after 20s: %d of %d messages acked, %d nacked", acked.Load(), events+dups, nacked.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range events {
		if id := strconv.Itoa(i); ledger[id] != 1 {
			t.Errorf("event %s: effect done %d times; want exactly once", id, ledger[id])
		}
	}
	if n := nacked.Load(); n != int64(len(failed)) || n != events/20 {
		t.Errorf("%d nacks for %d failed first attempts; want one each (%d)", n, len(failed), events/20)
	}
	t.Logf("%d messages acked, %d nacked after a failure, %d nacked while in progress", acked.Load(), nacked.Load(), busy.Load())
}

func TestRouterMemory(t *testing.T) {
	testRouter(t, memStore(idem.Options{}))
}

func TestRouterRedis(t *testing.T) {
	store, err := idem.NewRedisStore(testRedis(t), idem.RedisOptions{
		Prefix:    fmt.Sprintf("idemtest:watermill:%d:", time.Now().UnixNano()),
		Retention: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	testRouter(t, store)
}

// A message whose key another consumer holds is nacked until that one
// confirms; then it is acked as a duplicate without running.
func TestRouterInProgressNacked(t *testing.T) {
	ctx := context.Background()
	store := memStore(idem.Options{})
	held, err := store.Claim(ctx, "held", nil)
	if err != nil {
		t.Fatal(err)
	}
	logger := watermill.NopLogger{}
	pubsub := gochannel.NewGoChannel(gochannel.Config{}, logger)
	router, _ := message.NewRouter(message.RouterConfig{}, logger)
	var nacks atomic.Int64
	var ran atomic.Bool
	acked := make(chan struct{})
	h := router.AddConsumerHandler("idem", "t", pubsub, func(*message.Message) error { ran.Store(true); return nil })
	h.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if errors.Is(err, idem.ErrInProgress) {
				nacks.Add(1)
				time.Sleep(5 * time.Millisecond) // what middleware.Retry's delay would do
			} else if err == nil {
				close(acked)
			}
			return out, err
		}
	}, idemwatermill.Middleware(store, idemwatermill.Options{}))
	go func() { _ = router.Run(ctx) }()
	defer router.Close()
	<-router.Running()
	if err := pubsub.Publish("t", message.NewMessage("held", nil)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for nacks.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if err := store.Confirm(ctx, held.Lease, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-acked:
	case <-time.After(5 * time.Second):
		t.Fatal("not acked within 5s of the holder's confirmation")
	}
	if nacks.Load() < 3 || ran.Load() {
		t.Fatalf("%d nacks, handler ran %v; want nacks while held, then an ack without running", nacks.Load(), ran.Load())
	}
}

// Options.Fingerprint reaches the store: a message reusing a key with
// other content is refused with ErrFingerprintMismatch (for a poison
// queue), never acked as a duplicate.
func TestMiddlewareFingerprint(t *testing.T) {
	runs := 0
	h := idemwatermill.Middleware(memStore(idem.Options{}), idemwatermill.Options{
		Fingerprint: func(msg *message.Message) []byte { return msg.Payload },
	})(func(*message.Message) ([]*message.Message, error) { runs++; return nil, nil })
	if _, err := h(message.NewMessage("k", []byte("a"))); err != nil {
		t.Fatalf("first delivery: %v; want nil", err)
	}
	if _, err := h(message.NewMessage("k", []byte("a"))); err != nil || runs != 1 {
		t.Fatalf("same key, same payload: %v after %d runs; want nil (a duplicate)", err, runs)
	}
	if _, err := h(message.NewMessage("k", []byte("b"))); !errors.Is(err, idem.ErrFingerprintMismatch) || runs != 1 {
		t.Fatalf("same key, other payload: %v after %d runs; want ErrFingerprintMismatch without running", err, runs)
	}
}

// A handler's success whose Confirm fails past its budget is acked (nil,
// with the handler's messages) and logged as an error, never nacked: a
// redelivery would claim the key once the lease runs out and do the work
// a second time. Through a real router: one run, one ack, no nack.
func TestRouterNotRecordedIsAcked(t *testing.T) {
	var logs syncBuffer
	store := unconfirmable{memStore(idem.Options{})}
	logger := watermill.NopLogger{}
	pubsub := gochannel.NewGoChannel(gochannel.Config{}, logger)
	router, _ := message.NewRouter(message.RouterConfig{}, logger)
	var runs, nacks atomic.Int64
	results := make(chan []*message.Message, 1)
	h := router.AddConsumerHandler("idem", "t", pubsub, func(*message.Message) error { runs.Add(1); return nil })
	h.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err != nil {
				nacks.Add(1)
				t.Errorf("unrecorded work: handler returned %v; want nil (ack), never a nack", err)
			} else {
				results <- out
			}
			return out, err
		}
	}, idemwatermill.Middleware(store, idemwatermill.Options{ConfirmBudget: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}))
	go func() { _ = router.Run(context.Background()) }()
	defer router.Close()
	<-router.Running()
	if err := pubsub.Publish("t", message.NewMessage("k", nil)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-results:
	case <-time.After(5 * time.Second):
		t.Fatal("not acked within 5s")
	}
	time.Sleep(100 * time.Millisecond) // a nacked message would be back by now
	if runs.Load() != 1 || nacks.Load() != 0 {
		t.Fatalf("handler ran %d times, %d nacks; want 1 run, no nack", runs.Load(), nacks.Load())
	}
	if l := logs.String(); !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "not recorded") {
		t.Errorf("log = %q; want the unrecorded work reported at error level", l)
	}
}

// What can never succeed (no key, an oversized fingerprint), or not until
// an operator settles its quarantined key, is a nack that
// consumer.ActionFor calls DeadLetter, the poison queue's filter, and is
// logged as an error: Watermill would otherwise redeliver it in silence.
func TestMiddlewareDeadLetterLogged(t *testing.T) {
	var logs syncBuffer
	runs := 0
	// A key quarantined by the store: its messages crashed every consumer
	// (the first attempt and MaxTakeOvers = 1 take-over, each lapsed).
	store := memStore(idem.Options{LeaseTTL: idem.MinLeaseTTL, MaxTakeOvers: 1})
	for range 2 {
		c, err := store.Claim(context.Background(), "poison", nil)
		if err != nil || c.Outcome != idem.Claimed {
			t.Fatalf("Claim(poison) = %v, %v; want Claimed", c.Outcome, err)
		}
		time.Sleep(c.Lease.TTL + 20*time.Millisecond)
	}
	h := idemwatermill.Middleware(store, idemwatermill.Options{
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Fingerprint: func(msg *message.Message) []byte {
			if string(msg.Payload) == "big" {
				return make([]byte, idem.MaxFingerprintBytes+1)
			}
			return nil
		},
	})(func(*message.Message) ([]*message.Message, error) { runs++; return nil, nil })
	for _, tc := range []struct {
		name string
		msg  *message.Message
		want error
	}{
		{"empty UUID", message.NewMessage("", nil), idem.ErrInvalidKey},
		{"oversized fingerprint", message.NewMessage("k", []byte("big")), idem.ErrTooLarge},
		{"quarantined", message.NewMessage("poison", nil), idem.ErrQuarantined},
	} {
		out, err := h(tc.msg)
		if !errors.Is(err, tc.want) || out != nil || consumer.ActionFor(err) != consumer.DeadLetter {
			t.Errorf("%s: %v, %v; want a nack matching %v that ActionFor dead-letters", tc.name, out, err, tc.want)
		}
	}
	if runs != 0 {
		t.Errorf("handler ran %d times; want 0", runs)
	}
	if l := logs.String(); strings.Count(l, "level=ERROR") != 3 || !strings.Contains(l, "poison queue") ||
		!strings.Contains(l, "an operator must settle it") {
		t.Errorf("log = %q; want all three reported at error level, the quarantined one as waiting for an operator", l)
	}
}

// unconfirmable is a store whose Confirm always fails (the store went
// down between the claim and the confirm).
type unconfirmable struct{ idem.Store }

func (unconfirmable) Confirm(context.Context, *idem.Lease, []byte) error {
	return errors.New("store down")
}

// syncBuffer is a bytes.Buffer safe for a logger on another goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// A mistake in building the middleware panics at once, in the caller's
// goroutine, naming what is wrong, rather than on the first message.
func TestMiddlewareMistakesPanic(t *testing.T) {
	store := memStore(idem.Options{})
	nop := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	for _, tc := range []struct {
		name  string
		store idem.Store
		o     idemwatermill.Options
		h     message.HandlerFunc
		want  string
	}{
		{"valid", store, idemwatermill.Options{}, nop, ""},
		{"nil store", nil, idemwatermill.Options{}, nop, "watermill.Middleware: nil store"},
		{"typed nil store", (*idem.RedisStore)(nil), idemwatermill.Options{}, nop, "watermill.Middleware: nil store"},
		{"negative ConfirmBudget", store, idemwatermill.Options{ConfirmBudget: -time.Second}, nop,
			"watermill: ConfirmBudget: -1s is negative; 0 means the default, two thirds of the lease's TTL"},
		{"nil handler", store, idemwatermill.Options{}, nil, "watermill.Middleware: nil handler"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := func() (msg string) {
				defer func() {
					if v := recover(); v != nil {
						msg = fmt.Sprint(v)
					}
				}()
				idemwatermill.Middleware(tc.store, tc.o)(tc.h)
				return ""
			}()
			if got != tc.want {
				t.Errorf("Middleware with %s: panic %q; want %q", tc.name, got, tc.want)
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
