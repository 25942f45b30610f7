package redisadmin_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/redisadmin"
	"github.com/idemgo/idem/internal/testing/testenv"
)

// TestUnlink writes keys that match a pattern and keys that do not, spread
// over many hash slots, and checks that Unlink removes exactly the first,
// on one Redis and on every master of a cluster.
func TestUnlink(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    func(testing.TB) redis.UniversalClient
	}{
		{"standalone", func(t testing.TB) redis.UniversalClient { return testenv.Redis(t) }},
		{"cluster", func(t testing.TB) redis.UniversalClient { return testenv.Cluster(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.c(t)
			ctx := context.Background()
			prefix := testenv.UniquePrefix()
			// 2,500 matching keys: more than one SCAN step and one pipeline.
			const n = 2500
			keep := []string{prefix + "keep", "x" + prefix + "a"}
			for i := range n {
				if err := c.Set(ctx, prefix+"del:"+strconv.Itoa(i), "v", 0).Err(); err != nil {
					t.Fatal(err)
				}
			}
			for _, k := range keep {
				if err := c.Set(ctx, k, "v", 0).Err(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = c.Del(context.Background(), k).Err() })
			}
			got, err := redisadmin.Unlink(ctx, c, prefix+"del:*")
			if err != nil || got != n {
				t.Fatalf("Unlink = %d, %v; want %d, nil", got, err, n)
			}
			for _, k := range []string{prefix + "del:0", prefix + "del:" + strconv.Itoa(n-1)} {
				if e, err := c.Exists(ctx, k).Result(); err != nil || e != 0 {
					t.Errorf("EXISTS %s = %d, %v; want 0", k, e, err)
				}
			}
			for _, k := range keep {
				if e, err := c.Exists(ctx, k).Result(); err != nil || e != 1 {
					t.Errorf("EXISTS %s (not matched) = %d, %v; want 1", k, e, err)
				}
			}
			if again, err := redisadmin.Unlink(ctx, c, prefix+"del:*"); err != nil || again != 0 {
				t.Errorf("second Unlink = %d, %v; want 0, nil", again, err)
			}
		})
	}
}

func TestServerIdentity(t *testing.T) {
	for _, tc := range []struct {
		name, info, product, version string
	}{
		{"redis 7.0", "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\nredis_mode:standalone\r\n", "redis", "7.0.15"},
		{"redis 8.0", "# Server\r\nredis_version:8.0.2\r\nredis_mode:standalone\r\n", "redis", "8.0.2"},
		// Valkey reports the Redis version it is compatible with too: its
		// own is valkey_version.
		{"valkey 8.1", "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.1\r\n", "valkey", "8.1.1"},
		{"no version", "# Server\r\nredis_mode:standalone\r\n", "redis", ""},
	} {
		product, version := redisadmin.ServerIdentity(tc.info)
		if product != tc.product || version != tc.version {
			t.Errorf("%s: ServerIdentity = %q, %q; want %q, %q", tc.name, product, version, tc.product, tc.version)
		}
	}
}
