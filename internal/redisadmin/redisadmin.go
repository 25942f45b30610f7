// Package redisadmin is what the tests and `idem bench` do to a Redis
// beside the store: delete their keys by pattern (on a single Redis or on
// every master of a cluster), to leave a shared Redis as they found it, and
// read INFO fields.
package redisadmin

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// chunk is how many keys one SCAN step asks for and one pipeline unlinks.
const chunk = 1000

// Unlink unlinks every key that matches pattern (a SCAN MATCH glob) and
// returns how many keys it removed. On a cluster it scans every master. Keys
// written while it runs may be missed.
func Unlink(ctx context.Context, c redis.UniversalClient, pattern string) (int64, error) {
	var n atomic.Int64 // EachMaster runs fn on the masters at once
	err := EachMaster(ctx, c, func(ctx context.Context, m *redis.Client) error {
		k, err := unlink(ctx, m, pattern)
		n.Add(k)
		return err
	})
	return n.Load(), err
}

// EachMaster runs fn on every master of a cluster, at once, or on c itself
// when it is one Redis (or a Sentinel's failover client): where a SCAN of
// the whole keyspace must go.
func EachMaster(ctx context.Context, c redis.UniversalClient, fn func(ctx context.Context, m *redis.Client) error) error {
	switch c := c.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, fn)
	case *redis.Client:
		return fn(ctx, c)
	}
	return fmt.Errorf("redisadmin: a %T cannot be scanned; use a *redis.Client or *redis.ClusterClient", c)
}

func unlink(ctx context.Context, c *redis.Client, pattern string) (int64, error) {
	var n int64
	// One UNLINK per key: on a cluster master the keys are in different
	// slots, and a multi-key UNLINK across slots is refused (CROSSSLOT).
	del := func(keys []string) error {
		cmds, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range keys {
				p.Unlink(ctx, k)
			}
			return nil
		})
		// What UNLINK removed, not what was sent: SCAN may return a key
		// twice, and a key may expire before its UNLINK.
		for _, cmd := range cmds {
			if u, ok := cmd.(*redis.IntCmd); ok {
				n += u.Val()
			}
		}
		return err
	}
	iter := c.Scan(ctx, 0, pattern, chunk).Iterator()
	keys := make([]string, 0, chunk)
	for iter.Next(ctx) {
		if keys = append(keys, iter.Val()); len(keys) == chunk {
			if err := del(keys); err != nil {
				return n, err
			}
			keys = keys[:0]
		}
	}
	if err := iter.Err(); err != nil {
		return n, err
	}
	if len(keys) > 0 {
		if err := del(keys); err != nil {
			return n, err
		}
	}
	return n, nil
}

// InfoField returns one field of an INFO section of c; ok is false when
// INFO failed or has no such field.
func InfoField(ctx context.Context, c *redis.Client, section, field string) (v string, ok bool) {
	info, err := c.Info(ctx, section).Result()
	if err != nil {
		return "", false
	}
	return InfoValue(info, field)
}

// InfoValue returns a field of an INFO reply.
func InfoValue(info, field string) (v string, ok bool) {
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v, true
		}
	}
	return "", false
}

// ServerIdentity reads the product and version from the text of INFO
// server. Valkey names itself in server_name and reports its version as
// valkey_version (its redis_version is the Redis version it is compatible
// with); Redis has no server_name. version is "" when INFO has none.
func ServerIdentity(info string) (product, version string) {
	product, _ = InfoValue(info, "server_name")
	if product == "" {
		product = "redis"
	}
	version, _ = InfoValue(info, product+"_version")
	return product, version
}
