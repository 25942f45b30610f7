package idem

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/redisadmin"
	"github.com/idemgo/idem/internal/testenv"
)

// --- 9. Memory per record ---------------------------------------------------

// TestRedisMemoryPerRecord measures what a confirmed record costs Redis:
// used_memory before and after writing 100,000 of them. It runs on a Redis
// of its own, started from the same redis-server binary as the shared one:
// other packages' tests write to the shared Redis at the same time, and
// their records would be counted as ours.
func TestRedisMemoryPerRecord(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 200,000 records; skipped with -short")
	}
	c := privateRedis(t)
	ctx := context.Background()
	const n, batch = 100_000, 500
	measure := func(fp []byte) (perRecord, usage float64, keyLen int) {
		t.Helper()
		// A 6-byte prefix puts the key name (44 bytes) in the same
		// allocator size class as the default "idem:" does (43 bytes): what
		// a deployment pays. The keys are random UUIDs, so a prefix shared
		// with another run could not mix records up.
		var b [2]byte
		_, _ = rand.Read(b[:])
		prefix := "i" + hex.EncodeToString(b[:]) + ":"
		s := newTestRedisStore(t, c, RedisOptions{Prefix: prefix, Retention: 10 * time.Minute})
		keys := uuidKeys(n)
		var fps [][]byte
		if fp != nil {
			fps = make([][]byte, batch)
			for i := range fps {
				fps[i] = fp
			}
		}
		before := usedMemory(t, c)
		for i := 0; i < n; i += batch {
			if err := s.ConfirmBatch(ctx, claimAllOK(t, s, keys[i:i+batch], fps), nil); err != nil {
				t.Fatalf("ConfirmBatch: %v", err)
			}
		}
		after := usedMemory(t, c)
		var sum int64
		const sample = 200
		for _, k := range keys[:sample] {
			u, err := c.MemoryUsage(ctx, s.redisKey(k)).Result()
			if err != nil {
				t.Fatalf("MEMORY USAGE: %v", err)
			}
			sum += u
		}
		// Free the memory now rather than at cleanup: the next measure
		// starts from the same place.
		for i := 0; i < n; i += 1000 {
			rks := make([]string, 0, 1000)
			for _, k := range keys[i : i+1000] {
				rks = append(rks, s.redisKey(k))
			}
			if err := c.Unlink(ctx, rks...).Err(); err != nil {
				t.Fatalf("UNLINK: %v", err)
			}
		}
		return float64(after-before) / n, float64(sum) / sample, len(s.redisKey(keys[0]))
	}

	per, usage, keyLen := measure(nil)
	t.Logf("confirmed record, %d-byte Redis key, no fingerprint, empty result: %.1f bytes (used_memory), MEMORY USAGE %.0f",
		keyLen, per, usage)
	if per > 200 {
		t.Errorf("a confirmed record costs %.1f bytes of Redis memory; want at most 200", per)
	}
	per, usage, keyLen = measure(bytes.Repeat([]byte{0xAB}, 32))
	t.Logf("confirmed record, %d-byte Redis key, 32-byte fingerprint, empty result: %.1f bytes (used_memory), MEMORY USAGE %.0f",
		keyLen, per, usage)
}

// privateRedis starts a redis-server for t alone (testenv.StartRedisServer),
// configured as `make test` configures the shared one, and returns a
// client of it.
func privateRedis(t *testing.T) *redis.Client {
	t.Helper()
	srv := testenv.StartRedisServer(t, "--appendonly", "no")
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func usedMemory(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	v, ok := redisadmin.InfoField(context.Background(), c, "memory", "used_memory")
	if !ok {
		t.Fatalf("INFO memory: no used_memory")
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("INFO memory: used_memory %q: %v", v, err)
	}
	return n
}
