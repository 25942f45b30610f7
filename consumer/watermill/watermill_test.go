package watermill_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/idemgo/idem"
	idemwatermill "github.com/idemgo/idem/consumer/watermill"
	"github.com/idemgo/idem/internal/testenv"
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
	store, err := idem.NewRedisStore(testenv.Redis(t), idem.RedisOptions{
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
			"watermill.Middleware: negative Options.ConfirmBudget -1s"},
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
