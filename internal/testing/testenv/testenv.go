// Package testenv finds the real services that integration tests run
// against. Each is named by an environment variable; `make test` starts the
// services and sets them.
//
// Without its variable a test skips with a line saying so, except under
// CI=true, where a missing service fails the test: a green CI run always
// means the real services were exercised.
package testenv

import (
	"context"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The variables that name the services.
const (
	RedisAddrVar      = "IDEM_REDIS_ADDR"            // host:port of a standalone Redis
	ClusterAddrsVar   = "IDEM_REDIS_CLUSTER_ADDRS"   // comma-separated host:port of a Redis Cluster's masters
	PostgresDSNVar    = "IDEM_POSTGRES_DSN"          // a Postgres connection string
	MySQLDSNVar       = "IDEM_MYSQL_DSN"             // a MySQL or MariaDB DSN of go-sql-driver/mysql
	SentinelAddrsVar  = "IDEM_REDIS_SENTINEL_ADDRS"  // comma-separated host:port of Redis Sentinels
	SentinelMasterVar = "IDEM_REDIS_SENTINEL_MASTER" // the master name the sentinels watch
)

// Lookup returns the variable's value, or skips t (fails it under CI=true)
// when it is unset.
func Lookup(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v != "" {
		return v
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is not set: under CI=true the real service is required (run `make test`)", name)
	}
	t.Skipf("%s is not set: skipping the test against the real service (`make test` starts it)", name)
	return ""
}

// Redis returns a client of the standalone Redis, closed when t ends. It
// fails t when the server does not answer.
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: Lookup(t, RedisAddrVar)})
	t.Cleanup(func() { _ = c.Close() })
	ping(t, c)
	return c
}

// Cluster returns a client of the Redis Cluster, closed when t ends. It fails
// t when the cluster does not answer.
func Cluster(t testing.TB) *redis.ClusterClient {
	t.Helper()
	return clusterClient(t, strings.Split(Lookup(t, ClusterAddrsVar), ","))
}

// clusterClient returns a client of the cluster of addrs, closed when t
// ends, once every master answers.
func clusterClient(t testing.TB, addrs []string) *redis.ClusterClient {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = c.Close() })
	ping(t, c)
	if err := c.ForEachMaster(context.Background(), func(ctx context.Context, c *redis.Client) error {
		return c.Ping(ctx).Err()
	}); err != nil {
		t.Fatalf("Redis Cluster masters do not answer: %v", err)
	}
	return c
}

// Sentinel returns a failover client of the Sentinel set's master, closed
// when t ends. It fails t when the master does not answer.
func Sentinel(t testing.TB) *redis.Client {
	t.Helper()
	addrs := strings.Split(Lookup(t, SentinelAddrsVar), ",")
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: Lookup(t, SentinelMasterVar), SentinelAddrs: addrs})
	t.Cleanup(func() { _ = c.Close() })
	ping(t, c)
	return c
}

func ping(t testing.TB, c redis.UniversalClient) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("Redis does not answer: %v", err)
	}
}

// PostgresDSN returns the connection string of the Postgres that tests may
// create tables in, or skips t (fails it under CI=true) when
// IDEM_POSTGRES_DSN is unset.
func PostgresDSN(t testing.TB) string {
	t.Helper()
	return Lookup(t, PostgresDSNVar)
}

// MySQLDSN returns the DSN (go-sql-driver/mysql's form,
// user@tcp(host:port)/db) of the MySQL or MariaDB that tests may create
// tables in, or skips t (fails it under CI=true) when IDEM_MYSQL_DSN is
// unset.
func MySQLDSN(t testing.TB) string {
	t.Helper()
	return Lookup(t, MySQLDSNVar)
}

// IOCounter is a go-redis hook that counts everything a client dials or
// sends (a pipeline counts each of its commands). A store that checks its
// input before any I/O leaves it at zero.
type IOCounter struct{ N atomic.Int64 }

// DialHook counts a dial.
func (c *IOCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c.N.Add(1)
		return next(ctx, network, addr)
	}
}

// ProcessHook counts a command.
func (c *IOCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.N.Add(1)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook counts a pipeline's commands.
func (c *IOCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.N.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}
