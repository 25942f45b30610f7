package idem

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/testenv"
)

// --- 1. Round trips ---------------------------------------------------------

func TestRedisRoundTrips(t *testing.T) {
	for _, backend := range redisBackends {
		t.Run(backend.name, func(t *testing.T) {
			t.Parallel()
			c := backend.client(t)
			s := newTestRedisStore(t, c, RedisOptions{})
			ctx := context.Background()
			h := &tripCounter{}
			c.AddHook(h)

			// Warm up: load every script and open the connections.
			for _, k := range uuidKeys(2) {
				cl, err := s.Claim(ctx, k, nil)
				if err != nil {
					t.Fatalf("Claim(%q): %v", k, err)
				}
				if err := s.Confirm(ctx, cl.Lease, nil); err != nil {
					t.Fatalf("Confirm(%q): %v", k, err)
				}
			}
			if err := s.ConfirmBatch(ctx, claimAllOK(t, s, uuidKeys(100), nil), nil); err != nil {
				t.Fatalf("ConfirmBatch: %v", err)
			}
			h.take()

			const n = 20
			for _, k := range uuidKeys(n) {
				cl, err := s.Claim(ctx, k, []byte("fp"))
				if err != nil || cl.Outcome != Claimed {
					t.Fatalf("Claim(%q) = %v, %v; want claimed", k, cl.Outcome, err)
				}
				if err := s.Confirm(ctx, cl.Lease, []byte("ok")); err != nil {
					t.Fatalf("Confirm(%q): %v", k, err)
				}
			}
			if got, sent := h.take(); got != 2*n {
				t.Errorf("%d Claim+Confirm cost %d round trips (%v); want %d", n, got, sent, 2*n)
			}

			keys := uuidKeys(100)
			leases := claimAllOK(t, s, keys, nil)
			if got, sent := h.take(); got != 1 {
				t.Errorf("ClaimBatch of %d cost %d round trips (%v); want 1", len(keys), got, sent)
			}
			if err := s.ConfirmBatch(ctx, leases, nil); err != nil {
				t.Fatalf("ConfirmBatch: %v", err)
			}
			if got, sent := h.take(); got != 1 {
				t.Errorf("ConfirmBatch of %d cost %d round trips (%v); want 1", len(keys), got, sent)
			}
			checkAllDuplicate(t, s, keys)
		})
	}
}

// nodeTrips counts the round trips that carry a script, per cluster node.
type nodeTrips struct {
	mu     sync.Mutex
	byNode map[string]int
}

type nodeHook struct {
	addr string
	n    *nodeTrips
}

func (h nodeHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h nodeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

func (h nodeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.count(cmds)
		return next(ctx, cmds)
	}
}

// count counts one round trip to the node if it runs a script: the cluster
// client also talks to nodes on its own (CLUSTER SLOTS), which is not ours.
func (h nodeHook) count(cmds []redis.Cmder) {
	for _, c := range cmds {
		if n := c.Name(); n == "evalsha" || n == "eval" {
			h.n.mu.Lock()
			h.n.byNode[h.addr]++
			h.n.mu.Unlock()
			return
		}
	}
}

func (n *nodeTrips) take() map[string]int {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := n.byNode
	n.byNode = map[string]int{}
	return m
}

// hookMasters counts script round trips on each master of c. A
// ClusterClient pipeline is split by node and each part runs through that
// node client's pipeline hook, so the node clients' hooks see what reaches
// each master.
func hookMasters(t *testing.T, c *redis.ClusterClient) (*nodeTrips, int) {
	t.Helper()
	n := &nodeTrips{byNode: map[string]int{}}
	var masters atomic.Int32
	err := c.ForEachMaster(context.Background(), func(ctx context.Context, m *redis.Client) error {
		m.AddHook(nodeHook{addr: m.Options().Addr, n: n})
		masters.Add(1)
		return nil
	})
	if err != nil {
		t.Fatalf("ForEachMaster: %v", err)
	}
	return n, int(masters.Load())
}

func TestRedisRoundTripsCluster(t *testing.T) {
	t.Parallel()
	c := testenv.Cluster(t)
	s := newTestRedisStore(t, c, RedisOptions{})
	ctx := context.Background()
	trips, masters := hookMasters(t, c)
	if masters < 2 {
		t.Fatalf("the cluster has %d masters; want several to spread a batch over", masters)
	}

	// Warm up: load the scripts on every master.
	if err := s.ConfirmBatch(ctx, claimAllOK(t, s, uuidKeys(100), nil), nil); err != nil {
		t.Fatalf("ConfirmBatch: %v", err)
	}
	trips.take()

	check := func(call string, got map[string]int) {
		t.Helper()
		if len(got) != masters {
			t.Errorf("%s of 100 keys reached %d masters (%v); want all %d", call, len(got), got, masters)
		}
		for node, n := range got {
			if n != 1 {
				t.Errorf("%s of 100 keys cost %d round trips to %s (%v); want 1 per master", call, n, node, got)
			}
		}
	}
	keys := uuidKeys(100)
	leases := claimAllOK(t, s, keys, nil)
	check("ClaimBatch", trips.take())
	if err := s.ConfirmBatch(ctx, leases, nil); err != nil {
		t.Fatalf("ConfirmBatch: %v", err)
	}
	check("ConfirmBatch", trips.take())
	checkAllDuplicate(t, s, keys)
}
