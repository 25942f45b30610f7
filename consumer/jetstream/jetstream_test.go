package jetstream_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	idemjs "github.com/idemgo/idem/consumer/jetstream"
	"github.com/nats-io/nats.go/jetstream"
)

// The key is the Nats-Msg-Id header by default. JetStream itself drops a
// publish repeated within its Duplicates window, so the duplicate here is
// one outside it: a key already confirmed in the store. It is acked
// without running the handler; a new key runs it and is acked.
func TestAcksDoneAndDuplicates(t *testing.T) {
	rc := testRedis(t)
	_, js := connect(t, startServer(t))
	cons := newConsumer(t, js, 5*time.Second)
	store := newStore(t, rc, prefix(t), "w", time.Second)
	ctx := context.Background()
	c, err := store.Claim(ctx, "old", nil)
	if err != nil || c.Lease == nil {
		t.Fatalf("Claim = %+v, %v", c, err)
	}
	if err := store.Confirm(ctx, c.Lease, nil); err != nil {
		t.Fatal(err)
	}
	publish(t, js, jetstream.MsgIDHeader, "old", "new")
	var mu sync.Mutex
	runs := map[string]int{}
	st := &settlements{}
	h, err := idemjs.NewHandler(store, func(_ context.Context, m jetstream.Msg) error {
		mu.Lock()
		defer mu.Unlock()
		runs[m.Headers().Get(jetstream.MsgIDHeader)]++
		return nil
	}, idemjs.Options{OnSettle: st.on(jetstream.MsgIDHeader), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	consume(t, cons, h, func() bool { return st.count(idemjs.Ack) == 2 && settledOnBroker(t, cons) })
	mu.Lock()
	defer mu.Unlock()
	if runs["old"] != 0 || runs["new"] != 1 {
		t.Errorf("handler runs %v; want new once, old (confirmed before) never", runs)
	}
}

// A key held by another worker is in progress: the message is nakked with
// MinDelay, the handler does not run; once the holder lets go, the
// redelivery runs it and is acked. A failing handler is nakked with a delay
// that doubles with each delivery.
func TestNakInProgressAndFailure(t *testing.T) {
	rc := testRedis(t)
	_, js := connect(t, startServer(t))
	cons := newConsumer(t, js, 5*time.Second)
	pfx := prefix(t)
	other := newStore(t, rc, pfx, "other", 5*time.Second)
	held, err := other.Claim(context.Background(), "busy", nil)
	if err != nil || held.Lease == nil {
		t.Fatalf("Claim = %+v, %v", held, err)
	}
	publish(t, js, "Order-Id", "busy", "flaky")
	var runs sync.Map
	var flaky atomic.Int64
	st := &settlements{}
	h, err := idemjs.NewHandler(newStore(t, rc, pfx, "w", time.Second), func(_ context.Context, m jetstream.Msg) error {
		k := m.Headers().Get("Order-Id")
		n, _ := runs.LoadOrStore(k, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		if k == "flaky" && flaky.Add(1) <= 2 {
			return errors.New("test: not yet")
		}
		return nil
	}, idemjs.Options{KeyHeader: "Order-Id", MinDelay: 20 * time.Millisecond, MaxDelay: time.Second,
		OnSettle: st.on("Order-Id"), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	released := false
	consume(t, cons, h, func() bool {
		st.mu.Lock()
		busyNaks := 0
		for i, s := range st.all {
			if st.keys[i] == "busy" && s.Action == idemjs.Nak {
				busyNaks++
			}
		}
		st.mu.Unlock()
		if busyNaks > 0 && !released {
			released = true
			if err := other.Forget(context.Background(), held.Lease); err != nil {
				t.Error(err)
			}
		}
		return st.count(idemjs.Ack) == 2 && settledOnBroker(t, cons)
	})
	st.mu.Lock()
	defer st.mu.Unlock()
	var flakyDelays []time.Duration
	for i, s := range st.all {
		switch {
		case st.keys[i] == "busy" && s.Action == idemjs.Nak:
			if !errors.Is(s.Err, idem.ErrInProgress) {
				t.Errorf("busy nakked with %v; want ErrInProgress", s.Err)
			}
		case st.keys[i] == "flaky" && s.Action == idemjs.Nak:
			flakyDelays = append(flakyDelays, s.Delay)
		}
	}
	if want := []time.Duration{20 * time.Millisecond, 40 * time.Millisecond}; len(flakyDelays) != 2 ||
		flakyDelays[0] != want[0] || flakyDelays[1] != want[1] {
		t.Errorf("flaky nak delays %v; want %v", flakyDelays, want)
	}
	if n, _ := runs.Load("busy"); n == nil || n.(*atomic.Int64).Load() != 1 {
		t.Errorf("busy handled %v times; want once, after its holder let go", n)
	}
}

// A message without the key header, and one whose fingerprint does not
// match its key's, can never succeed: they are terminated (never
// redelivered) without running the handler.
func TestTermNoKeyAndFingerprintMismatch(t *testing.T) {
	rc := testRedis(t)
	_, js := connect(t, startServer(t))
	cons := newConsumer(t, js, 5*time.Second)
	store := newStore(t, rc, prefix(t), "w", time.Second)
	c, err := store.Claim(context.Background(), "k", []byte("other content"))
	if err != nil || c.Lease == nil {
		t.Fatalf("Claim = %+v, %v", c, err)
	}
	if err := store.Confirm(context.Background(), c.Lease, nil); err != nil {
		t.Fatal(err)
	}
	publish(t, js, "Order-Id", "", "k")
	var runs atomic.Int64
	st := &settlements{}
	h, err := idemjs.NewHandler(store, func(context.Context, jetstream.Msg) error { runs.Add(1); return nil },
		idemjs.Options{KeyHeader: "Order-Id", Fingerprint: func(m jetstream.Msg) []byte { return m.Data() },
			OnSettle: st.on("Order-Id"), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	consume(t, cons, h, func() bool { return st.count(idemjs.Term) == 2 && settledOnBroker(t, cons) })
	time.Sleep(100 * time.Millisecond)
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.all) != 2 {
		t.Errorf("%d settlements %+v; want the two terminations only", len(st.all), st.all)
	}
	for i, s := range st.all {
		want := idem.ErrInvalidKey
		if st.keys[i] == "k" {
			want = idem.ErrFingerprintMismatch
		}
		if s.Action != idemjs.Term || !errors.Is(s.Err, want) || s.SettleErr != nil {
			t.Errorf("%q settled %+v; want Term with %v", st.keys[i], s, want)
		}
	}
	if runs.Load() != 0 {
		t.Errorf("handler ran %d times; want 0", runs.Load())
	}
}

// A handler running for several AckWaits is not redelivered meanwhile:
// InProgress, sent every ProgressInterval, keeps the broker's lease alive
// beside idem's. A second subscriber of the same durable gets nothing.
func TestInProgressKeepsAckWait(t *testing.T) {
	rc := testRedis(t)
	_, js := connect(t, startServer(t))
	const ackWait = 300 * time.Millisecond
	cons := newConsumer(t, js, ackWait)
	publish(t, js, "Order-Id", "slow")
	var runs atomic.Int64
	st := &settlements{}
	h, err := idemjs.NewHandler(newStore(t, rc, prefix(t), "w", time.Second), func(ctx context.Context, m jetstream.Msg) error {
		runs.Add(1)
		select {
		case <-time.After(4 * ackWait):
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}, idemjs.Options{KeyHeader: "Order-Id", ProgressInterval: ackWait / 3, OnSettle: st.on("Order-Id"), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	second, err := cons.Consume(h.MessageHandler(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer second.Stop()
	consume(t, cons, h, func() bool { return st.count(idemjs.Ack) == 1 && settledOnBroker(t, cons) })
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.all) != 1 || runs.Load() != 1 {
		t.Errorf("settlements %+v, handler runs %d; want one Ack and one run (no redelivery)", st.all, runs.Load())
	}
}

// Options mistakes are refused by NewHandler, naming the field.
func TestOptionsRefused(t *testing.T) {
	store := memStore(idem.Options{})
	h := func(context.Context, jetstream.Msg) error { return nil }
	// Each message has the one shape of every package's: "<pkg>: <Field>:
	// <value> <rule>", and what 0 means where it means the default.
	for _, c := range []struct {
		o    idemjs.Options
		want string
	}{
		{idemjs.Options{MinDelay: -1}, "jetstream: MinDelay: -1ns is negative; 0 means the default, 50ms"},
		{idemjs.Options{MaxDelay: -1}, "jetstream: MaxDelay: -1ns is negative; 0 means the default, 5s"},
		{idemjs.Options{MinDelay: 2 * time.Second, MaxDelay: time.Second}, "jetstream: MaxDelay: 1s is less than MinDelay 2s"},
		{idemjs.Options{ProgressInterval: -1}, "jetstream: ProgressInterval: -1ns is negative; 0 means the default, 10s"},
		{idemjs.Options{ConfirmBudget: -1}, "jetstream: ConfirmBudget: -1ns is negative; 0 means the default, two thirds of the lease's TTL"},
		{idemjs.Options{Concurrency: -1}, "jetstream: Concurrency: -1 is negative; 0 means the default, 16"},
	} {
		if _, err := idemjs.NewHandler(store, h, c.o); err == nil || err.Error() != c.want {
			t.Errorf("NewHandler(%+v) = %v; want %q", c.o, err, c.want)
		}
	}
	if _, err := idemjs.NewHandler(store, h, idemjs.Options{}); err != nil {
		t.Errorf("NewHandler(zero Options) = %v", err)
	}
	for name, f := range map[string]func(){
		"nil store":   func() { _, _ = idemjs.NewHandler(nil, h, idemjs.Options{}) },
		"nil handler": func() { _, _ = idemjs.NewHandler(store, nil, idemjs.Options{}) },
	} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(r.(string), name) {
					t.Errorf("%s: panic %v; want one naming it", name, r)
				}
			}()
			f()
		}()
	}
}

// A fetched batch: a, its duplicate a, b, a message without a key and c,
// held by another worker. The handler runs once for a and once for b; both
// a's are acked (the duplicate in a second round, found done), the keyless
// one terminated, c nakked as in progress.
func TestHandleBatch(t *testing.T) {
	rc := testRedis(t)
	_, js := connect(t, startServer(t))
	cons := newConsumer(t, js, 5*time.Second)
	pfx := prefix(t)
	other := newStore(t, rc, pfx, "other", 5*time.Second)
	if c, err := other.Claim(context.Background(), "c", nil); err != nil || c.Lease == nil {
		t.Fatalf("Claim = %+v, %v", c, err)
	}
	publish(t, js, "Order-Id", "a", "a", "b", "", "c")
	var mu sync.Mutex
	runs := map[string]int{}
	st := &settlements{}
	h, err := idemjs.NewHandler(newStore(t, rc, pfx, "w", time.Second), func(_ context.Context, m jetstream.Msg) error {
		mu.Lock()
		defer mu.Unlock()
		runs[m.Headers().Get("Order-Id")]++
		return nil
	}, idemjs.Options{KeyHeader: "Order-Id", OnSettle: st.on("Order-Id"), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(5, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var ms []jetstream.Msg
	for m := range batch.Messages() {
		ms = append(ms, m)
	}
	if len(ms) != 5 {
		t.Fatalf("fetched %d messages (%v); want 5", len(ms), batch.Error())
	}
	h.HandleBatch(context.Background(), ms)
	st.mu.Lock()
	defer st.mu.Unlock()
	got := map[string][]idemjs.Action{}
	for i, s := range st.all {
		got[st.keys[i]] = append(got[st.keys[i]], s.Action)
	}
	want := map[string][]idemjs.Action{"a": {idemjs.Ack, idemjs.Ack}, "b": {idemjs.Ack}, "": {idemjs.Term}, "c": {idemjs.Nak}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("settlements %v; want %v", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if runs["a"] != 1 || runs["b"] != 1 || len(runs) != 2 {
		t.Errorf("handler runs %v; want a and b once each", runs)
	}
}

// A handler that panics: the message is nakked at once (no delay), the
// claim forgotten, the panic re-raised; the redelivery is handled.
func TestHandlePanic(t *testing.T) {
	rc := testRedis(t)
	_, js := connect(t, startServer(t))
	cons := newConsumer(t, js, 5*time.Second)
	publish(t, js, "Order-Id", "p")
	var runs atomic.Int64
	st := &settlements{}
	h, err := idemjs.NewHandler(newStore(t, rc, prefix(t), "w", time.Second), func(context.Context, jetstream.Msg) error {
		if runs.Add(1) == 1 {
			panic("test: boom")
		}
		return nil
	}, idemjs.Options{KeyHeader: "Order-Id", OnSettle: st.on("Order-Id"), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for want := range 2 {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		m, ok := <-batch.Messages()
		if !ok {
			t.Fatalf("fetch %d: no message (%v)", want, batch.Error())
		}
		func() {
			defer func() {
				if r := recover(); (r != nil) != (want == 0) {
					t.Errorf("delivery %d: recovered %v", want+1, r)
				}
			}()
			h.Handle(context.Background(), m)
		}()
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.all) != 2 || st.all[0].Action != idemjs.Nak || st.all[0].Delay != 0 || st.all[1].Action != idemjs.Ack {
		t.Errorf("settlements %+v; want an immediate Nak, then an Ack", st.all)
	}
}

// A handler's success whose Confirm fails past its budget is acked and
// logged as an error, never nakked: a redelivery would claim the key once
// the lease runs out and do the work a second time. One message through
// Handle, one through HandleBatch.
func TestNotRecordedIsAcked(t *testing.T) {
	// idem's lease, and the consumer's AckWait: long enough that a busy
	// machine's fetch-to-ack never outlasts it (the test would then see
	// the broker's redelivery, not the adapter's).
	const ttl = time.Second
	rc := testRedis(t)
	_, js := connect(t, startServer(t))
	cons := newConsumer(t, js, ttl)
	publish(t, js, "Order-Id", "one", "batch")
	var runs sync.Map
	st := &settlements{}
	var logs syncBuffer
	store := unconfirmable{newStore(t, rc, prefix(t), "w", ttl)}
	h, err := idemjs.NewHandler(store, func(_ context.Context, m jetstream.Msg) error {
		n, _ := runs.LoadOrStore(m.Headers().Get("Order-Id"), new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		return nil
	}, idemjs.Options{KeyHeader: "Order-Id", ConfirmBudget: 20 * time.Millisecond, MinDelay: 10 * time.Millisecond,
		OnSettle: st.on("Order-Id"), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	fetch := func() jetstream.Msg {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		m, ok := <-batch.Messages()
		if !ok {
			t.Fatalf("no message (%v)", batch.Error())
		}
		return m
	}
	h.Handle(context.Background(), fetch())
	h.HandleBatch(context.Background(), []jetstream.Msg{fetch()})
	// Past AckWait and the lease: a nakked or unsettled message would be
	// delivered again by now, and its key claimable.
	time.Sleep(3 * ttl)
	if !settledOnBroker(t, cons) {
		t.Fatal("messages still pending on the broker; want both acked")
	}
	if batch, err := cons.Fetch(1, jetstream.FetchMaxWait(100*time.Millisecond)); err == nil {
		for m := range batch.Messages() {
			t.Errorf("%q delivered again; want it acked once", m.Headers().Get("Order-Id"))
		}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.all) != 2 {
		t.Fatalf("settlements %+v; want two", st.all)
	}
	for i, s := range st.all {
		if s.Action != idemjs.Ack || !errors.Is(s.Err, consumer.ErrNotRecorded) || s.SettleErr != nil {
			t.Errorf("%q settled %+v; want Ack with ErrNotRecorded", st.keys[i], s)
		}
		if n, _ := runs.Load(st.keys[i]); n == nil || n.(*atomic.Int64).Load() != 1 {
			t.Errorf("%q handled %v times; want once", st.keys[i], n)
		}
	}
	if l := logs.String(); strings.Count(l, "level=ERROR") != 2 || !strings.Contains(l, "not recorded") {
		t.Errorf("log = %q; want both unrecorded works reported at error level", l)
	}
}

// A fingerprint too large for any store never succeeds: terminated, like
// every error consumer.ActionFor dead-letters, never nakked forever.
func TestTermOversizedFingerprint(t *testing.T) {
	rc := testRedis(t)
	_, js := connect(t, startServer(t))
	cons := newConsumer(t, js, 5*time.Second)
	publish(t, js, "Order-Id", "k")
	var runs atomic.Int64
	st := &settlements{}
	h, err := idemjs.NewHandler(newStore(t, rc, prefix(t), "w", time.Second),
		func(context.Context, jetstream.Msg) error { runs.Add(1); return nil },
		idemjs.Options{KeyHeader: "Order-Id", OnSettle: st.on("Order-Id"), Logger: quiet, MinDelay: 10 * time.Millisecond,
			Fingerprint: func(jetstream.Msg) []byte { return make([]byte, idem.MaxFingerprintBytes+1) }})
	if err != nil {
		t.Fatal(err)
	}
	consume(t, cons, h, func() bool { return len(st.snapshot()) > 0 })
	all := st.snapshot()
	if all[0].Action != idemjs.Term || !errors.Is(all[0].Err, idem.ErrTooLarge) || runs.Load() != 0 {
		t.Fatalf("oversized fingerprint settled %+v after %d runs; want Term with ErrTooLarge, no run", all[0], runs.Load())
	}
	waitFor(t, func() bool { return settledOnBroker(t, cons) })
}

// unconfirmable is a store whose Confirm always fails (the store went
// down between the claim and the confirm). Embedding the interface hides
// the Batcher methods, so every Confirm comes here.
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

// A quarantined key (its messages crashed more consumers in a row than the
// store's MaxTakeOvers) is terminated, as consumer.ActionFor dead-letters
// it, with a reason naming the quarantine: never nakked to be refused
// forever, never acked as done. On real Redis and a real nats-server.
func TestTermQuarantined(t *testing.T) {
	rc := testRedis(t)
	_, js := connect(t, startServer(t))
	cons := newConsumer(t, js, 5*time.Second)
	store, err := idem.NewRedisStore(rc, idem.RedisOptions{Prefix: prefix(t), Worker: "w", LeaseTTL: idem.MinLeaseTTL,
		Retention: time.Minute, MaxTakeOvers: 1})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // the first attempt and one take-over, each crashed
		cl, err := store.Claim(context.Background(), "poison", nil)
		if err != nil || cl.Outcome != idem.Claimed {
			t.Fatalf("Claim(poison) = %v, %v; want Claimed", cl.Outcome, err)
		}
		time.Sleep(cl.Lease.TTL + 20*time.Millisecond)
	}
	publish(t, js, "Order-Id", "poison")
	var runs atomic.Int64
	st := &settlements{}
	var logs syncBuffer
	h, err := idemjs.NewHandler(store, func(context.Context, jetstream.Msg) error { runs.Add(1); return nil },
		idemjs.Options{KeyHeader: "Order-Id", OnSettle: st.on("Order-Id"), Logger: slog.New(slog.NewTextHandler(&logs, nil)),
			MinDelay: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	consume(t, cons, h, func() bool { return len(st.snapshot()) > 0 })
	all := st.snapshot()
	if all[0].Action != idemjs.Term || !errors.Is(all[0].Err, idem.ErrQuarantined) || runs.Load() != 0 {
		t.Fatalf("quarantined settled %+v after %d runs; want Term with ErrQuarantined, no run", all[0], runs.Load())
	}
	if l := logs.String(); !strings.Contains(l, "quarantined") {
		t.Errorf("log = %q; want the termination's reason to name the quarantine", l)
	}
	waitFor(t, func() bool { return settledOnBroker(t, cons) })
}
