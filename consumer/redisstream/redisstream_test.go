package redisstream_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/redisstream"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/redis/go-redis/v9"
)

// Entries a, a (a producer's duplicate), b and one without an id field: the
// handler runs once per key, every entry is acked, nothing stays pending.
func TestReaderAcksDoneAndDuplicates(t *testing.T) {
	testAcksDoneAndDuplicates(t, testenv.Redis(t))
}

// The same on the real cluster: the stream and its group are one key, on
// one slot; the store's keys are spread over the others.
func TestReaderCluster(t *testing.T) {
	testAcksDoneAndDuplicates(t, testenv.Cluster(t))
}

func testAcksDoneAndDuplicates(t *testing.T, c redis.UniversalClient) {
	stream := unique(t, "stream")
	add(t, c, stream, "a", "a", "b", "")
	var mu sync.Mutex
	runs := map[string]int{}
	st := &settlements{}
	r, err := redisstream.NewReader(c, newStore(t, c, prefix(t), "w", time.Second),
		func(_ context.Context, m redis.XMessage) error {
			mu.Lock()
			defer mu.Unlock()
			id, _ := m.Values["id"].(string)
			runs[id]++
			return nil
		}, redisstream.Options{Stream: stream, Group: "g", Consumer: "c1", KeyField: "id", OnSettle: st.on, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, r, func() bool { return st.count(redisstream.Ack) == 4 })
	mu.Lock()
	defer mu.Unlock()
	if runs["a"] != 1 || runs["b"] != 1 || runs[""] != 1 {
		t.Errorf("handler runs %v; want a, b and the id-less entry once each", runs)
	}
	if n := pending(t, c, stream, "g"); n != 0 {
		t.Errorf("%d entries pending; want 0", n)
	}
}

// Without a KeyField the key is the stream and entry ID: the producer's
// duplicate (a new entry ID) is handled again, a reclaim of the same entry
// is not.
func TestReaderEntryIDKey(t *testing.T) {
	c := testenv.Redis(t)
	stream := unique(t, "stream")
	add(t, c, stream, "a", "a")
	store := newStore(t, c, prefix(t), "w", time.Second)
	st := &settlements{}
	var runs atomic.Int64 // handlers of one batch run concurrently
	r, err := redisstream.NewReader(c, store, func(context.Context, redis.XMessage) error { runs.Add(1); return nil },
		redisstream.Options{Stream: stream, Group: "g", Consumer: "c1", OnSettle: st.on, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, r, func() bool { return st.count(redisstream.Ack) == 2 })
	if runs.Load() != 2 {
		t.Errorf("handler ran %d times; want 2 (two entry IDs)", runs.Load())
	}
	for _, id := range st.ids {
		if rec, err := store.Lookup(context.Background(), stream+"/"+id); err != nil || !rec.Confirmed {
			t.Errorf("Lookup(%q) = %v, %v; want a confirmed record", stream+"/"+id, rec, err)
		}
	}
}

// A failed handler leaves its entry pending, not acked; after MinIdle it is
// reclaimed with XAUTOCLAIM and handled again.
func TestReaderRetriesFailureAfterMinIdle(t *testing.T) {
	c := testenv.Redis(t)
	read := &firstRead{}
	c.AddHook(read)
	stream := unique(t, "stream")
	add(t, c, stream, "x")
	st := &settlements{}
	var mu sync.Mutex
	var at []time.Time
	const minIdle = 200 * time.Millisecond
	r, err := redisstream.NewReader(c, newStore(t, c, prefix(t), "w", time.Second),
		func(context.Context, redis.XMessage) error {
			mu.Lock()
			defer mu.Unlock()
			if at = append(at, time.Now()); len(at) == 1 {
				return errors.New("first attempt fails")
			}
			return nil
		}, redisstream.Options{Stream: stream, Group: "g", Consumer: "c1", KeyField: "id",
			MinIdle: minIdle, Block: 50 * time.Millisecond, OnSettle: st.on, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, r, func() bool { return st.count(redisstream.Ack) == 1 })
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.all) != 2 || st.all[0].Action != redisstream.Pending || st.all[0].Err == nil ||
		st.all[1].Action != redisstream.Ack || !st.all[1].Reclaimed {
		t.Fatalf("settlements %+v; want pending (with the error), then a reclaimed ack", st.all)
	}
	// MinIdle runs on Redis's clock: from the entry's delivery, stamped
	// while the XREADGROUP that returned it ran, to the XAUTOCLAIM, each
	// stamp a whole millisecond. On the test's clock the retry therefore
	// comes at least MinIdle, less that millisecond, after the XREADGROUP
	// was sent; the first attempt's own time stamp (at[0]) comes later by
	// the time the call took, and may be less than MinIdle before the
	// retry (199.85ms was seen).
	sent := read.at()
	if sent.IsZero() {
		t.Fatal("no XREADGROUP returned the entry; want the first delivery seen by the hook")
	}
	if since := at[1].Sub(sent); since < minIdle-redisClockGranularity {
		t.Errorf("retried %v after the XREADGROUP that delivered the entry was sent (%v after the first attempt); want at least MinIdle %v, less Redis's clock granularity %v",
			since, at[1].Sub(at[0]), minIdle, redisClockGranularity)
	}
}

// redisClockGranularity is that of the times Redis stamps and compares
// (an entry's delivery, a key's expiry): a millisecond.
const redisClockGranularity = time.Millisecond

// firstRead is a go-redis hook that notes when the first XREADGROUP that
// returned an entry was sent: Redis stamps the entry's delivery after that.
type firstRead struct {
	mu   sync.Mutex
	sent time.Time
}

func (h *firstRead) at() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sent
}

func (h *firstRead) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *firstRead) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		sent := time.Now()
		err := next(ctx, cmd)
		if x, ok := cmd.(*redis.XStreamSliceCmd); ok && cmd.Name() == "xreadgroup" {
			for _, s := range x.Val() {
				if len(s.Messages) > 0 {
					h.mu.Lock()
					if h.sent.IsZero() {
						h.sent = sent
					}
					h.mu.Unlock()
				}
			}
		}
		return err
	}
}

func (h *firstRead) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// An entry whose key another delivery holds is left pending, the handler not
// run; once the holder confirms, the reclaimed entry is a duplicate: acked.
func TestReaderInProgressLeftPending(t *testing.T) {
	c := testenv.Redis(t)
	stream := unique(t, "stream")
	pfx := prefix(t)
	holder := newStore(t, c, pfx, "holder", 5*time.Second)
	ctx := context.Background()
	cl, err := holder.Claim(ctx, "k", nil)
	if err != nil || cl.Outcome != idem.Claimed {
		t.Fatalf("Claim(k) = %v, %v; want Claimed", cl.Outcome, err)
	}
	add(t, c, stream, "k")
	st := &settlements{}
	var runs atomic.Int64 // handlers of one batch run concurrently
	r, err := redisstream.NewReader(c, newStore(t, c, pfx, "reader", 5*time.Second),
		func(context.Context, redis.XMessage) error { runs.Add(1); return nil },
		redisstream.Options{Stream: stream, Group: "g", Consumer: "c1", KeyField: "id",
			MinIdle: 100 * time.Millisecond, Block: 50 * time.Millisecond, OnSettle: st.on, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, r, func() bool {
		if st.count(redisstream.Pending) == 1 && pending(t, c, stream, "g") == 1 {
			if err := holder.Confirm(ctx, cl.Lease, nil); err != nil {
				t.Fatalf("Confirm: %v", err)
			}
		}
		return st.count(redisstream.Ack) == 1
	})
	if runs.Load() != 0 {
		t.Errorf("handler ran %d times; want 0 (the holder did the work)", runs.Load())
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if !errors.Is(st.all[0].Err, idem.ErrInProgress) {
		t.Errorf("first settlement's Err = %v; want idem.ErrInProgress", st.all[0].Err)
	}
}

// A key's content changed (another fingerprint) can never succeed: the entry
// is acked without its work, and logged, never left to be reclaimed forever.
func TestReaderFingerprintMismatchRejected(t *testing.T) {
	c := testenv.Redis(t)
	stream := unique(t, "stream")
	ctx := context.Background()
	for _, body := range []string{"one", "one", "two"} {
		if err := c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"id": "k", "body": body}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = c.Del(context.Background(), stream).Err() })
	st := &settlements{}
	var runs atomic.Int64 // handlers of one batch run concurrently
	r, err := redisstream.NewReader(c, newStore(t, c, prefix(t), "w", time.Second),
		func(context.Context, redis.XMessage) error { runs.Add(1); return nil },
		redisstream.Options{Stream: stream, Group: "g", Consumer: "c1", KeyField: "id", OnSettle: st.on, Logger: quiet,
			Fingerprint: func(m *redis.XMessage) []byte { s, _ := m.Values["body"].(string); return []byte(s) }})
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, r, func() bool { return st.count(redisstream.Ack)+st.count(redisstream.Reject) == 3 })
	if got := st.count(redisstream.Reject); got != 1 || runs.Load() != 1 {
		t.Errorf("%d rejects, %d runs; want 1 reject (body two) and 1 run", got, runs.Load())
	}
	if n := pending(t, c, stream, "g"); n != 0 {
		t.Errorf("%d entries pending; want 0", n)
	}
}

// A handler's success whose Confirm fails past its budget is acked and
// logged as an error, never left pending: a reclaim after MinIdle would
// find the key's claim run out and do the work a second time.
func TestReaderNotRecordedIsAcked(t *testing.T) {
	c := testenv.Redis(t)
	stream := unique(t, "stream")
	add(t, c, stream, "k")
	st := &settlements{}
	var logs syncBuffer
	var runs atomic.Int64 // handlers of one batch run concurrently
	store := unconfirmable{newStore(t, c, prefix(t), "w", idem.MinLeaseTTL)}
	r, err := redisstream.NewReader(c, store, func(context.Context, redis.XMessage) error { runs.Add(1); return nil },
		redisstream.Options{Stream: stream, Group: "g", Consumer: "c1", KeyField: "id", ConfirmBudget: 20 * time.Millisecond,
			MinIdle: 100 * time.Millisecond, Block: 20 * time.Millisecond, OnSettle: st.on,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	// Run past the lease and MinIdle: a pending entry would be reclaimed
	// and, its claim run out, handled again.
	deadline := time.Now().Add(600 * time.Millisecond)
	runUntil(t, r, func() bool { return time.Now().After(deadline) })
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.all) != 1 || st.all[0].Action != redisstream.Ack || !errors.Is(st.all[0].Err, consumer.ErrNotRecorded) || runs.Load() != 1 {
		t.Fatalf("unrecorded work: settlements %+v after %d runs; want one ack with ErrNotRecorded after 1 run", st.all, runs.Load())
	}
	if n := pending(t, c, stream, "g"); n != 0 {
		t.Errorf("%d entries pending; want 0 (acked)", n)
	}
	if l := logs.String(); !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "not recorded") {
		t.Errorf("log = %q; want the unrecorded work reported at error level", l)
	}
}

// A fingerprint too large for any store never succeeds: acked without its
// work and logged, like every error consumer.ActionFor dead-letters, not
// left pending to be reclaimed forever.
func TestReaderOversizedFingerprintRejected(t *testing.T) {
	c := testenv.Redis(t)
	stream := unique(t, "stream")
	add(t, c, stream, "k")
	st := &settlements{}
	var runs atomic.Int64 // handlers of one batch run concurrently
	r, err := redisstream.NewReader(c, newStore(t, c, prefix(t), "w", time.Second),
		func(context.Context, redis.XMessage) error { runs.Add(1); return nil },
		redisstream.Options{Stream: stream, Group: "g", Consumer: "c1", KeyField: "id", OnSettle: st.on, Logger: quiet,
			Fingerprint: func(*redis.XMessage) []byte { return make([]byte, idem.MaxFingerprintBytes+1) }})
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, r, func() bool { return st.count(redisstream.Reject)+st.count(redisstream.Pending) >= 1 })
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.all[0].Action != redisstream.Reject || !errors.Is(st.all[0].Err, idem.ErrTooLarge) || runs.Load() != 0 {
		t.Errorf("oversized fingerprint: %+v after %d runs; want reject with ErrTooLarge, no run", st.all[0], runs.Load())
	}
	if n := pending(t, c, stream, "g"); n != 0 {
		t.Errorf("%d entries pending; want 0", n)
	}
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

// Mistakes are refused by NewReader, naming the field; a nil client, store
// or handler panics, as consumer.Idempotent's do.
func TestNewReaderMistakes(t *testing.T) {
	store := memStore(idem.Options{})
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer c.Close()
	h := func(context.Context, redis.XMessage) error { return nil }
	ok := redisstream.Options{Stream: "s", Group: "g", Consumer: "c"}
	for _, tc := range []struct {
		name string
		edit func(*redisstream.Options)
		want string
	}{
		{"no stream", func(o *redisstream.Options) { o.Stream = "" }, `redisstream: Stream: "" is empty; set the stream to read`},
		{"no group", func(o *redisstream.Options) { o.Group = "" }, `redisstream: Group: "" is empty; set the consumer group to read as`},
		{"no consumer", func(o *redisstream.Options) { o.Consumer = "" }, `redisstream: Consumer: "" is empty; name this reader, unique in its group`},
		{"negative count", func(o *redisstream.Options) { o.Count = -1 }, "redisstream: Count: -1 is negative; 0 means the default, 100"},
		{"negative block", func(o *redisstream.Options) { o.Block = -1 }, "redisstream: Block: -1ns is negative; 0 means the default, 1s"},
		{"negative min idle", func(o *redisstream.Options) { o.MinIdle = -1 }, "redisstream: MinIdle: -1ns is negative; 0 means the default, 30s"},
		{"negative concurrency", func(o *redisstream.Options) { o.Concurrency = -1 }, "redisstream: Concurrency: -1 is negative; 0 means the default, 16"},
		{"negative confirm budget", func(o *redisstream.Options) { o.ConfirmBudget = -1 },
			"redisstream: ConfirmBudget: -1ns is negative; 0 means the default, two thirds of the lease's TTL"},
	} {
		o := ok
		tc.edit(&o)
		if _, err := redisstream.NewReader(c, store, h, o); err == nil || err.Error() != tc.want {
			t.Errorf("%s: NewReader error %v; want %q", tc.name, err, tc.want)
		}
	}
	if _, err := redisstream.NewReader(c, store, h, ok); err != nil {
		t.Errorf("NewReader(valid options) = %v", err)
	}
	var nilClient *redis.Client
	var nilStore *idem.RedisStore
	for _, tc := range []struct {
		name, want string
		call       func()
	}{
		{"nil client", "nil client", func() { _, _ = redisstream.NewReader(nil, store, h, ok) }},
		{"typed nil client", "nil client", func() { _, _ = redisstream.NewReader(nilClient, store, h, ok) }},
		{"typed nil store", "nil store", func() { _, _ = redisstream.NewReader(c, nilStore, h, ok) }},
		{"nil handler", "nil handler", func() { _, _ = redisstream.NewReader(c, store, nil, ok) }},
	} {
		func() {
			defer func() {
				if v, _ := recover().(string); !strings.Contains(v, tc.want) {
					t.Errorf("%s: panic %q; want one saying %q", tc.name, v, tc.want)
				}
			}()
			tc.call()
		}()
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

// A quarantined key (its deliveries crashed more times in a row than the
// store's MaxTakeOvers) is dead-lettered as consumer.ActionFor says: acked
// without its work and logged, never left pending to be reclaimed and
// refused forever. On real Redis, quarantined by the store itself.
func TestReaderQuarantinedRejected(t *testing.T) {
	c := testenv.Redis(t)
	stream := unique(t, "stream")
	store, err := idem.NewRedisStore(c, idem.RedisOptions{Prefix: prefix(t), Worker: "w", LeaseTTL: idem.MinLeaseTTL,
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
	add(t, c, stream, "poison")
	st := &settlements{}
	var runs atomic.Int64
	r, err := redisstream.NewReader(c, store, func(context.Context, redis.XMessage) error { runs.Add(1); return nil },
		redisstream.Options{Stream: stream, Group: "g", Consumer: "c1", KeyField: "id", OnSettle: st.on, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, r, func() bool {
		return st.count(redisstream.Reject)+st.count(redisstream.Pending)+st.count(redisstream.Ack) >= 1
	})
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.all[0].Action != redisstream.Reject || !errors.Is(st.all[0].Err, idem.ErrQuarantined) || runs.Load() != 0 {
		t.Errorf("quarantined: %+v after %d runs; want reject with ErrQuarantined, no run", st.all[0], runs.Load())
	}
	if n := pending(t, c, stream, "g"); n != 0 {
		t.Errorf("%d entries pending; want 0", n)
	}
}

// A reader starts before its Redis, as the store does: while the server
// cannot be reached, Run keeps trying to create the group instead of
// returning, and handles entries once the server is up.
func TestReaderStartsBeforeItsRedis(t *testing.T) {
	srv := testenv.StartRedisServer(t)
	srv.Kill()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	stream := unique(t, "stream")
	st := &settlements{}
	var logs syncBuffer
	r, err := redisstream.NewReader(c, newStore(t, c, prefix(t), "w", time.Second),
		func(context.Context, redis.XMessage) error { return nil },
		redisstream.Options{Stream: stream, Group: "g", Consumer: "c1", KeyField: "id", Block: 50 * time.Millisecond,
			OnSettle: st.on, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	runUntil(t, r, func() bool {
		if time.Since(started) > 1500*time.Millisecond { // past a few attempts: go-redis dials 5 times per call
			if !srv.Start() {
				t.FailNow()
			}
			add(t, c, stream, "k")
			started = time.Now().Add(time.Hour) // started once
		}
		return st.count(redisstream.Ack) == 1
	})
	if l := logs.String(); !strings.Contains(l, "creating the group failed; retrying") {
		t.Errorf("log = %q; want the failed group creation reported as retried", l)
	}
}

// noAck is a client whose XACK never reaches Redis.
type noAck struct{ redisstream.Client }

func (noAck) XAck(ctx context.Context, stream, group string, ids ...string) *redis.IntCmd {
	cmd := redis.NewIntCmd(ctx, "xack", stream, group)
	cmd.SetErr(errors.New("connection reset"))
	return cmd
}

// The log says an entry was acked only when its XACK reached Redis: work
// done but not recorded whose XACK failed stays pending, and the log says
// so instead of "acked".
func TestReaderLogsAckedOnlyWhenAcked(t *testing.T) {
	c := testenv.Redis(t)
	stream := unique(t, "stream")
	add(t, c, stream, "k")
	st := &settlements{}
	var logs syncBuffer
	store := unconfirmable{newStore(t, c, prefix(t), "w", idem.MinLeaseTTL)}
	r, err := redisstream.NewReader(noAck{c}, store, func(context.Context, redis.XMessage) error { return nil },
		redisstream.Options{Stream: stream, Group: "g", Consumer: "c1", KeyField: "id", ConfirmBudget: 20 * time.Millisecond,
			MinIdle: time.Minute, Block: 20 * time.Millisecond, OnSettle: st.on,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, r, func() bool { return st.count(redisstream.Ack) == 1 })
	l := logs.String()
	if strings.Contains(l, "acked so it is not done again") || !strings.Contains(l, "its XACK failed too") {
		t.Errorf("log = %q; want the unrecorded work reported with its failed XACK, never as acked", l)
	}
	if n := pending(t, c, stream, "g"); n != 1 {
		t.Errorf("%d entries pending; want 1 (the XACK failed)", n)
	}
}

// evalCounter counts the script calls made through a client, pipelined or
// not.
type evalCounter struct{ n atomic.Int64 }

func (e *evalCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (e *evalCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.HasPrefix(cmd.Name(), "eval") {
			e.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (e *evalCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if strings.HasPrefix(cmd.Name(), "eval") {
				e.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// A key repeated within one read costs no claim of its own: entries a, b,
// a, a read at once run the handler once per key, are all acked, and cost
// the store one claim and one confirm script call (before, one more claim
// per repeat of a).
func TestReaderRepeatInOneRead(t *testing.T) {
	c := testenv.Redis(t)
	sc := redis.NewClient(c.Options())
	t.Cleanup(func() { _ = sc.Close() })
	ev := &evalCounter{}
	sc.AddHook(ev)
	store := newStore(t, sc, prefix(t), "w", time.Second)
	// The store's first contact (its probe) is not the batch's.
	if _, err := store.Lookup(context.Background(), "warm-up"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Lookup = %v", err)
	}
	ev.n.Store(0)
	stream := unique(t, "stream")
	add(t, c, stream, "a", "b", "a", "a")
	var mu sync.Mutex
	runs := map[string]int{}
	st := &settlements{}
	r, err := redisstream.NewReader(c, store, func(_ context.Context, m redis.XMessage) error {
		mu.Lock()
		defer mu.Unlock()
		id, _ := m.Values["id"].(string)
		runs[id]++
		return nil
	}, redisstream.Options{Stream: stream, Group: "g", Consumer: "c1", KeyField: "id", OnSettle: st.on, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, r, func() bool { return st.count(redisstream.Ack) == 4 })
	mu.Lock()
	defer mu.Unlock()
	if runs["a"] != 1 || runs["b"] != 1 {
		t.Errorf("handler runs %v; want a and b once each", runs)
	}
	if n := pending(t, c, stream, "g"); n != 0 {
		t.Errorf("%d entries pending; want 0", n)
	}
	if n := ev.n.Load(); n != 2 {
		t.Errorf("%d script calls for one read of a, b, a, a; want 2 (one claim, one confirm)", n)
	}
}
