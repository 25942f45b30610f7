package testenv

import (
	"context"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterServers is a Redis Cluster of one test's own, which the test may kill
// nodes of.
type ClusterServers struct {
	Nodes []*RedisServer // every node, in the order created

	t    testing.TB
	bin  string   // the server binary; "" for redis-server on PATH
	args []string // each node's redis-server arguments, port aside
}

// StartCluster starts masters*(1+replicas) redis-servers with
// --cluster-enabled (extra arguments appended, e.g. --cluster-node-timeout),
// joins them with `redis-cli --cluster create` (replicas per master), and
// waits until every node reports cluster_state:ok and every replica is in
// sync with its master. The nodes are killed when t ends. Like
// StartRedisServer, it is required under CI=true.
func StartCluster(t testing.TB, masters, replicas int, extra ...string) *ClusterServers {
	t.Helper()
	return startCluster(t, "", masters, replicas, extra...)
}

// StartCluster is testenv.StartCluster with this kind's server: the nodes
// run its binary (joined by Debian 12's redis-cli, which creates Valkey
// clusters too). It skips t (fails it under CI=true) as Start does.
func (s Server) StartCluster(t testing.TB, masters, replicas int, extra ...string) *ClusterServers {
	t.Helper()
	bin := ""
	if s.BinVar != "" {
		bin = s.binary(t)
	}
	c := startCluster(t, bin, masters, replicas, extra...)
	s.check(t, c.Nodes[0].Options(), c.Nodes[0].Addr)
	return c
}

// startCluster is StartCluster with the server binary bin ("" for
// redis-server on PATH).
func startCluster(t testing.TB, bin string, masters, replicas int, extra ...string) *ClusterServers {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		Lookup(t, RedisAddrVar)
		t.Fatalf("redis-cli is not on PATH: %v", err)
	}
	c := &ClusterServers{t: t, bin: bin, args: append([]string{"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf", "--appendonly", "no"}, extra...)}
	args := []string{"--cluster", "create"}
	for range masters * (1 + replicas) {
		s := c.startNode()
		c.Nodes = append(c.Nodes, s)
		args = append(args, s.Addr)
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, s := range c.Nodes {
		n := s.Client(t)
		for {
			info, _ := n.ClusterInfo(ctx).Result()
			repl, _ := n.Info(ctx, "replication").Result()
			if strings.Contains(info, "cluster_state:ok") && strings.Contains(info,
				"cluster_known_nodes:"+strconv.Itoa(len(c.Nodes))+"\r") &&
				(strings.Contains(repl, "role:master") || strings.Contains(repl, "master_link_status:up")) {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("cluster node %s not ready after 30s:\n%s\n%s", s.Addr, info, repl)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

// startNode starts one node with the cluster's binary and arguments.
func (c *ClusterServers) startNode() *RedisServer {
	c.t.Helper()
	if c.bin == "" {
		return startRedisServer(c.t, clusterPort(c.t), c.args...)
	}
	return startServer(c.t, c.bin, clusterPort(c.t), c.args...)
}

// Addrs returns every node's address.
func (c *ClusterServers) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		addrs[i] = s.Addr
	}
	return addrs
}

// Client returns a client of this server alone, closed when t ends.
func (s *RedisServer) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// clusterPort returns a free loopback port whose cluster bus port (port +
// 10000) is free too.
func clusterPort(t testing.TB) string {
	t.Helper()
	for range 100 {
		p := FreePort(t)
		n, _ := strconv.Atoi(p)
		if n+10000 > 65535 {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(n+10000))
		if err != nil {
			continue
		}
		_ = l.Close()
		return p
	}
	t.Fatal("no free port with a free cluster bus port (+10000)")
	return ""
}
