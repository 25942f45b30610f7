package redisstream_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer/redisstream"
	"github.com/redis/go-redis/v9"
)

var quiet = slog.New(slog.DiscardHandler)

// unique returns a name of this test's own, with a hash tag so that on a
// cluster the stream (and its group) and anything named after it share a
// slot.
func unique(t testing.TB, what string) string {
	return fmt.Sprintf("{idemtest:%s:%s:%d}", what, t.Name(), time.Now().UnixNano())
}

// prefix returns a store prefix of this test's own.
func prefix(t testing.TB) string {
	return fmt.Sprintf("idemtest:redisstream:%s:%d:", t.Name(), time.Now().UnixNano())
}

func newStore(t testing.TB, c redis.UniversalClient, prefix, worker string, ttl time.Duration) *idem.RedisStore {
	t.Helper()
	// MaxTakeOvers: the fleet test crashes and stops readers on purpose,
	// and on a busy machine a stalled renewal adds take-overs of its own;
	// these tests check once-ness, storetest that a crash loop stops.
	s, err := idem.NewRedisStore(c, idem.RedisOptions{Prefix: prefix, Worker: worker, LeaseTTL: ttl,
		Retention: time.Minute, MaxTakeOvers: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// add appends one entry per value of field id ("" : no id field).
func add(t testing.TB, c redis.Cmdable, stream string, ids ...string) {
	t.Helper()
	ctx := context.Background()
	p := c.Pipeline()
	for _, id := range ids {
		v := map[string]any{"body": "payload of " + id}
		if id != "" {
			v["id"] = id
		}
		p.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: v})
	}
	if _, err := p.Exec(ctx); err != nil {
		t.Fatalf("XADD: %v", err)
	}
	t.Cleanup(func() { _ = c.Del(context.Background(), stream).Err() })
}

// settlements collects a reader's settlements.
type settlements struct {
	mu  sync.Mutex
	all []redisstream.Settlement
	ids []string
}

func (s *settlements) on(m *redis.XMessage, st redisstream.Settlement) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.all = append(s.all, st)
	s.ids = append(s.ids, m.ID)
}

func (s *settlements) count(a redisstream.Action) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, st := range s.all {
		if st.Action == a {
			n++
		}
	}
	return n
}

// runUntil runs r until cond holds (checked every 10ms) or 10s pass, then
// stops it and waits for Run to return.
func runUntil(t testing.TB, r *redisstream.Reader, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatal("condition not met within 10s")
		}
		select {
		case err := <-done:
			cancel()
			t.Fatalf("Run returned early: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; err != context.Canceled {
		t.Errorf("Run = %v; want context.Canceled", err)
	}
}

// pending returns the number of the group's pending entries.
func pending(t testing.TB, c redis.Cmdable, stream, group string) int64 {
	t.Helper()
	p, err := c.XPending(context.Background(), stream, group).Result()
	if err != nil {
		t.Fatalf("XPENDING: %v", err)
	}
	return p.Count
}
