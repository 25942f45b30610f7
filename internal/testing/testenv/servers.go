package testenv

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/redisadmin"
)

// The variables that name the servers of the matrix beyond the standalone
// Redis 7 of RedisAddrVar: a shared instance of each, and its binary for
// the tests that start servers of their own (.ci/services.sh builds them).
const (
	Redis8AddrVar   = "IDEM_REDIS8_ADDR"   // host:port of a Redis 8.0
	Redis8ServerVar = "IDEM_REDIS8_SERVER" // path of Redis 8.0's redis-server
	ValkeyAddrVar   = "IDEM_VALKEY_ADDR"   // host:port of a Valkey 8.1
	ValkeyServerVar = "IDEM_VALKEY_SERVER" // path of Valkey 8.1's valkey-server
)

// A Server is one of the Redis-compatible servers the store is tested on.
// A test that must hold on each runs once per server (EachServer), its
// subtest named after the server, so that a failure says which one.
type Server struct {
	// Name names the server's subtests: the product and the version
	// tested, e.g. "valkey8.1".
	Name string
	// AddrVar is the variable holding the shared instance's host:port.
	AddrVar string
	// BinVar is the variable holding the path of the server's binary, for
	// tests that start servers of their own; empty for redis-server on
	// PATH.
	BinVar string

	product string // INFO's server_name ("redis" when it has none)
	version string // the start of the version INFO reports, e.g. "8.1."
}

// Servers are the servers of the matrix: Debian 12's Redis 7.0 (any Redis
// 7 elsewhere), Redis 8.0 and Valkey 8.1.
var Servers = []Server{
	{Name: "redis7", AddrVar: RedisAddrVar, product: "redis", version: "7."},
	{Name: "redis8.0", AddrVar: Redis8AddrVar, BinVar: Redis8ServerVar, product: "redis", version: "8.0."},
	{Name: "valkey8.1", AddrVar: ValkeyAddrVar, BinVar: ValkeyServerVar, product: "valkey", version: "8.1."},
}

// EachServer runs f as a subtest of t, named by the server, on each of
// Servers in turn. Each subtest skips (fails under CI=true) when its
// server's variable is unset, as Lookup does.
func EachServer(t *testing.T, f func(t *testing.T, s Server)) {
	t.Helper()
	for _, s := range Servers {
		t.Run(s.Name, func(t *testing.T) { f(t, s) })
	}
}

// Addr returns the shared instance's host:port, or skips t (fails it under
// CI=true) when its variable is unset. It fails t when the instance does
// not answer or is not the product and version s names, so that a variable
// pointing at the wrong server cannot pass for a run on s.
func (s Server) Addr(t testing.TB) string {
	t.Helper()
	addr := Lookup(t, s.AddrVar)
	s.check(t, &redis.Options{Addr: addr}, s.AddrVar+"="+addr)
	return addr
}

// Client returns a client of the shared instance (see Addr), closed when t
// ends.
func (s Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(t)})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// binary is the path of this kind's server binary. It skips t (fails it
// under CI=true) when the shared instance's variable, which says the
// machine has the server, or the binary's variable is unset.
func (s Server) binary(t testing.TB) string {
	t.Helper()
	Lookup(t, s.AddrVar)
	bin := "redis-server"
	if s.BinVar != "" {
		bin = Lookup(t, s.BinVar)
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		t.Fatalf("%s: no server binary %q: %v", s.Name, bin, err)
	}
	return path
}

// Start starts a server of this kind for t alone, as StartRedisServer does
// (killed when t ends), and checks its product and version. It skips t
// (fails it under CI=true) when the shared instance's variable, which says
// the machine has the server, or its binary's variable is unset.
func (s Server) Start(t testing.TB, extra ...string) *RedisServer {
	t.Helper()
	path := s.binary(t)
	srv := startServer(t, path, FreePort(t), extra...)
	s.check(t, srv.Options(), path)
	return srv
}

// check fails t unless the server o reaches is what s names; what says
// where the address came from.
func (s Server) check(t testing.TB, o *redis.Options, what string) {
	t.Helper()
	addr := o.Addr
	o.MaxRetries = -1
	c := redis.NewClient(o)
	defer func() { _ = c.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		t.Fatalf("%s: the server of %s does not answer INFO: %v", s.Name, what, err)
	}
	product, version := redisadmin.ServerIdentity(info)
	if product != s.product || !strings.HasPrefix(version, s.version) {
		t.Fatalf("%s: the server of %s is %s %s; want %s %sx", s.Name, what, product, version, s.product, s.version)
	}
	t.Logf("%s: %s %s at %s", s.Name, product, version, addr)
}
