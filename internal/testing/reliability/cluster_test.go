package reliability_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testing/testenv"
)

// Redis Cluster in motion (issue 20), on a cluster of the test's own: 3
// masters, 3 replicas, nodes judged failing after 2 s.

// failClock records when the store calls it observes last failed for want
// of Redis (an application answer such as ErrAlreadyConfirmed is not a
// failure, nor a call the test's own stop cut off), and how many did.
type failClock struct {
	mu      sync.Mutex
	last    time.Time
	n       atomic.Int64
	byPath  map[string]time.Time // the last failure of each kind of call
	lastErr map[string]error
}

func (f *failClock) observer(path string, next idem.Observer) idem.Observer {
	return observerFunc(func(ctx context.Context, e idem.Event) {
		if next != nil {
			next.Observe(ctx, e)
		}
		if !failedForRedis(e.Err) {
			return
		}
		now := time.Now()
		f.n.Add(1)
		f.mu.Lock()
		defer f.mu.Unlock()
		f.last = now
		f.byPath[path] = now
		f.lastErr[path] = e.Err
	})
}

// failedForRedis reports whether err, a store call's, is a failure to
// reach Redis: not nil, not an answer (ErrAlreadyConfirmed, ErrLeaseLost),
// not a call the test's own stop cut off. A batch failed so when any of
// its items did (errors.Is on a BatchError asks whether any item is).
func failedForRedis(err error) bool {
	var be *idem.BatchError
	if errors.As(err, &be) {
		return slices.ContainsFunc(be.Errs, failedForRedis)
	}
	return err != nil && !errors.Is(err, idem.ErrAlreadyConfirmed) && !errors.Is(err, idem.ErrLeaseLost) &&
		!errors.Is(err, context.Canceled)
}

type observerFunc func(context.Context, idem.Event)

func (o observerFunc) Observe(ctx context.Context, e idem.Event) { o(ctx, e) }

// clusterNodeTimeout is the cluster-node-timeout of the test's clusters:
// how long a master must be unreachable before a failover starts.
const clusterNodeTimeout = "2000"

func startTestCluster(t *testing.T, srv testenv.Server) *testenv.ClusterServers {
	t.Helper()
	return srv.StartCluster(t, 3, 1, "--cluster-node-timeout", clusterNodeTimeout,
		// A replica may take over however long ago it last heard of its
		// master; diskless syncs start at once.
		"--cluster-replica-validity-factor", "0",
		"--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0")
}

// replicaOf returns the node that replicates master.
func replicaOf(t *testing.T, cl *testenv.ClusterServers, master *testenv.RedisServer) *testenv.RedisServer {
	t.Helper()
	_, port, _ := strings.Cut(master.Addr, ":")
	for _, s := range cl.Nodes {
		info, err := s.Client(t).Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, "role:slave") && strings.Contains(info, "master_port:"+port+"\r") {
			return s
		}
	}
	t.Fatalf("no replica of master %s", master.Addr)
	return nil
}

// firstMaster returns the first node that is a master.
func firstMaster(t *testing.T, cl *testenv.ClusterServers) *testenv.RedisServer {
	t.Helper()
	for _, s := range cl.Nodes {
		info, err := s.Client(t).Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, "role:master") {
			return s
		}
	}
	t.Fatal("no master in the cluster")
	return nil
}

// sideLoad runs claims and confirms of fresh keys through s until ctx
// ends: in batches of 20 when batch is set, else from 8 goroutines one by
// one (with AutoPipeline, they share pipelines). It returns the keys whose
// confirmation returned nil, and how many were confirmed after since.
func sideLoad(ctx context.Context, s *idem.RedisStore, batch bool, since *atomic.Int64) (confirmed []string, after int) {
	var mu sync.Mutex
	add := func(keys ...string) {
		mu.Lock()
		defer mu.Unlock()
		confirmed = append(confirmed, keys...)
		if p := since.Load(); p != 0 && time.Now().UnixNano() > p {
			after += len(keys)
		}
	}
	call := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, time.Second) }
	var wg sync.WaitGroup
	workers := 8
	if batch {
		workers = 1
	}
	for range workers {
		wg.Go(func() {
			for sleepCtx(ctx, 5*time.Millisecond) {
				if batch {
					keys := make([]string, 20)
					for i := range keys {
						keys[i] = "side:" + uuid.NewString()
					}
					cctx, cancel := call()
					cs, _ := s.ClaimBatch(cctx, keys, nil)
					cancel()
					var leases []*idem.Lease
					for _, c := range cs {
						if c.Outcome == idem.Claimed && c.Lease != nil {
							leases = append(leases, c.Lease)
						}
					}
					if len(leases) == 0 {
						continue
					}
					cctx, cancel = call()
					err := s.ConfirmBatch(cctx, leases, nil)
					cancel()
					var be *idem.BatchError
					for i, l := range leases {
						if err == nil || errors.As(err, &be) && be.Errs[i] == nil {
							add(l.Key)
						}
					}
					continue
				}
				key := "side:" + uuid.NewString()
				cctx, cancel := call()
				c, err := s.Claim(cctx, key, nil)
				cancel()
				if err != nil || c.Outcome != idem.Claimed {
					continue
				}
				cctx, cancel = call()
				if s.Confirm(cctx, c.Lease, nil) == nil {
					add(key)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	return confirmed, after
}

// TestClusterFailover SIGKILLs a master while the fault workload (one-by-one
// calls, under the ledger's checks), a batch load and an AutoPipeline load
// run, all through one ClusterClient with go-redis's defaults. Callers must
// be back within 5 s of the replica's promotion (issue 20: 46 s, before the
// store reloaded the slot map on failures); confirmations lost in the
// failover (Redis replicates asynchronously) are counted, not failures.
// It runs on a cluster of Redis 7 and one of Valkey 9.1, one after the
// other (each loads both cores).
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	for _, srv := range testenv.Servers {
		if srv.Name == "redis7" || srv.Name == "valkey9.1" {
			t.Run(srv.Name, func(t *testing.T) { clusterFailover(t, srv) })
		}
	}
}

func clusterFailover(t *testing.T, srv testenv.Server) {
	cl := startTestCluster(t, srv)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { _ = client.Close() })
	dc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { _ = dc.Close() })
	direct, err := idem.NewRedisStore(dc, idem.RedisOptions{})
	if err != nil {
		t.Fatalf("NewRedisStore: %v", err)
	}
	fc := &failClock{byPath: map[string]time.Time{}, lastErr: map[string]error{}}
	open, batchStore, autoStore := clusterStores(t, client, fc.observer)

	victim := firstMaster(t, cl)
	heir := replicaOf(t, cl, victim)
	var killed, promoted time.Time
	var promotedNs atomic.Int64
	var sideKeys []string
	var sideAfter [2]int
	w := workload{messages: 600, workers: 8, lease: time.Second, opTimeout: time.Second,
		crashRate: 0.01, failRate: 0.03, spread: 10 * time.Second, limit: 45 * time.Second, lossy: true}
	r := runWorkload(t, w, open, direct, func(ctx context.Context, led *ledger) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for i, s := range []*idem.RedisStore{batchStore, autoStore} {
			wg.Go(func() {
				keys, after := sideLoad(ctx, s, i == 0, &promotedNs)
				mu.Lock()
				defer mu.Unlock()
				sideKeys = append(sideKeys, keys...)
				sideAfter[i] = after
			})
		}
		defer wg.Wait()
		if !sleepCtx(ctx, 2*time.Second) {
			return
		}
		killed = time.Now()
		victim.Kill()
		hc := heir.Client(t)
		for {
			if !sleepCtx(ctx, 20*time.Millisecond) {
				return
			}
			if role, err := hc.Do(ctx, "role").Slice(); err == nil && len(role) > 0 && role[0] == "master" {
				promoted = time.Now()
				promotedNs.Store(promoted.UnixNano())
				break
			}
		}
		// The checking store's map must follow too (it makes no calls
		// until the end), once every node knows of the promotion.
		waitPromoted(ctx, t, cl, victim, heir)
		dc.ReloadState(ctx)
	})
	if promoted.IsZero() {
		t.Fatalf("replica %s of killed master %s was never promoted (killed at %v)", heir.Addr, victim.Addr, stamp(killed))
	}
	fc.mu.Lock()
	last, byPath := fc.last, fc.byPath
	fc.mu.Unlock()
	sideLost := 0
	for _, k := range sideKeys {
		rec, err := direct.Lookup(context.Background(), k)
		switch {
		case errors.Is(err, idem.ErrNotFound):
			sideLost++
		case err != nil || !rec.Confirmed:
			t.Errorf("side-load key %q was confirmed; Lookup = %+v, %v; want it confirmed or gone (lost in the failover)", k, rec, err)
		}
	}
	back := last.Sub(promoted)
	t.Logf("failover: master %s killed, replica %s promoted %v later; failed calls %d, the last %v after the promotion (single %v, batch %v, autopipeline %v)",
		victim.Addr, heir.Addr, promoted.Sub(killed).Round(time.Millisecond), fc.n.Load(), back.Round(time.Millisecond),
		sinceOr(byPath["single"], promoted), sinceOr(byPath["batch"], promoted), sinceOr(byPath["autopipeline"], promoted))
	t.Logf("ledger: %v", r)
	t.Logf("last errors: %v", fc.lastErr)
	t.Logf("side loads: %d keys confirmed (%d by batches, %d with AutoPipeline after the promotion), confirmed then lost %d",
		len(sideKeys), sideAfter[0], sideAfter[1], sideLost)
	if fc.n.Load() == 0 {
		t.Errorf("no call failed; want the kill to have met the workload")
	}
	// The target (measured: 12 to 326 ms in 39 runs, against 38 s or more
	// before the store reloaded the slot map; an earlier session's one
	// 4.9 s was likely the test's own stop, then counted as failures).
	if back > 5*time.Second {
		t.Errorf("the last failed call came %v after the replica's promotion; want at most 5s", back.Round(time.Millisecond))
	}
	if sideAfter[0] == 0 || sideAfter[1] == 0 {
		t.Errorf("keys confirmed after the promotion: batches %d, AutoPipeline %d; want both loads back", sideAfter[0], sideAfter[1])
	}
}

// waitPromoted waits until every node but the dead master sees the heir
// as a master and the dead one as failed.
func waitPromoted(ctx context.Context, t *testing.T, cl *testenv.ClusterServers, dead, heir *testenv.RedisServer) {
	for _, s := range cl.Nodes {
		if s == dead {
			continue
		}
		c := s.Client(t)
		for {
			nodes, err := c.ClusterNodes(ctx).Result()
			agreed := err == nil
			for line := range strings.SplitSeq(nodes, "\n") {
				f := strings.Fields(line)
				if len(f) < 3 {
					continue
				}
				addr, _, _ := strings.Cut(f[1], "@")
				switch addr {
				case heir.Addr:
					agreed = agreed && strings.Contains(f[2], "master")
				case dead.Addr:
					agreed = agreed && strings.Contains(f[2], "fail")
				}
			}
			if agreed || !sleepCtx(ctx, 20*time.Millisecond) {
				break
			}
		}
	}
}

// sinceOr is how long after from t came, or "none" for no t.
func sinceOr(t, from time.Time) string {
	if t.IsZero() {
		return "none"
	}
	return t.Sub(from).Round(time.Millisecond).String()
}

// clusterStores opens the stores of the cluster loads on client, each
// observed by observe under its path: open for the ledger workload
// ("single"), and the stores of the batch and AutoPipeline side loads.
func clusterStores(t *testing.T, client *redis.ClusterClient, observe func(path string, next idem.Observer) idem.Observer) (
	open func(int, idem.Options) idem.Store, batch, auto *idem.RedisStore) {
	t.Helper()
	open = func(i int, o idem.Options) idem.Store {
		ro := idem.RedisOptionsFrom(o)
		ro.Observer = observe("single", o.Observer)
		s, err := idem.NewRedisStore(client, ro)
		if err != nil {
			t.Fatalf("NewRedisStore: %v", err)
		}
		return s
	}
	side := func(path string, auto bool) *idem.RedisStore {
		s, err := idem.NewRedisStore(client, idem.RedisOptions{LeaseTTL: time.Second, Retention: 10 * time.Minute,
			NoAutoPipeline: !auto, Observer: observe(path, nil), Worker: path})
		if err != nil {
			t.Fatalf("NewRedisStore: %v", err)
		}
		return s
	}
	return open, side("batch", false), side("autopipeline", true)
}
