package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testing/testenv"
)

// A cluster that lost a node (issue 43): once a master's replica took its
// slots, or a replica died, the cluster serves every slot again, and a store
// made after that must serve every call at once — with the dead node still
// in the cluster's node table, as it stays until it returns or an operator
// removes it. Before the fix, every call of such a store failed on Redis
// 7.0 ("cannot reach Redis at <the dead node>"): its first contact loaded
// the scripts on every node, the dead one included.
func TestClusterStoreMadeAfterALostNode(t *testing.T) {
	t.Parallel()
	for _, srv := range testenv.Servers {
		if srv.Name == "redis7" || srv.Name == "redis8.0" || srv.Name == "valkey9.1" {
			t.Run(srv.Name, func(t *testing.T) { storeAfterLostNode(t, srv) })
		}
	}
}

func storeAfterLostNode(t *testing.T, srv testenv.Server) {
	cl := startTestCluster(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Records confirmed before anything dies, each replicated before the
	// kill (WAIT), so that every one must be found afterwards.
	before := newClusterClient(t, cl.Addrs())
	old, err := idem.NewRedisStore(before, idem.RedisOptions{})
	if err != nil {
		t.Fatalf("NewRedisStore: %v", err)
	}
	keys := make([]string, 300)
	for i := range keys {
		keys[i] = "lost-node:" + uuid.NewString()
	}
	confirmAll(ctx, t, old, keys)
	err = before.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		if n, err := m.Wait(ctx, 1, 10*time.Second).Result(); err != nil || n < 1 {
			return fmt.Errorf("WAIT 1 on %s = %d, %v; want 1", m.Options().Addr, n, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	victim := firstMaster(t, cl)
	heir := replicaOf(t, cl, victim)
	// The store made before goes on calling through the failover, as a
	// running service would: its failed calls make the client reload
	// the slot map meanwhile.
	busy, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; busy.Err() == nil; i++ {
			_, _ = old.Lookup(busy, keys[i%len(keys)])
			_ = before.Get(busy, "x{"+keys[i%len(keys)]+"}").Err()
		}
	}()
	killed := time.Now()
	victim.Kill()
	waitPromoted(ctx, t, cl, victim, heir)
	waitWhole(ctx, t, cl, victim)
	stop()
	<-done
	t.Logf("master %s killed; replica %s serves its slots %v later", victim.Addr, heir.Addr, time.Since(killed).Round(time.Millisecond))
	if !sleepCtx(ctx, time.Second) {
		t.Fatal("timed out")
	}

	// A store made now, on a client seeded with every node (the dead one
	// first, as a configuration written before the failure would list
	// it), and one on a client seeded without it.
	var seeded []string
	for _, a := range cl.Addrs() {
		if a != victim.Addr {
			seeded = append(seeded, a)
		}
	}
	clients := map[string]*redis.ClusterClient{
		"seeded with the dead node":    newClusterClient(t, append([]string{victim.Addr}, seeded...)),
		"seeded without the dead node": newClusterClient(t, seeded),
	}
	for name, c := range clients {
		for _, auto := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s, AutoPipeline %t", name, auto), func(t *testing.T) {
				serveEveryCall(ctx, t, c, !auto, keys)
			})
		}
	}
	if err := old.Check(ctx); err != nil {
		t.Errorf("Check of the store made before the kill, after the failover: %v; want nil", err)
	}

	// A replica dies too (of another master): still listed, still no
	// reason to refuse a call.
	var other *testenv.RedisServer
	for _, s := range cl.Nodes {
		if s != victim && s != heir && role(ctx, s) == "master" {
			other = replicaOf(t, cl, s)
			break
		}
	}
	if other == nil {
		t.Fatal("no replica of another master")
	}
	other.Kill()
	// At once, while the others still count it as a replica that may
	// answer (not yet flagged failed: CLUSTER SLOTS still lists it), and
	// once they flag it failed.
	t.Run("a replica just killed", func(t *testing.T) {
		serveEveryCall(ctx, t, clients["seeded with the dead node"], false, keys)
	})
	t.Run("the dead nodes reported", func(t *testing.T) {
		var got []idem.Event
		var logs strings.Builder
		s, err := idem.NewRedisStore(clients["seeded without the dead node"], idem.RedisOptions{
			Observer: observerFunc(func(_ context.Context, e idem.Event) { got = append(got, e) }),
			Logger:   slog.New(slog.NewTextHandler(&logs, nil)),
		})
		if err != nil {
			t.Fatalf("NewRedisStore: %v", err)
		}
		if err := s.Check(ctx); err != nil {
			t.Fatalf("Check: %v; want nil", err)
		}
		if err := s.Check(ctx); err != nil {
			t.Fatalf("Check again: %v; want nil", err)
		}
		var checks []idem.Event
		for _, e := range got {
			if e.Op == idem.OpCheck {
				checks = append(checks, e)
			}
		}
		if len(checks) != 1 || !errors.Is(checks[0].Err, idem.ErrClusterDegraded) ||
			!strings.Contains(checks[0].Err.Error(), victim.Addr+" (master): failed") {
			t.Errorf("OpCheck events after two Checks = %v; want one, ErrClusterDegraded naming %s as a failed master", checks, victim.Addr)
		}
		if n := strings.Count(logs.String(), "Redis Cluster degraded"); n != 1 || !strings.Contains(logs.String(), victim.Addr) {
			t.Errorf("log after two Checks = %q; want one line naming %s", logs.String(), victim.Addr)
		}
	})
	waitFailed(ctx, t, cl, other, victim)
	t.Run("a replica dead too", func(t *testing.T) {
		serveEveryCall(ctx, t, clients["seeded with the dead node"], false, keys)
	})

	// The dead master comes back: it rejoins as a replica of its heir.
	if !victim.Start() {
		t.FailNow()
	}
	waitRole(ctx, t, victim, "slave")
	t.Run("the dead master back as a replica", func(t *testing.T) {
		serveEveryCall(ctx, t, clients["seeded with the dead node"], false, keys)
		for _, s := range []*idem.RedisStore{old} {
			if _, err := s.Lookup(ctx, keys[0]); err != nil {
				t.Errorf("Lookup on the store made before the kill: %v; want nil", err)
			}
		}
	})
}

// serveEveryCall makes a new store on c and requires every kind of call
// to succeed at its first try: Lookup of each of keys (confirmed before),
// Claim and Confirm, ClaimBatch and ConfirmBatch, Quarantined, Check.
func serveEveryCall(ctx context.Context, t *testing.T, c *redis.ClusterClient, noAuto bool, keys []string) {
	t.Helper()
	s, err := idem.NewRedisStore(c, idem.RedisOptions{NoAutoPipeline: noAuto})
	if err != nil {
		t.Fatalf("NewRedisStore: %v", err)
	}
	failed := 0
	var first error
	for _, k := range keys {
		rec, err := s.Lookup(ctx, k)
		if err == nil && !rec.Confirmed {
			err = fmt.Errorf("record not confirmed: %+v", rec)
		}
		if err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d Lookups of keys confirmed before the failure failed (first: %v); want 0", failed, len(keys), first)
	}
	fresh := make([]string, 60)
	for i := range fresh {
		fresh[i] = "lost-node:new:" + uuid.NewString()
	}
	for _, k := range fresh[:30] {
		cl, err := s.Claim(ctx, k, nil)
		if err != nil || cl.Outcome != idem.Claimed {
			t.Errorf("Claim(%q) = %v, %v; want Claimed", k, cl.Outcome, err)
			continue
		}
		if err := s.Confirm(ctx, cl.Lease, []byte("r")); err != nil {
			t.Errorf("Confirm(%q) = %v; want nil", k, err)
		}
	}
	cs, err := s.ClaimBatch(ctx, fresh[30:], nil)
	if err != nil {
		t.Errorf("ClaimBatch of %d keys: %v; want nil", len(fresh[30:]), err)
	} else {
		leases := make([]*idem.Lease, len(cs))
		for i, c := range cs {
			leases[i] = c.Lease
		}
		if err := s.ConfirmBatch(ctx, leases, make([][]byte, len(leases))); err != nil {
			t.Errorf("ConfirmBatch: %v; want nil", err)
		}
	}
	if _, err := s.Quarantined(ctx, 10); err != nil {
		t.Errorf("Quarantined: %v; want nil", err)
	}
	if err := s.Check(ctx); err != nil {
		t.Errorf("Check: %v; want nil", err)
	}
}

func newClusterClient(t *testing.T, addrs []string) *redis.ClusterClient {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// confirmAll claims and confirms keys on s, failing t on any error.
func confirmAll(ctx context.Context, t *testing.T, s *idem.RedisStore, keys []string) {
	t.Helper()
	for _, k := range keys {
		c, err := s.Claim(ctx, k, nil)
		if err != nil || c.Outcome != idem.Claimed {
			t.Fatalf("Claim(%q) = %v, %v; want Claimed", k, c.Outcome, err)
		}
		if err := s.Confirm(ctx, c.Lease, []byte("done")); err != nil {
			t.Fatalf("Confirm(%q) = %v", k, err)
		}
	}
}

// role is what ROLE's first word says of s ("master", "slave"), or "".
func role(ctx context.Context, s *testenv.RedisServer) string {
	c := redis.NewClient(s.Options())
	defer func() { _ = c.Close() }()
	r, err := c.Do(ctx, "role").Slice()
	if err != nil || len(r) == 0 {
		return ""
	}
	str, _ := r[0].(string)
	return str
}

// waitRole waits until s says it is a want.
func waitRole(ctx context.Context, t *testing.T, s *testenv.RedisServer, want string) {
	t.Helper()
	for role(ctx, s) != want {
		if !sleepCtx(ctx, 20*time.Millisecond) {
			t.Fatalf("%s never became a %s", s.Addr, want)
		}
	}
}

// waitWhole waits until every node but the dead ones reports
// cluster_state:ok and all 16384 slots served.
func waitWhole(ctx context.Context, t *testing.T, cl *testenv.ClusterServers, dead ...*testenv.RedisServer) {
	t.Helper()
	for _, s := range cl.Nodes {
		if isOneOf(s, dead) {
			continue
		}
		c := s.Client(t)
		for {
			info, err := c.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_slots_ok:16384") {
				break
			}
			if !sleepCtx(ctx, 20*time.Millisecond) {
				t.Fatalf("cluster not whole again from %s: %s", s.Addr, info)
			}
		}
	}
}

// waitFailed waits until every live node flags dead as failed.
func waitFailed(ctx context.Context, t *testing.T, cl *testenv.ClusterServers, dead *testenv.RedisServer, gone ...*testenv.RedisServer) {
	t.Helper()
	for _, s := range cl.Nodes {
		if s == dead || isOneOf(s, gone) {
			continue
		}
		c := s.Client(t)
		for {
			nodes, err := c.ClusterNodes(ctx).Result()
			if err == nil && nodeFlagged(nodes, dead.Addr, "fail") {
				break
			}
			if !sleepCtx(ctx, 20*time.Millisecond) {
				t.Fatalf("%s never flagged %s failed: %s", s.Addr, dead.Addr, nodes)
			}
		}
	}
}

// nodeFlagged reports whether CLUSTER NODES lists addr with flag (exactly,
// so "fail" is not "fail?").
func nodeFlagged(nodes, addr, flag string) bool {
	for line := range strings.SplitSeq(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		if a, _, _ := strings.Cut(f[1], "@"); a != addr {
			continue
		}
		for fl := range strings.SplitSeq(f[2], ",") {
			if fl == flag {
				return true
			}
		}
	}
	return false
}

func isOneOf(s *testenv.RedisServer, list []*testenv.RedisServer) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
