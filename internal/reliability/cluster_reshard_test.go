//go:build reshard

// TestClusterResharding moves slots between masters under load. It takes
// about 25 s and meets MOVED and ASK by timing, so `make test` does not run
// it: `make soak` does (.ci/soak.sh, step reshard), or
// go test -tags reshard -run TestClusterResharding ./internal/reliability/
package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
)

// errTally counts the errors the store's callers saw, by kind of text: a
// redirect (MOVED, ASK) or a cluster-state error (CLUSTERDOWN, TRYAGAIN)
// must never reach a caller, since go-redis follows and retries those.
// Batch errors count item by item.
type errTally struct {
	mu    sync.Mutex
	n     map[string]int
	first map[string]error
}

var redirectKinds = []string{"MOVED", "ASK", "CLUSTERDOWN", "TRYAGAIN"}

func (e *errTally) observer(path string, next idem.Observer) idem.Observer {
	return observerFunc(func(ctx context.Context, ev idem.Event) {
		if next != nil {
			next.Observe(ctx, ev)
		}
		if ev.Err == nil || errors.Is(ev.Err, idem.ErrAlreadyConfirmed) || errors.Is(ev.Err, idem.ErrLeaseLost) {
			return
		}
		errs := []error{ev.Err}
		var be *idem.BatchError
		if errors.As(ev.Err, &be) {
			errs = be.Errs
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, err := range errs {
			if err == nil || errors.Is(err, idem.ErrAlreadyConfirmed) || errors.Is(err, idem.ErrLeaseLost) {
				continue
			}
			kind, text := "other", err.Error()
			for _, k := range redirectKinds {
				if strings.Contains(text, k+" ") {
					kind = k
					break
				}
			}
			e.n[kind]++
			if e.first[kind] == nil {
				e.first[kind] = fmt.Errorf("%s %v: %w", path, ev.Op, err)
			}
		}
	})
}

// redirectHook counts the MOVED and ASK replies go-redis met inside the
// cluster client (and followed): it sits on every node's client, below
// the redirect handling.
type redirectHook struct{ moved, ask atomic.Int64 }

func (h *redirectHook) count(cmds ...redis.Cmder) {
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			switch {
			case redis.HasErrorPrefix(err, "MOVED"):
				h.moved.Add(1)
			case redis.HasErrorPrefix(err, "ASK"):
				h.ask.Add(1)
			}
		}
	}
}

func (h *redirectHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *redirectHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.count(cmd)
		return err
	}
}

func (h *redirectHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.count(cmds...)
		return err
	}
}

// keySlot is Redis Cluster's slot of a key without a hash tag: CRC16
// (XMODEM) mod 16384.
func keySlot(key string) int {
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

// tagFor returns a hash tag whose keys fall in slot.
func tagFor(slot int) string {
	for i := 0; ; i++ {
		if tag := "t" + strconv.Itoa(i); keySlot(tag) == slot {
			return "{" + tag + "}"
		}
	}
}

// lowestSlot returns the lowest slot master id owns, as c says: the first
// that `redis-cli --cluster reshard` takes from it.
func lowestSlot(ctx context.Context, c *redis.Client, id string) (int, error) {
	nodes, err := c.ClusterNodes(ctx).Result()
	if err != nil {
		return 0, err
	}
	low := -1
	for line := range strings.SplitSeq(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || f[0] != id {
			continue
		}
		for _, r := range f[8:] {
			lo, _, _ := strings.Cut(r, "-")
			if a, err := strconv.Atoi(lo); err == nil && (low < 0 || a < low) {
				low = a
			}
		}
	}
	if low < 0 {
		return 0, fmt.Errorf("master %s owns no slot", id)
	}
	return low, nil
}

// probe claims and confirms fresh keys under tag, one slot's, until ctx
// ends: one by one through single and auto, in batches of 20 through
// single. While the slot migrates, these meet ASK (a new key is not on
// the source); after, MOVED. It returns the keys confirmed.
func probe(ctx context.Context, single, auto *idem.RedisStore, tag string) []string {
	var mu sync.Mutex
	var confirmed []string
	var wg sync.WaitGroup
	var seq atomic.Int64
	key := func() string { return tag + ":probe:" + strconv.FormatInt(seq.Add(1), 10) }
	for i := range 6 {
		wg.Go(func() {
			for ctx.Err() == nil {
				cctx, cancel := context.WithTimeout(ctx, time.Second)
				if i == 0 {
					keys := make([]string, 20)
					for j := range keys {
						keys[j] = key()
					}
					cs, _ := single.ClaimBatch(cctx, keys, nil)
					var leases []*idem.Lease
					for _, c := range cs {
						if c.Outcome == idem.Claimed && c.Lease != nil {
							leases = append(leases, c.Lease)
						}
					}
					if len(leases) > 0 {
						err := single.ConfirmBatch(cctx, leases, nil)
						var be *idem.BatchError
						mu.Lock()
						for j, l := range leases {
							if err == nil || errors.As(err, &be) && be.Errs[j] == nil {
								confirmed = append(confirmed, l.Key)
							}
						}
						mu.Unlock()
					}
					cancel()
					continue
				}
				s := single
				if i >= 3 {
					s = auto
				}
				k := key()
				c, err := s.Claim(cctx, k, nil)
				if err == nil && c.Outcome == idem.Claimed && s.Confirm(cctx, c.Lease, nil) == nil {
					mu.Lock()
					confirmed = append(confirmed, k)
					mu.Unlock()
				}
				cancel()
			}
		})
	}
	wg.Wait()
	return confirmed
}

// clusterMaster is a master of a test cluster and its node ID.
type clusterMaster struct {
	addr, id string
}

func clusterMasters(t *testing.T, cl *testenv.ClusterServers) []clusterMaster {
	t.Helper()
	var ms []clusterMaster
	for _, s := range cl.Nodes {
		c := s.Client(t)
		info, err := c.Info(context.Background(), "replication").Result()
		if err != nil || !strings.Contains(info, "role:master") {
			continue
		}
		id, err := c.Do(context.Background(), "cluster", "myid").Text()
		if err != nil {
			t.Fatalf("CLUSTER MYID on %s: %v", s.Addr, err)
		}
		ms = append(ms, clusterMaster{addr: s.Addr, id: id})
	}
	return ms
}

// slotCounts returns how many slots each master owns, as c's CLUSTER NODES
// says (importing and migrating markers aside).
func slotCounts(ctx context.Context, c *redis.Client) (map[string]int, error) {
	nodes, err := c.ClusterNodes(ctx).Result()
	if err != nil {
		return nil, err
	}
	counts := map[string]int{}
	for line := range strings.SplitSeq(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) < 8 || !strings.Contains(f[2], "master") {
			continue
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue
			}
			lo, hi, ok := strings.Cut(r, "-")
			a, _ := strconv.Atoi(lo)
			b := a
			if ok {
				b, _ = strconv.Atoi(hi)
			}
			counts[f[0]] += b - a + 1
		}
	}
	return counts, nil
}

// waitAgreed waits until redis-cli finds the cluster consistent: every
// node agrees on the slots, no slot is open, all are covered.
func waitAgreed(addr string) error {
	var out []byte
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var err error
		out, err = exec.Command("redis-cli", "--cluster", "check", addr).CombinedOutput()
		s := string(out)
		if err == nil && strings.Contains(s, "[OK] All nodes agree") && strings.Contains(s, "[OK] All 16384 slots covered") &&
			!strings.Contains(s, "[WARNING]") && !strings.Contains(s, "[ERR]") {
			return nil
		}
	}
	return fmt.Errorf("cluster not consistent after 15s:\n%s", out)
}

// TestClusterResharding moves slots live between the masters of a 3 + 3
// cluster, in both directions, while the fault workload (one-by-one calls,
// under the ledger's checks), a batch load and an AutoPipeline load run.
// `redis-cli --cluster reshard` migrates the keys of each slot with
// MIGRATE while the slot is open, so calls meet ASK during a move and MOVED
// after it. Nothing may be lost (Redis keeps every write through a
// migration, so the run is not lossy), every double effect must be
// explained, and no redirect or cluster-state error may reach a caller.
func TestClusterResharding(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		testenv.Lookup(t, testenv.RedisAddrVar)
		t.Fatalf("redis-cli is not on PATH: %v", err)
	}
	start := time.Now()
	cl := startTestCluster(t)
	hook := &redirectHook{}
	newNode := func(o *redis.Options) *redis.Client {
		c := redis.NewClient(o)
		c.AddHook(hook)
		return c
	}
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), NewClient: newNode})
	t.Cleanup(func() { _ = client.Close() })
	dc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { _ = dc.Close() })
	direct, err := idem.NewRedisStore(dc, idem.RedisOptions{})
	if err != nil {
		t.Fatalf("NewRedisStore: %v", err)
	}
	tally := &errTally{n: map[string]int{}, first: map[string]error{}}
	open, batchStore, autoStore := clusterStores(t, client, tally.observer)

	ms := clusterMasters(t, cl)
	if len(ms) != 3 {
		t.Fatalf("masters %v; want 3", ms)
	}
	admin := cl.Nodes[0].Client(t)
	before, err := slotCounts(context.Background(), admin)
	if err != nil {
		t.Fatalf("CLUSTER NODES: %v", err)
	}
	// Six moves, each way round the ring and back: A→B, B→C, C→A, then
	// A→C, C→B, B→A. Each leaves the cluster consistent before the next.
	const slotsPerMove, hotKeys = 400, 10000
	var probeN int
	moves := [][2]int{{0, 1}, {1, 2}, {2, 0}, {0, 2}, {2, 1}, {1, 0}}
	var moved, movesDone int
	var reshardTook time.Duration
	var sideKeys []string
	var sideN [2]int       // keys confirmed by batches, with AutoPipeline
	var never atomic.Int64 // sideLoad's "after" mark: unused here
	w := workload{messages: 600, workers: 8, lease: time.Second, opTimeout: time.Second,
		crashRate: 0.01, failRate: 0.03, spread: 12 * time.Second, limit: 30 * time.Second}
	r := runWorkload(t, w, open, direct, func(ctx context.Context, led *ledger) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for i, s := range []*idem.RedisStore{batchStore, autoStore} {
			wg.Go(func() {
				keys, _ := sideLoad(ctx, s, i == 0, &never)
				mu.Lock()
				defer mu.Unlock()
				sideKeys = append(sideKeys, keys...)
				sideN[i] = len(keys)
			})
		}
		defer wg.Wait()
		if !sleepCtx(ctx, time.Second) {
			return
		}
		// A move once begun runs to its end, load or not: one cut short
		// would leave a slot open.
		for _, mv := range moves {
			if ctx.Err() != nil {
				return
			}
			from, to := ms[mv[0]], ms[mv[1]]
			if err := waitAgreed(from.addr); err != nil {
				t.Errorf("before moving %s → %s: %v", from.addr, to.addr, err)
				return
			}
			pre, err := slotCounts(context.Background(), admin)
			if err != nil {
				t.Errorf("CLUSTER NODES: %v", err)
				return
			}
			// The first slot to go gets a load of its own, and keys enough
			// (hotKeys, MIGRATEd 10 at a time) to stay open a while.
			low, err := lowestSlot(context.Background(), admin, from.id)
			if err != nil {
				t.Errorf("CLUSTER NODES: %v", err)
				return
			}
			tag := tagFor(low)
			fill := dc.Pipeline()
			for i := range hotKeys {
				fill.Set(context.Background(), tag+":fill:"+strconv.Itoa(i), "x", 10*time.Minute)
			}
			if _, err := fill.Exec(context.Background()); err != nil {
				t.Errorf("filling slot %d: %v", low, err)
				return
			}
			pctx, stopProbe := context.WithCancel(ctx)
			var probed []string
			var pwg sync.WaitGroup
			pwg.Go(func() { probed = probe(pctx, batchStore, autoStore, tag) })
			t0 := time.Now()
			out, err := exec.Command("redis-cli", "--cluster", "reshard", from.addr, "--cluster-from", from.id,
				"--cluster-to", to.id, "--cluster-slots", strconv.Itoa(slotsPerMove), "--cluster-yes").CombinedOutput()
			reshardTook += time.Since(t0)
			stopProbe()
			pwg.Wait()
			mu.Lock()
			sideKeys = append(sideKeys, probed...)
			probeN += len(probed)
			mu.Unlock()
			if err != nil {
				t.Errorf("redis-cli --cluster reshard %s → %s: %v\n%s", from.addr, to.addr, err, out)
				return
			}
			if err := waitAgreed(from.addr); err != nil {
				t.Errorf("after moving %s → %s: %v", from.addr, to.addr, err)
				return
			}
			post, err := slotCounts(context.Background(), admin)
			if err != nil {
				t.Errorf("CLUSTER NODES: %v", err)
				return
			}
			if pre[from.id]-post[from.id] != slotsPerMove || post[to.id]-pre[to.id] != slotsPerMove {
				t.Errorf("move %s → %s of %d slots: slots before %v, after %v", from.addr, to.addr, slotsPerMove, pre, post)
			}
			moved += slotsPerMove
			movesDone++
			t.Logf("moved %d slots %s → %s in %v; slots now %v", slotsPerMove, from.addr, to.addr,
				time.Since(t0).Round(time.Millisecond), post)
		}
	})
	if err := waitAgreed(ms[0].addr); err != nil {
		t.Errorf("after the run: %v", err)
	}
	after, err := slotCounts(context.Background(), admin)
	if err != nil {
		t.Fatalf("CLUSTER NODES: %v", err)
	}
	dc.ReloadState(context.Background())
	sideLost := 0
	for _, k := range sideKeys {
		rec, err := direct.Lookup(context.Background(), k)
		if err != nil || !rec.Confirmed {
			sideLost++
			if sideLost <= 5 {
				t.Errorf("side-load key %q was confirmed; Lookup = %+v, %v; want it confirmed", k, rec, err)
			}
		}
	}
	tally.mu.Lock()
	errs, first := tally.n, tally.first
	tally.mu.Unlock()

	t.Logf("resharding: %d moves of %d slots (%d slots moved, %v in redis-cli); slots before %v, after %v",
		movesDone, slotsPerMove, moved, reshardTook.Round(time.Millisecond), before, after)
	t.Logf("redirects go-redis met and followed: MOVED %d, ASK %d", hook.moved.Load(), hook.ask.Load())
	t.Logf("ledger: %v", r)
	t.Logf("side loads: %d keys confirmed (%d by batches, %d with AutoPipeline, %d on the first slot of each move), lost %d",
		len(sideKeys), sideN[0], sideN[1], probeN, sideLost)
	t.Logf("errors seen by callers, by kind: %v (first of each: %v); run %v", errs, first, time.Since(start).Round(time.Millisecond))

	if movesDone != len(moves) {
		t.Errorf("%d of %d moves done under load; want all (the workload ended first?)", movesDone, len(moves))
	}
	for _, k := range redirectKinds {
		if errs[k] > 0 {
			t.Errorf("%d %s errors reached callers (first: %v); want none", errs[k], k, first[k])
		}
	}
	if r.lost > 0 {
		t.Errorf("%d confirmations lost; want none", r.lost)
	}
	// go-redis reloads its whole slot map on a MOVED, so a move of 400
	// slots costs a caller few redirects; an ASK needs a call on a slot
	// while its keys are in flight, which the probe of each move's first
	// slot makes when it catches it (0-2 a run): some redirect must have
	// met the calls, and the slot counts above show the moves.
	if hook.moved.Load()+hook.ask.Load() == 0 {
		t.Errorf("MOVED %d, ASK %d met inside go-redis; want some: the moves must have met the calls",
			hook.moved.Load(), hook.ask.Load())
	}
}
