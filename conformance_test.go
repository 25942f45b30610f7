package idem_test

import (
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/storeopts"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/storetest"
	"github.com/redis/go-redis/v9"
)

// fakeClock is a clock that moves only when told.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func TestMemoryStoreConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Backend {
		clock := &fakeClock{now: time.Now()}
		var m *idem.MemoryStore
		var once sync.Once
		return storetest.Backend{
			Open: func(o idem.Options) (idem.Store, error) {
				once.Do(func() { m = idem.NewMemoryStoreClock(idem.Options{}, clock.Now) })
				return m.Share(o), nil
			},
			Advance: clock.Advance,
			Now:     clock.Now,
		}
	})
}

func TestRedisStoreConformanceMiniredis(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Backend {
		m := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { _ = c.Close() })
		return redisBackend(c, idem.RedisOptions{Prefix: "idem:"}, m.FastForward)
	})
}

// The suite again with AutoPipeline: every check must hold whether a call
// goes alone or in a pipeline with others.

func TestRedisStoreConformanceMiniredisAutoPipeline(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Backend {
		m := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { _ = c.Close() })
		return redisBackend(c, idem.RedisOptions{Prefix: "idem:", AutoPipeline: true}, m.FastForward)
	})
}

func TestRedisStoreConformanceAutoPipeline(t *testing.T) {
	c := testenv.Redis(t)
	storetest.Run(t, func(t *testing.T) storetest.Backend {
		return redisBackend(c, idem.RedisOptions{Prefix: testenv.UniquePrefix(), AutoPipeline: true}, nil)
	})
}

func TestRedisStoreConformanceClusterAutoPipeline(t *testing.T) {
	c := testenv.Cluster(t)
	storetest.Run(t, func(t *testing.T) storetest.Backend {
		return redisBackend(c, idem.RedisOptions{Prefix: testenv.UniquePrefix(), AutoPipeline: true}, nil)
	})
}

func TestRedisStoreConformance(t *testing.T) {
	c := testenv.Redis(t)
	storetest.Run(t, func(t *testing.T) storetest.Backend {
		return redisBackend(c, idem.RedisOptions{Prefix: testenv.UniquePrefix()}, nil)
	})
}

func TestRedisStoreConformanceCluster(t *testing.T) {
	c := testenv.Cluster(t)
	storetest.Run(t, func(t *testing.T) storetest.Backend {
		return redisBackend(c, idem.RedisOptions{Prefix: testenv.UniquePrefix()}, nil)
	})
}

// redisBackend opens RedisStores with ro's prefix and Redis options on c.
// Every record the suite writes expires within seconds, so nothing needs
// deleting.
func redisBackend(c redis.UniversalClient, ro idem.RedisOptions, advance func(time.Duration)) storetest.Backend {
	return storetest.Backend{
		Open: func(o idem.Options) (idem.Store, error) {
			so := storeopts.Redis(o)
			so.Prefix, so.AutoPipeline, so.WaitReplicas, so.WaitTimeout = ro.Prefix, ro.AutoPipeline, ro.WaitReplicas, ro.WaitTimeout
			return idem.NewRedisStore(c, so)
		},
		Advance: advance,
	}
}

func TestRedisStoreConformanceSentinel(t *testing.T) {
	c := testenv.Sentinel(t)
	storetest.Run(t, func(t *testing.T) storetest.Backend {
		return redisBackend(c, idem.RedisOptions{Prefix: testenv.UniquePrefix()}, nil)
	})
}
