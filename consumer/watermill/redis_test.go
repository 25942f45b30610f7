package watermill_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// testRedis returns a client of the real Redis named by IDEM_REDIS_ADDR,
// closed when t ends. Without the variable t skips, except under CI=true,
// where a missing service fails it: a green CI run always means the real
// service was exercised. (A copy of the root module's test rig: a module
// imports nothing from another module's internal/.)
func testRedis(t testing.TB) *redis.Client {
	t.Helper()
	addr := os.Getenv("IDEM_REDIS_ADDR")
	if addr == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("IDEM_REDIS_ADDR is not set: under CI=true the real service is required (run `make test`)")
		}
		t.Skip("IDEM_REDIS_ADDR is not set: skipping the test against the real service (`make test` starts it)")
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("Redis does not answer: %v", err)
	}
	return c
}
