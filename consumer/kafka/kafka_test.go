package kafka_test

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
	"github.com/idemgo/idem/consumer/kafka"
	"github.com/twmb/franz-go/pkg/kgo"
)

// effects counts the handler's effects per key.
type effects struct {
	mu sync.Mutex
	n  map[string]int
}

func (e *effects) add(k string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == nil {
		e.n = map[string]int{}
	}
	e.n[k]++
}

func (e *effects) get(k string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n[k]
}

func header(r *kgo.Record) string {
	for _, h := range r.Headers {
		if h.Key == kafka.DefaultKeyHeader {
			return string(h.Value)
		}
	}
	return ""
}

// Each message produced twice is handled once, and the offset is committed
// to the partition's end.
func TestDuplicatesSkipped(t *testing.T) {
	rc := testRedis(t)
	kc := newCluster(t, 1)
	var ids []string
	for i := range 10 {
		ids = append(ids, fmt.Sprintf("m%d", i))
	}
	produce(t, kc, 0, append(ids, ids...)...)
	var eff effects
	var st settlements
	c, err := kafka.NewConsumer(newStore(t, rc, prefix(t), "w", time.Second),
		func(_ context.Context, r *kgo.Record) error { eff.add(header(r)); return nil },
		kafka.Options{Group: "g", Topics: []string{topic}, Client: clientOpts(kc), CommitInterval: 100 * time.Millisecond,
			Logger: quiet, OnSettle: st.on})
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, c, func() bool { return committed(t, kc, "g")[0] == 20 })
	for _, id := range ids {
		if n := eff.get(id); n != 1 {
			t.Errorf("%s: effect applied %d times; want 1", id, n)
		}
	}
	if n := st.count(kafka.Commit); n != 20 {
		t.Errorf("%d records committed; want 20 (10 done, 10 duplicates)", n)
	}
}

// A failing record holds the committed offset at its own, however many
// records after it are done; once it succeeds the offset passes them all.
func TestCommitNeverPassesUnconfirmed(t *testing.T) {
	rc := testRedis(t)
	kc := newCluster(t, 1)
	var ids []string
	for i := range 10 {
		ids = append(ids, fmt.Sprintf("m%d", i))
	}
	produce(t, kc, 0, ids...)
	var fixed atomic.Bool
	var st settlements
	c, err := kafka.NewConsumer(newStore(t, rc, prefix(t), "w", time.Second),
		func(_ context.Context, r *kgo.Record) error {
			if header(r) == "m3" && !fixed.Load() {
				return errors.New("not yet")
			}
			return nil
		},
		kafka.Options{Group: "g", Topics: []string{topic}, Client: clientOpts(kc), CommitInterval: 100 * time.Millisecond,
			MinDelay: 10 * time.Millisecond, MaxDelay: 20 * time.Millisecond, Logger: quiet, OnSettle: st.on})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done; c.Close() }()
	for st.count(kafka.Retry) < 5 || committed(t, kc, "g")[0] != 3 {
		if off := committed(t, kc, "g")[0]; off > 3 {
			t.Fatalf("committed offset %d passes the failing record at offset 3", off)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // several commit intervals
	if off := committed(t, kc, "g")[0]; off != 3 {
		t.Fatalf("committed offset %d; want 3, the failing record's", off)
	}
	if n := st.count(kafka.Commit); n != 9 {
		t.Errorf("%d records done while m3 fails; want the 9 others", n)
	}
	fixed.Store(true)
	deadline := time.Now().Add(10 * time.Second)
	for committed(t, kc, "g")[0] != 10 {
		if time.Now().After(deadline) {
			t.Fatalf("committed offset %d; want 10 once m3 succeeds", committed(t, kc, "g")[0])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A record whose key another consumer holds is retried in place, holding
// the offset, until the holder confirms it: then it is a duplicate, and
// the handler never runs for it.
func TestInProgressRetriedInPlace(t *testing.T) {
	rc := testRedis(t)
	kc := newCluster(t, 1)
	pfx := prefix(t)
	holder := newStore(t, rc, pfx, "holder", 5*time.Second)
	cl, err := holder.Claim(context.Background(), "m1", nil)
	if err != nil || cl.Outcome != idem.Claimed {
		t.Fatalf("Claim = %+v, %v", cl, err)
	}
	produce(t, kc, 0, "m0", "m1", "m2")
	var eff effects
	var st settlements
	c, err := kafka.NewConsumer(newStore(t, rc, pfx, "w", 5*time.Second),
		func(_ context.Context, r *kgo.Record) error { eff.add(header(r)); return nil },
		kafka.Options{Group: "g", Topics: []string{topic}, Client: clientOpts(kc), CommitInterval: 100 * time.Millisecond,
			MinDelay: 10 * time.Millisecond, MaxDelay: 40 * time.Millisecond, Logger: quiet, OnSettle: st.on})
	if err != nil {
		t.Fatal(err)
	}
	confirmed := false
	runUntil(t, c, func() bool {
		off := committed(t, kc, "g")[0]
		if off > 1 && !confirmed {
			t.Fatalf("committed offset %d passes m1, in progress elsewhere", off)
		}
		if !confirmed && st.count(kafka.Retry) >= 3 && off == 1 {
			if err := holder.Confirm(context.Background(), cl.Lease, nil); err != nil {
				t.Fatal(err)
			}
			confirmed = true
		}
		return confirmed && off == 3
	})
	if eff.get("m1") != 0 || eff.get("m0") != 1 || eff.get("m2") != 1 {
		t.Errorf("effects %v; want m0 and m2 once, m1 never (its holder did it)", eff.n)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	for i, s := range st.all {
		if s.Action == kafka.Retry && !errors.Is(s.Err, idem.ErrInProgress) {
			t.Errorf("retry %d: Err = %v; want ErrInProgress", i, s.Err)
		}
	}
}

// A handler failing MaxAttempts times goes to DeadLetter, and the offset
// passes it; a fingerprint mismatch goes there at once.
func TestDeadLetter(t *testing.T) {
	rc := testRedis(t)
	kc := newCluster(t, 1)
	pfx := prefix(t)
	// "fp" was done before with another fingerprint.
	s := newStore(t, rc, pfx, "w", time.Second)
	if cl, err := s.Claim(context.Background(), "fp", []byte("other")); err != nil {
		t.Fatal(err)
	} else if err := s.Confirm(context.Background(), cl.Lease, nil); err != nil {
		t.Fatal(err)
	}
	produce(t, kc, 0, "m0", "bad", "fp", "m3")
	errBad := errors.New("bad record")
	var attempts atomic.Int64
	var mu sync.Mutex
	dead := map[string]error{}
	c, err := kafka.NewConsumer(s,
		func(_ context.Context, r *kgo.Record) error {
			if header(r) == "bad" {
				attempts.Add(1)
				return errBad
			}
			return nil
		},
		kafka.Options{Group: "g", Topics: []string{topic}, Client: clientOpts(kc), CommitInterval: 100 * time.Millisecond,
			MinDelay: 5 * time.Millisecond, MaxAttempts: 3, Logger: quiet,
			Fingerprint: func(r *kgo.Record) []byte { return r.Value },
			DeadLetter: func(_ context.Context, r *kgo.Record, err error) error {
				mu.Lock()
				defer mu.Unlock()
				dead[header(r)] = err
				return nil
			}})
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, c, func() bool { return committed(t, kc, "g")[0] == 4 })
	mu.Lock()
	defer mu.Unlock()
	if n := attempts.Load(); n != 3 {
		t.Errorf("bad attempted %d times; want MaxAttempts 3", n)
	}
	if !errors.Is(dead["bad"], errBad) || !errors.Is(dead["fp"], idem.ErrFingerprintMismatch) || len(dead) != 2 {
		t.Errorf("dead-lettered %v; want bad (its error) and fp (fingerprint mismatch)", dead)
	}
}

// A handler's success whose Confirm fails past its budget is committed
// and logged as an error, never retried in place: a retry would claim the
// key once the lease runs out and do the work a second time.
func TestNotRecordedIsCommitted(t *testing.T) {
	rc := testRedis(t)
	kc := newCluster(t, 1)
	produce(t, kc, 0, "m0", "m1")
	var eff effects
	var st settlements
	var logs syncBuffer
	store := unconfirmable{newStore(t, rc, prefix(t), "w", 500*time.Millisecond)}
	c, err := kafka.NewConsumer(store, func(_ context.Context, r *kgo.Record) error { eff.add(header(r)); return nil },
		kafka.Options{Group: "g", Topics: []string{topic}, Client: clientOpts(kc), CommitInterval: 100 * time.Millisecond,
			ConfirmBudget: 20 * time.Millisecond, MinDelay: 10 * time.Millisecond, OnSettle: st.on,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, c, func() bool { return committed(t, kc, "g")[0] == 2 || st.count(kafka.Retry) > 0 })
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.all) != 2 {
		t.Fatalf("settlements %+v; want two", st.all)
	}
	for i, s := range st.all {
		if s.Action != kafka.Commit || !errors.Is(s.Err, consumer.ErrNotRecorded) {
			t.Errorf("offset %d settled %+v; want Commit with ErrNotRecorded, never a retry", st.offs[i], s)
		}
	}
	if eff.get("m0") != 1 || eff.get("m1") != 1 {
		t.Errorf("effects %v; want m0 and m1 once each", eff.n)
	}
	if l := logs.String(); strings.Count(l, "level=ERROR") != 2 || !strings.Contains(l, "not recorded") {
		t.Errorf("log = %q; want both unrecorded works reported at error level", l)
	}
}

// A fingerprint too large for any store never succeeds: without a
// DeadLetter it is skipped (logged) and the offset passes it, like every
// error consumer.ActionFor dead-letters, instead of holding the partition
// back forever.
func TestOversizedFingerprintSkipped(t *testing.T) {
	rc := testRedis(t)
	kc := newCluster(t, 1)
	produce(t, kc, 0, "m0")
	var eff effects
	var st settlements
	c, err := kafka.NewConsumer(newStore(t, rc, prefix(t), "w", time.Second),
		func(_ context.Context, r *kgo.Record) error { eff.add(header(r)); return nil },
		kafka.Options{Group: "g", Topics: []string{topic}, Client: clientOpts(kc), CommitInterval: 100 * time.Millisecond,
			MinDelay: 10 * time.Millisecond, OnSettle: st.on, Logger: quiet,
			Fingerprint: func(*kgo.Record) []byte { return make([]byte, idem.MaxFingerprintBytes+1) }})
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, c, func() bool { return committed(t, kc, "g")[0] == 1 || st.count(kafka.Retry) > 0 })
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.all) != 1 || st.all[0].Action != kafka.Skip || !errors.Is(st.all[0].Err, idem.ErrTooLarge) || eff.get("m0") != 0 {
		t.Errorf("oversized fingerprint: settlements %+v, effects %v; want one Skip with ErrTooLarge, no effect", st.all, eff.n)
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

// Without DeadLetter a failing handler is retried in place, past
// MaxAttempts, and the offset stays at it.
func TestHandlerErrorRetriedWithoutDeadLetter(t *testing.T) {
	rc := testRedis(t)
	kc := newCluster(t, 1)
	produce(t, kc, 0, "bad", "m1")
	var attempts atomic.Int64
	c, err := kafka.NewConsumer(newStore(t, rc, prefix(t), "w", time.Second),
		func(_ context.Context, r *kgo.Record) error {
			if header(r) == "bad" {
				attempts.Add(1)
				return errors.New("bad")
			}
			return nil
		},
		kafka.Options{Group: "g", Topics: []string{topic}, Client: clientOpts(kc), CommitInterval: 100 * time.Millisecond,
			MinDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond, MaxAttempts: 2, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, c, func() bool { return attempts.Load() >= 10 })
	if off, ok := committed(t, kc, "g")[0]; ok && off != 0 {
		t.Errorf("committed offset %d; want none past the failing record", off)
	}
}

// The key is the header by default, the record key with UseRecordKey, and
// the record's place in the log without either.
func TestKeys(t *testing.T) {
	rc := testRedis(t)
	for _, tc := range []struct {
		name     string
		useKey   bool
		produced []string
		want     int // effects
	}{
		{"header", false, []string{"a", "a", "b"}, 2},
		{"record key", true, []string{"a", "a", "b"}, 2},
		{"no header: place in the log", false, []string{"", "", ""}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kc := newCluster(t, 1)
			produce(t, kc, 0, tc.produced...)
			var n atomic.Int64
			var keys sync.Map
			c, err := kafka.NewConsumer(newStore(t, rc, prefix(t), "w", time.Second),
				func(ctx context.Context, r *kgo.Record) error { n.Add(1); keys.Store(r.Offset, true); return nil },
				kafka.Options{Group: "g", Topics: []string{topic}, Client: clientOpts(kc), UseRecordKey: tc.useKey,
					KeyHeader:      map[bool]string{true: "", false: kafka.DefaultKeyHeader}[tc.useKey],
					CommitInterval: 100 * time.Millisecond, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			runUntil(t, c, func() bool { return committed(t, kc, "g")[0] == int64(len(tc.produced)) })
			if got := n.Load(); got != int64(tc.want) {
				t.Errorf("%d effects; want %d", got, tc.want)
			}
		})
	}
}

// Mistakes are refused at construction, naming the field.
func TestOptionsMistakes(t *testing.T) {
	s := memStore(idem.Options{})
	h := func(context.Context, *kgo.Record) error { return nil }
	ok := kafka.Options{Group: "g", Topics: []string{topic}, Client: []kgo.Opt{kgo.SeedBrokers("127.0.0.1:1")}}
	// Each message has the one shape of every package's: "<pkg>: <Field>:
	// <value> <rule>", and what 0 means where it means the default.
	for want, mod := range map[string]func(*kafka.Options){
		`kafka: Group: "" is empty; set the consumer group`:                                          func(o *kafka.Options) { o.Group = "" },
		"kafka: Topics: [] is empty; list the topics to consume":                                     func(o *kafka.Options) { o.Topics = nil },
		`kafka: Topics[1]: "" is empty; name a topic`:                                                func(o *kafka.Options) { o.Topics = []string{topic, ""} },
		"kafka: MaxAttempts: -1 is negative; 0 means the default, 3":                                 func(o *kafka.Options) { o.MaxAttempts = -1 },
		"kafka: MaxPollRecords: -1 is negative; 0 means the default, 500":                            func(o *kafka.Options) { o.MaxPollRecords = -1 },
		"kafka: MinDelay: -1ns is negative; 0 means the default, 50ms":                               func(o *kafka.Options) { o.MinDelay = -1 },
		"kafka: MaxDelay: -1ns is negative; 0 means the default, 5s":                                 func(o *kafka.Options) { o.MaxDelay = -1 },
		"kafka: MaxDelay: 1ms is less than MinDelay 1s":                                              func(o *kafka.Options) { o.MinDelay, o.MaxDelay = time.Second, time.Millisecond },
		"kafka: CommitInterval: -1ns is negative; 0 means the default, 1s":                           func(o *kafka.Options) { o.CommitInterval = -1 },
		"kafka: Concurrency: -1 is negative; 0 means the default, 16":                                func(o *kafka.Options) { o.Concurrency = -1 },
		"kafka: ConfirmBudget: -1ns is negative; 0 means the default, two thirds of the lease's TTL": func(o *kafka.Options) { o.ConfirmBudget = -1 },
		"kafka: CommitInterval: 10ms is under 100ms, franz-go's minimum; 0 means the default, 1s": func(o *kafka.Options) {
			o.CommitInterval = 10 * time.Millisecond
		},
	} {
		o := ok
		mod(&o)
		_, err := kafka.NewConsumer(s, h, o)
		if err == nil || err.Error() != want {
			t.Errorf("NewConsumer error %v; want %q", err, want)
		}
	}
	c, err := kafka.NewConsumer(s, h, ok)
	if err != nil {
		t.Fatalf("valid options: %v", err)
	}
	c.Close()
	for name, f := range map[string]func(){
		"nil store":   func() { _, _ = kafka.NewConsumer(nil, h, ok) },
		"nil handler": func() { _, _ = kafka.NewConsumer(s, nil, ok) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
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

// A quarantined key (its records crashed more consumers in a row than the
// store's MaxTakeOvers) is dead-lettered as consumer.ActionFor says: handed
// to DeadLetter with ErrQuarantined when there is one, else skipped and
// logged as waiting for an operator; either way the offset passes it
// instead of holding the partition back, and the handler does not run.
func TestQuarantinedDeadLettered(t *testing.T) {
	for _, withDL := range []bool{true, false} {
		t.Run(map[bool]string{true: "DeadLetter", false: "Skip"}[withDL], func(t *testing.T) {
			rc := testRedis(t)
			kc := newCluster(t, 1)
			s, err := idem.NewRedisStore(rc, idem.RedisOptions{Prefix: prefix(t), Worker: "w", LeaseTTL: idem.MinLeaseTTL,
				Retention: time.Minute, MaxTakeOvers: 1})
			if err != nil {
				t.Fatal(err)
			}
			for range 2 { // the first attempt and one take-over, each crashed
				cl, err := s.Claim(context.Background(), "poison", nil)
				if err != nil || cl.Outcome != idem.Claimed {
					t.Fatalf("Claim(poison) = %v, %v; want Claimed", cl.Outcome, err)
				}
				time.Sleep(cl.Lease.TTL + 20*time.Millisecond)
			}
			produce(t, kc, 0, "poison", "m1")
			var eff effects
			var st settlements
			var logs syncBuffer
			var mu sync.Mutex
			dead := map[string]error{}
			o := kafka.Options{Group: "g", Topics: []string{topic}, Client: clientOpts(kc), CommitInterval: 100 * time.Millisecond,
				MinDelay: 5 * time.Millisecond, OnSettle: st.on, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
			if withDL {
				o.DeadLetter = func(_ context.Context, r *kgo.Record, err error) error {
					mu.Lock()
					defer mu.Unlock()
					dead[header(r)] = err
					return nil
				}
			}
			c, err := kafka.NewConsumer(s, func(_ context.Context, r *kgo.Record) error { eff.add(header(r)); return nil }, o)
			if err != nil {
				t.Fatal(err)
			}
			runUntil(t, c, func() bool { return committed(t, kc, "g")[0] == 2 })
			if eff.get("poison") != 0 || eff.get("m1") != 1 {
				t.Errorf("effects %v; want poison not run, m1 once", eff.n)
			}
			want := kafka.Skip
			if withDL {
				want = kafka.DeadLetter
				mu.Lock()
				if !errors.Is(dead["poison"], idem.ErrQuarantined) || len(dead) != 1 {
					t.Errorf("dead-lettered %v; want poison with ErrQuarantined", dead)
				}
				mu.Unlock()
			} else if l := logs.String(); !strings.Contains(l, "quarantined") {
				t.Errorf("log = %q; want the skip to say the key is quarantined", l)
			}
			if st.count(want) != 1 {
				t.Errorf("%d settlements %v; want 1", st.count(want), want)
			}
		})
	}
}
