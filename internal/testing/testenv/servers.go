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
	// Valkey 9.1 (Debian sid's source package): a standalone instance, its
	// binary, and a 3-master cluster of it.
	Valkey9AddrVar         = "IDEM_VALKEY9_ADDR"
	Valkey9ServerVar       = "IDEM_VALKEY9_SERVER"
	Valkey9ClusterAddrsVar = "IDEM_VALKEY9_CLUSTER_ADDRS"
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
// 7 elsewhere), Redis 8.0, Valkey 8.1 and Valkey 9.1.
var Servers = []Server{
	{Name: "redis7", AddrVar: RedisAddrVar, product: "redis", version: "7."},
	{Name: "redis8.0", AddrVar: Redis8AddrVar, BinVar: Redis8ServerVar, product: "redis", version: "8.0."},
	{Name: "valkey8.1", AddrVar: ValkeyAddrVar, BinVar: ValkeyServerVar, product: "valkey", version: "8.1."},
	{Name: "valkey9.1", AddrVar: Valkey9AddrVar, BinVar: Valkey9ServerVar, product: "valkey", version: "9.1."},
}

// A ClusterServer is one of the 3-master clusters the store is tested on.
type ClusterServer struct {
	// Name names the cluster's subtests, as Server.Name does.
	Name string
	// AddrsVar is the variable holding its masters' host:port, comma
	// separated.
	AddrsVar string

	product, version string
}

// Clusters are the clusters of the matrix: Redis 7.0 (Debian 12's) and
// Valkey 9.1.
var Clusters = []ClusterServer{
	{Name: "redis7", AddrsVar: ClusterAddrsVar, product: "redis", version: "7."},
	{Name: "valkey9.1", AddrsVar: Valkey9ClusterAddrsVar, product: "valkey", version: "9.1."},
}

// EachCluster runs f as a subtest of t, named by the cluster, on each of
// Clusters in turn. Each subtest skips (fails under CI=true) when its
// cluster's variable is unset, as Lookup does.
func EachCluster(t *testing.T, f func(t *testing.T, c ClusterServer)) {
	t.Helper()
	for _, c := range Clusters {
		t.Run(c.Name, func(t *testing.T) { f(t, c) })
	}
}

// Addrs returns the cluster's masters, or skips t (fails it under CI=true)
// when its variable is unset. It fails t when a master does not answer or
// is not the product and version c names.
func (c ClusterServer) Addrs(t testing.TB) []string {
	t.Helper()
	addrs := strings.Split(Lookup(t, c.AddrsVar), ",")
	s := Server{Name: c.Name, product: c.product, version: c.version}
	for _, a := range addrs {
		s.check(t, &redis.Options{Addr: a}, c.AddrsVar+"="+a)
	}
	return addrs
}

// Client returns a client of the cluster (see Addrs), closed when t ends,
// once every master answers.
func (c ClusterServer) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	return clusterClient(t, c.Addrs(t))
}

// FieldExpiry reports whether the server has HSETEX, hash fields with TTLs
// of their own (Redis 8.0, Valkey 9.0), where a RedisStore with
// FieldHashes keeps confirmations as fields.
func (s Server) FieldExpiry() bool { return s.Name == "redis8.0" || s.Name == "valkey9.1" }

// FieldExpiry reports whether the cluster's servers have HSETEX (see
// Server.FieldExpiry).
func (c ClusterServer) FieldExpiry() bool { return c.Name == "valkey9.1" }

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
