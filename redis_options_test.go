package idem

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/testenv"
)

// --- 6. Eviction policy -----------------------------------------------------

// TestRedisEvictionPolicy changes the shared Redis's maxmemory-policy for a
// moment: not parallel, and restored at once.
func TestRedisEvictionPolicy(t *testing.T) {
	// A Redis of its own: other packages' tests open stores on the shared
	// one at the same time, and would be refused while the policy is unsafe.
	c := privateRedis(t)
	ctx := context.Background()
	was, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		t.Fatalf("CONFIG GET maxmemory-policy: %v", err)
	}
	if was["maxmemory-policy"] != "noeviction" {
		t.Fatalf("maxmemory-policy is %q; want the test Redis at noeviction", was["maxmemory-policy"])
	}
	if err := c.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatalf("CONFIG SET maxmemory-policy allkeys-lru: %v", err)
	}
	t.Cleanup(func() {
		if err := c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
			t.Errorf("restoring maxmemory-policy noeviction: %v", err)
		}
	})
	_, err = NewRedisStore(c, RedisOptions{Prefix: testenv.UniquePrefix()})
	if err == nil || !strings.Contains(err.Error(), "allkeys-lru") {
		t.Errorf("NewRedisStore on allkeys-lru = %v; want an error naming the policy", err)
	}
	if _, err := NewRedisStore(c, RedisOptions{Prefix: testenv.UniquePrefix(), AllowEviction: true}); err != nil {
		t.Errorf("NewRedisStore on allkeys-lru with AllowEviction = %v; want nil", err)
	}
	if err := c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatalf("restoring maxmemory-policy noeviction: %v", err)
	}
	if _, err := NewRedisStore(c, RedisOptions{Prefix: testenv.UniquePrefix()}); err != nil {
		t.Errorf("NewRedisStore on noeviction = %v; want nil", err)
	}
}

// TestRedisEvictionPolicyCluster: one master that may evict is enough to
// refuse the cluster.
func TestRedisEvictionPolicyCluster(t *testing.T) {
	c := testenv.Cluster(t)
	ctx := context.Background()
	var one *redis.Client
	var mu sync.Mutex
	_ = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		if one == nil || m.Options().Addr > one.Options().Addr {
			one = m
		}
		return nil
	})
	if err := one.ConfigSet(ctx, "maxmemory-policy", "volatile-ttl").Err(); err != nil {
		t.Fatalf("CONFIG SET maxmemory-policy volatile-ttl on %s: %v", one.Options().Addr, err)
	}
	t.Cleanup(func() {
		if err := one.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
			t.Errorf("restoring maxmemory-policy noeviction on %s: %v", one.Options().Addr, err)
		}
	})
	_, err := NewRedisStore(c, RedisOptions{Prefix: testenv.UniquePrefix()})
	if err == nil || !strings.Contains(err.Error(), "volatile-ttl") {
		t.Errorf("NewRedisStore on a cluster with one volatile-ttl master = %v; want an error naming the policy", err)
	}
}

// TestRedisEvictionPolicyConfigRefused: a real Redis with CONFIG renamed
// away, as managed services do, still tells its policy in INFO memory: an
// evicting one is refused all the same.
func TestRedisEvictionPolicyConfigRefused(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		policy  string
		refused bool
	}{{"allkeys-lru", true}, {"volatile-ttl", true}, {"noeviction", false}} {
		srv := testenv.StartRedisServer(t, "--appendonly", "no", "--maxmemory-policy", tt.policy, "--rename-command", "CONFIG", "")
		c := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { _ = c.Close() })
		if err := c.ConfigGet(context.Background(), "maxmemory-policy").Err(); err == nil {
			t.Fatalf("CONFIG GET answered on a server with CONFIG renamed; want it refused")
		}
		_, err := NewRedisStore(c, RedisOptions{Prefix: testenv.UniquePrefix()})
		switch {
		case tt.refused && (err == nil || !strings.Contains(err.Error(), tt.policy)):
			t.Errorf("NewRedisStore on %s with CONFIG refused = %v; want an error naming the policy", tt.policy, err)
		case !tt.refused && err != nil:
			t.Errorf("NewRedisStore on %s with CONFIG refused = %v; want nil", tt.policy, err)
		}
	}
}

// TestRedisEvictionPolicyUnreadable: miniredis answers neither CONFIG nor
// INFO memory with the policy: the store is made, with a warning.
func TestRedisEvictionPolicyUnreadable(t *testing.T) {
	t.Parallel()
	_, c := newMiniredisClient(t)
	if err := c.ConfigGet(context.Background(), "maxmemory-policy").Err(); err == nil {
		t.Fatalf("miniredis answered CONFIG GET; this test needs a server that refuses it")
	}
	if _, err := NewRedisStore(c, RedisOptions{}); err != nil {
		t.Errorf("NewRedisStore on a server refusing CONFIG, no Logger = %v; want nil", err)
	}
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	if _, err := NewRedisStore(c, RedisOptions{Logger: logger}); err != nil {
		t.Errorf("NewRedisStore on a server refusing CONFIG = %v; want nil", err)
	}
	if got := logs.String(); !strings.Contains(got, "level=WARN") || !strings.Contains(got, "maxmemory-policy") {
		t.Errorf("log = %q; want a warning about maxmemory-policy", got)
	}
}

// --- 7. Options -------------------------------------------------------------

func TestRedisOptionsRefused(t *testing.T) {
	t.Parallel()
	_, c := newMiniredisClient(t)
	var nilClient *redis.Client
	// Each mistake is refused with a message that names the one field at
	// fault (and never one the user did not set).
	for _, tt := range []struct {
		name string
		c    redis.UniversalClient
		o    RedisOptions
		want string
	}{
		{"nil client", nil, RedisOptions{}, "nil client"},
		{"typed nil client", nilClient, RedisOptions{}, "nil client"},
		{"typed nil client, AllowEviction", nilClient, RedisOptions{AllowEviction: true}, "nil client"},
		{"prefix with {", c, RedisOptions{Prefix: "a{"}, `Prefix "a{"`},
		{"prefix with }", c, RedisOptions{Prefix: "}a:"}, `Prefix "}a:"`},
		{"prefix with a hash tag", c, RedisOptions{Prefix: "{tenant}:"}, `Prefix "{tenant}:"`},
		{"negative Retention", c, RedisOptions{Retention: -time.Second}, "negative Retention -1s"},
		{"negative LeaseTTL", c, RedisOptions{LeaseTTL: -1}, "negative LeaseTTL -1ns"},
		{"sub-millisecond LeaseTTL", c, RedisOptions{LeaseTTL: 500 * time.Microsecond}, "LeaseTTL 500µs is under 1ms"},
		{"sub-millisecond Retention", c, RedisOptions{Retention: time.Microsecond}, "Retention 1µs is under 1ms"},
		{"Retention shorter than LeaseTTL", c, RedisOptions{Retention: time.Second, LeaseTTL: time.Minute}, "Retention 1s is shorter than LeaseTTL 1m0s"},
		{"LeaseTTL over the default Retention", c, RedisOptions{LeaseTTL: 48 * time.Hour}, "LeaseTTL 48h0m0s is longer than the default Retention"},
		{"negative MaxKeyBytes", c, RedisOptions{MaxKeyBytes: -1}, "negative MaxKeyBytes -1"},
		{"negative MaxResultBytes", c, RedisOptions{MaxResultBytes: -1}, "negative MaxResultBytes -1"},
		{"Worker with NUL", c, RedisOptions{Worker: "a\x00b"}, "Worker"},
		{"negative WaitReplicas", c, RedisOptions{WaitReplicas: -1}, "negative WaitReplicas -1"},
		{"negative WaitTimeout", c, RedisOptions{WaitReplicas: 1, WaitTimeout: -time.Second}, "negative WaitTimeout -1s"},
		{"sub-millisecond WaitTimeout", c, RedisOptions{WaitReplicas: 1, WaitTimeout: time.Microsecond}, "WaitTimeout 1µs must be at least 1ms"},
		{"WaitTimeout not below ReadTimeout", c, RedisOptions{WaitReplicas: 1, WaitTimeout: c.Options().ReadTimeout}, "must be shorter than the client's ReadTimeout"},
	} {
		s, err := func() (s *RedisStore, err error) {
			defer func() {
				if p := recover(); p != nil {
					err = fmt.Errorf("panic: %v", p)
				}
			}()
			return NewRedisStore(tt.c, tt.o)
		}()
		if err == nil || strings.HasPrefix(err.Error(), "panic") || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("NewRedisStore(%s) = %v, %v; want an error saying %q", tt.name, s, err, tt.want)
		}
	}
	s, err := NewRedisStore(c, RedisOptions{})
	if err != nil {
		t.Fatalf("NewRedisStore(zero options) = %v; want nil", err)
	}
	if got := s.redisKey("k"); got != "idem:{k}" {
		t.Errorf("redisKey(%q) with the default prefix = %q; want %q", "k", got, "idem:{k}")
	}
}

// --- 8. UniversalClient -----------------------------------------------------

func TestRedisUniversalClient(t *testing.T) {
	for _, backend := range []struct {
		name  string
		addrs func(t *testing.T) []string
	}{
		{"redis", func(t *testing.T) []string { return []string{testenv.Lookup(t, testenv.RedisAddrVar)} }},
		{"cluster", func(t *testing.T) []string {
			return strings.Split(testenv.Lookup(t, testenv.ClusterAddrsVar), ",")
		}},
	} {
		t.Run(backend.name, func(t *testing.T) {
			t.Parallel()
			c := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: backend.addrs(t)})
			t.Cleanup(func() { _ = c.Close() })
			s := newTestRedisStore(t, c, RedisOptions{})
			ctx := context.Background()
			key := uuid.NewString()
			cl, err := s.Claim(ctx, key, []byte("fp"))
			if err != nil || cl.Outcome != Claimed {
				t.Fatalf("Claim(%q) = %v, %v; want claimed", key, cl.Outcome, err)
			}
			if again, err := s.Claim(ctx, key, []byte("fp")); err != nil || again.Outcome != InProgress {
				t.Fatalf("second Claim(%q) = %v, %v; want in-progress", key, again.Outcome, err)
			}
			if err := s.Confirm(ctx, cl.Lease, []byte("done")); err != nil {
				t.Fatalf("Confirm(%q): %v", key, err)
			}
			d, err := s.Claim(ctx, key, []byte("fp"))
			if err != nil || d.Outcome != Duplicate || string(d.Record.Result) != "done" {
				t.Fatalf("Claim(%q) after Confirm = %+v, %v; want duplicate with result %q", key, d, err, "done")
			}
			keys := uuidKeys(30)
			if err := s.ConfirmBatch(ctx, claimAllOK(t, s, keys, nil), nil); err != nil {
				t.Fatalf("ConfirmBatch: %v", err)
			}
			checkAllDuplicate(t, s, keys)
		})
	}
}
