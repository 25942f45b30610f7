package idem

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/google/uuid"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/redis/go-redis/v9"
)

// Tests of what is specific to RedisStore: round trips, lost replies, the
// script cache, damaged records, the eviction check, memory. What every
// store must do is storetest's.

// newTestRedisStore returns a store on c under a fresh prefix (unless o
// names one) and deletes the prefix's keys when t ends.
func newTestRedisStore(t testing.TB, c redis.UniversalClient, o RedisOptions) *RedisStore {
	t.Helper()
	if o.Prefix == "" {
		o.Prefix = testenv.UniquePrefix()
	}
	s, err := NewRedisStore(c, o)
	if err != nil {
		t.Fatalf("NewRedisStore: %v", err)
	}
	t.Cleanup(func() {
		if err := testenv.DeletePrefix(context.Background(), c, o.Prefix); err != nil {
			t.Errorf("deleting the test's keys %s*: %v", o.Prefix, err)
		}
	})
	return s
}

// newMiniredisClient returns a client of an in-process miniredis.
func newMiniredisClient(t testing.TB) (*miniredis.Miniredis, *redis.Client) {
	t.Helper()
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return m, c
}

// tripCounter is a go-redis hook that counts round trips: one per command
// sent alone, one per pipeline.
type tripCounter struct {
	mu    sync.Mutex
	trips int
	sent  []string // what each round trip carried, for failure messages
}

func (h *tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd.Name())
		return next(ctx, cmd)
	}
}

func (h *tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.count(fmt.Sprintf("pipeline of %d %s", len(cmds), cmdNames(cmds)))
		return next(ctx, cmds)
	}
}

func cmdNames(cmds []redis.Cmder) string {
	names := map[string]bool{}
	for _, c := range cmds {
		names[c.Name()] = true
	}
	var s []string
	for n := range names {
		s = append(s, n)
	}
	return strings.Join(s, ",")
}

func (h *tripCounter) count(what string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.trips++
	h.sent = append(h.sent, what)
}

// take returns the round trips counted since the last take, and what they
// carried.
func (h *tripCounter) take() (int, []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n, sent := h.trips, h.sent
	h.trips, h.sent = 0, nil
	return n, sent
}

// uuidKeys returns n fresh UUID strings: 36-byte keys, like message ids.
func uuidKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = uuid.NewString()
	}
	return keys
}

// claimAllOK claims keys in one batch and fails t unless every one is Claimed.
func claimAllOK(t testing.TB, s *RedisStore, keys []string, fps [][]byte) []*Lease {
	t.Helper()
	cs, err := s.ClaimBatch(context.Background(), keys, fps)
	if err != nil {
		t.Fatalf("ClaimBatch(%d keys): %v", len(keys), err)
	}
	leases := make([]*Lease, len(cs))
	for i, c := range cs {
		if c.Outcome != Claimed {
			t.Fatalf("ClaimBatch: item %d (%q) = %v; want claimed", i, keys[i], c.Outcome)
		}
		leases[i] = c.Lease
	}
	return leases
}

// checkAllDuplicate fails t unless every key is Duplicate in one batch.
func checkAllDuplicate(t testing.TB, s *RedisStore, keys []string) {
	t.Helper()
	cs, err := s.ClaimBatch(context.Background(), keys, nil)
	if err != nil {
		t.Fatalf("ClaimBatch(%d confirmed keys): %v", len(keys), err)
	}
	for i, c := range cs {
		if c.Outcome != Duplicate {
			t.Fatalf("ClaimBatch: confirmed item %d (%q) = %v; want duplicate", i, keys[i], c.Outcome)
		}
	}
}

// redisBackends are the single Redis servers a Redis-specific test runs on:
// miniredis for the logic, the real Redis for what only it shows.
var redisBackends = []struct {
	name   string
	client func(t *testing.T) *redis.Client
}{
	{"miniredis", func(t *testing.T) *redis.Client { _, c := newMiniredisClient(t); return c }},
	{"redis", func(t *testing.T) *redis.Client { return testenv.Redis(t) }},
}
