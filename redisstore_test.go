package idem

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/redisadmin"
	"github.com/idemgo/idem/internal/testing/testenv"
)

// Tests of what is specific to RedisStore: round trips, lost replies, the
// script cache, damaged records, the eviction check, memory. What every
// store must do is storetest's.

// newTestRedisStore returns a store on c under a fresh prefix (unless o
// names one) and deletes the prefix's keys when t ends.
func newTestRedisStore(t testing.TB, c redis.UniversalClient, o RedisOptions) *RedisStore {
	t.Helper()
	if o.Prefix == "" {
		o.Prefix = testenv.UniquePrefix()
	}
	s, err := NewRedisStore(c, o)
	if err != nil {
		t.Fatalf("NewRedisStore: %v", err)
	}
	// First contact now, so that what a test counts or hooks is the steady
	// state; a finding about the server is for the test to assert.
	if err := s.Check(context.Background()); err != nil && !isFinding(err) {
		t.Fatalf("Check: %v", err)
	}
	t.Cleanup(func() {
		if err := testenv.DeletePrefix(context.Background(), c, o.Prefix); err != nil {
			t.Errorf("deleting the test's keys %s*: %v", o.Prefix, err)
		}
	})
	return s
}

// newMiniredisClient returns a client of an in-process miniredis.
func newMiniredisClient(t testing.TB) (*miniredis.Miniredis, *redis.Client) {
	t.Helper()
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return m, c
}

// tripCounter is a go-redis hook that counts round trips: one per command
// sent alone, one per pipeline.
type tripCounter struct {
	mu    sync.Mutex
	trips int
	sent  []string // what each round trip carried, for failure messages
}

func (h *tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		// The store's reads of the server's identity and of the form
		// key, once a second (recheck, rereadForm), are not the cost of
		// the operation they precede.
		if !isIdentityRead(cmd) && !isFormRead(cmd) {
			h.count(cmd.Name())
		}
		return next(ctx, cmd)
	}
}

// isIdentityRead reports the INFO with which a store reads its server's
// identity (readIdentity).
func isIdentityRead(cmd redis.Cmder) bool {
	return fmt.Sprint(cmd.Args()) == "[info server keyspace]"
}

// isFormRead reports the GET with which a store reads its Prefix's form
// key (readForm).
func isFormRead(cmd redis.Cmder) bool {
	a := cmd.Args()
	k, _ := a[len(a)-1].(string)
	return len(a) == 2 && cmd.Name() == "get" && strings.HasSuffix(k, "fields")
}

func (h *tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.count(fmt.Sprintf("pipeline of %d %s", len(cmds), cmdNames(cmds)))
		return next(ctx, cmds)
	}
}

func cmdNames(cmds []redis.Cmder) string {
	names := map[string]bool{}
	for _, c := range cmds {
		names[c.Name()] = true
	}
	var s []string
	for n := range names {
		s = append(s, n)
	}
	return strings.Join(s, ",")
}

func (h *tripCounter) count(what string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.trips++
	h.sent = append(h.sent, what)
}

// take returns the round trips counted since the last take, and what they
// carried.
func (h *tripCounter) take() (int, []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n, sent := h.trips, h.sent
	h.trips, h.sent = 0, nil
	return n, sent
}

// uuidKeys returns n fresh UUID strings: 36-byte keys, like message ids.
func uuidKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = uuid.NewString()
	}
	return keys
}

// claimAllOK claims keys in one batch and fails t unless every one is Claimed.
func claimAllOK(t testing.TB, s *RedisStore, keys []string, fps [][]byte) []*Lease {
	t.Helper()
	cs, err := s.ClaimBatch(context.Background(), keys, fps)
	if err != nil {
		t.Fatalf("ClaimBatch(%d keys): %v", len(keys), err)
	}
	leases := make([]*Lease, len(cs))
	for i, c := range cs {
		if c.Outcome != Claimed {
			t.Fatalf("ClaimBatch: item %d (%q) = %v; want claimed", i, keys[i], c.Outcome)
		}
		leases[i] = c.Lease
	}
	return leases
}

// checkAllDuplicate fails t unless every key is Duplicate in one batch.
func checkAllDuplicate(t testing.TB, s *RedisStore, keys []string) {
	t.Helper()
	cs, err := s.ClaimBatch(context.Background(), keys, nil)
	if err != nil {
		t.Fatalf("ClaimBatch(%d confirmed keys): %v", len(keys), err)
	}
	for i, c := range cs {
		if c.Outcome != Duplicate {
			t.Fatalf("ClaimBatch: confirmed item %d (%q) = %v; want duplicate", i, keys[i], c.Outcome)
		}
	}
}

// redisBackends are the single Redis servers a Redis-specific test runs on:
// miniredis for the logic, the real Redis for what only it shows.
var redisBackends = []struct {
	name   string
	client func(t *testing.T) *redis.Client
}{
	{"miniredis", func(t *testing.T) *redis.Client { _, c := newMiniredisClient(t); return c }},
	{"redis", func(t *testing.T) *redis.Client { return testenv.Redis(t) }},
}

// --- 9. Memory per record ---------------------------------------------------

// TestRedisMemoryPerRecord measures what a confirmed record costs Redis:
// used_memory before and after writing 100,000 of them, in the short form
// (the default) and in the long one. It runs on a Redis
// of its own, started from the same redis-server binary as the shared one:
// other packages' tests write to the shared Redis at the same time, and
// their records would be counted as ours.
func TestRedisMemoryPerRecord(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 200,000 records; skipped with -short")
	}
	c := privateRedis(t)
	ctx := context.Background()
	const n, batch = 100_000, 500
	measure := func(fp []byte, long bool) (perRecord, usage float64, keyLen int) {
		t.Helper()
		// A 6-byte prefix puts the key name (44 bytes) in the same
		// allocator size class as the default "idem:" does (43 bytes): what
		// a deployment pays. The keys are random UUIDs, so a prefix shared
		// with another run could not mix records up.
		var b [2]byte
		_, _ = rand.Read(b[:])
		prefix := "i" + hex.EncodeToString(b[:]) + ":"
		s := newTestRedisStore(t, c, RedisOptions{Prefix: prefix, Retention: 10 * time.Minute, LongConfirmations: long})
		keys := uuidKeys(n)
		var fps [][]byte
		if fp != nil {
			fps = make([][]byte, batch)
			for i := range fps {
				fps[i] = fp
			}
		}
		// Each measure starts from an empty server: unlinked keys leave the
		// key space's tables at their grown size, which the next measure
		// would not pay for. The server is this test's own.
		if err := c.Do(ctx, "FLUSHALL", "SYNC").Err(); err != nil {
			t.Fatalf("FLUSHALL: %v", err)
		}
		before := usedMemory(t, c)
		for i := 0; i < n; i += batch {
			if err := s.ConfirmBatch(ctx, claimAllOK(t, s, keys[i:i+batch], fps), nil); err != nil {
				t.Fatalf("ConfirmBatch: %v", err)
			}
		}
		after := usedMemory(t, c)
		var sum int64
		const sample = 200
		for _, k := range keys[:sample] {
			u, err := c.MemoryUsage(ctx, s.redisKey(k)).Result()
			if err != nil {
				t.Fatalf("MEMORY USAGE: %v", err)
			}
			sum += u
		}
		return float64(after-before) / n, float64(sum) / sample, len(s.redisKey(keys[0]))
	}

	per, usage, keyLen := measure(nil, false)
	t.Logf("confirmed record, %d-byte Redis key, no fingerprint, empty result: %.1f bytes (used_memory), MEMORY USAGE %.0f",
		keyLen, per, usage)
	long, longUsage, _ := measure(nil, true)
	t.Logf("the same in the long form (LongConfirmations): %.1f bytes (used_memory), MEMORY USAGE %.0f", long, longUsage)
	// The short form's saving is the value's own allocation (a 21-byte
	// string, 48 bytes with its object, against none): 32 bytes on Redis
	// 7.0 and 8.0 (docs/BENCHMARKS.md, Records at scale).
	if per > 160 || long-per < 20 {
		t.Errorf("a confirmed record costs %.1f bytes of Redis memory, %.1f in the long form; want at most 160, and 20 less than the long form", per, long)
	}
	per, usage, keyLen = measure(bytes.Repeat([]byte{0xAB}, 32), false)
	t.Logf("confirmed record, %d-byte Redis key, 32-byte fingerprint, empty result: %.1f bytes (used_memory), MEMORY USAGE %.0f",
		keyLen, per, usage)
}

// TestRedisFieldHashesMemory measures what a consumer's confirmed record
// (a 36-byte key, no fingerprint, no result) costs Redis with
// FieldHashes, beside the same records as keys, on a server of its own of
// each product that has HSETEX: used_memory's delta over 200,000 records,
// the figure of docs/BENCHMARKS.md (Records at scale).
func TestRedisFieldHashesMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 400,000 records a server; skipped with -short")
	}
	t.Parallel()
	const n, batch = 200_000, 500
	for _, srv := range testenv.Servers {
		if !srv.FieldExpiry() {
			continue // no HSETEX: FieldHashes keeps keys (TestRedisFieldHashes)
		}
		t.Run(srv.Name, func(t *testing.T) {
			t.Parallel()
			c := redis.NewClient(&redis.Options{Addr: srv.Start(t, "--appendonly", "no").Addr})
			t.Cleanup(func() { _ = c.Close() })
			ctx := context.Background()
			keys := uuidKeys(n)
			measure := func(fields int) float64 {
				t.Helper()
				if err := c.Do(ctx, "FLUSHALL", "SYNC").Err(); err != nil {
					t.Fatalf("FLUSHALL: %v", err)
				}
				s := newTestRedisStore(t, c, RedisOptions{Retention: 10 * time.Minute, FieldHashes: fields})
				s.formGrace = 0
				if err := s.Check(ctx); err != nil {
					t.Fatalf("Check: %v", err)
				}
				before := usedMemory(t, c)
				for i := 0; i < n; i += batch {
					if err := s.ConfirmBatch(ctx, claimAllOK(t, s, keys[i:i+batch], nil), nil); err != nil {
						t.Fatalf("ConfirmBatch: %v", err)
					}
				}
				after := usedMemory(t, c)
				if r, err := s.Lookup(ctx, keys[n-1]); err != nil || !r.Confirmed {
					t.Fatalf("Lookup = %+v, %v; want confirmed", r, err)
				}
				return float64(after-before) / n
			}
			keysForm, one := measure(0), measure(1)
			t.Logf("%s: bytes per confirmed record over %d: keys %.1f; FieldHashes 1 (%.0f fields a hash) %.1f",
				srv.Name, n, keysForm, float64(n)/clusterSlots, one)
			// Redis 8 keeps the fields compact (listpackex): the 80
			// bytes; Valkey 9.1 a hashtable, about 15% under its keys.
			if one > keysForm*0.95 || srv.Name == "redis8.0" && one > 80 {
				t.Errorf("FieldHashes 1 costs %.1f bytes a record against %.1f as keys; want less (at most 80 on Redis 8)", one, keysForm)
			}
		})
	}
}

// privateRedis starts a redis-server for t alone (testenv.StartRedisServer),
// configured as `make test` configures the shared one, and returns a
// client of it.
func privateRedis(t *testing.T) *redis.Client {
	t.Helper()
	srv := testenv.StartRedisServer(t, "--appendonly", "no")
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func usedMemory(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	v, ok := redisadmin.InfoField(context.Background(), c, "memory", "used_memory")
	if !ok {
		t.Fatalf("INFO memory: no used_memory")
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("INFO memory: used_memory %q: %v", v, err)
	}
	return n
}

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

// --- 9. Waiting for replicas (RedisOptions.WaitReplicas) -------------------

// eventLog is an Observer that keeps every Event.
type eventLog struct {
	mu     sync.Mutex
	events []Event
}

func (l *eventLog) Observe(_ context.Context, e Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

// last returns the last event of op.
func (l *eventLog) last(op Op) (Event, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.events) - 1; i >= 0; i-- {
		if l.events[i].Op == op {
			return l.events[i], true
		}
	}
	return Event{}, false
}

// TestRedisWaitReplicas runs on the Sentinel set's master, which has one
// replica: waiting for it succeeds; waiting for two cannot, and says so with
// ErrNotReplicated while the confirmation stays written. Either way a
// Confirm is one round trip, and a ConfirmBatch too.
func TestRedisWaitReplicas(t *testing.T) {
	c := testenv.Sentinel(t)
	ctx := context.Background()
	for _, auto := range []bool{false, true} {
		for _, tt := range []struct {
			replicas int
			timeout  time.Duration
			want     error
		}{
			{1, time.Second, nil},
			{2, 50 * time.Millisecond, ErrNotReplicated},
		} {
			name := map[bool]string{false: "alone", true: "autopipeline"}[auto]
			t.Run(fmt.Sprintf("%s/replicas=%d", name, tt.replicas), func(t *testing.T) {
				events := &eventLog{}
				s := newTestRedisStore(t, c, RedisOptions{
					Observer:     events,
					WaitReplicas: tt.replicas, WaitTimeout: tt.timeout, NoAutoPipeline: !auto,
				})
				if tt.want != nil {
					// First contact refuses a master with fewer replicas
					// than asked, naming the count.
					if _, err := s.Claim(ctx, uuid.NewString(), nil); !errors.Is(err, ErrTooFewReplicas) ||
						!strings.Contains(err.Error(), "has 1 connected replicas") {
						t.Errorf("Claim with WaitReplicas %d on a master with 1 replica = %v; want ErrTooFewReplicas naming 1", tt.replicas, err)
					}
					// What follows is a replica lost after first contact.
					lostReplicaAfterContact(s)
				}
				h := &tripCounter{}
				c.AddHook(h)
				loadScripts(t, c)

				keys := uuidKeys(11)
				leases := claimAllOK(t, s, keys, nil)
				h.take()
				err := s.Confirm(ctx, leases[0], []byte("r"))
				if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
					t.Errorf("Confirm(%q) with WaitReplicas %d = %v; want %v", keys[0], tt.replicas, err, tt.want)
				}
				if trips, sent := h.take(); trips != 1 {
					t.Errorf("Confirm with WaitReplicas cost %d round trips (%v); want 1", trips, sent)
				} else if sent[0] != "pipeline of 2 evalsha,wait" && sent[0] != "pipeline of 2 wait,evalsha" {
					t.Errorf("Confirm with WaitReplicas sent %q; want the script and WAIT in one pipeline", sent[0])
				}
				if e, ok := events.last(OpConfirm); !ok || !errors.Is(e.Err, tt.want) || (tt.want == nil) != (e.Err == nil) {
					t.Errorf("Observer saw Confirm event %+v; want Err %v", e, tt.want)
				}

				err = s.ConfirmBatch(ctx, leases[1:], nil)
				if tt.want == nil && err != nil {
					t.Errorf("ConfirmBatch with WaitReplicas %d = %v; want nil", tt.replicas, err)
				}
				if tt.want != nil {
					var be *BatchError
					if !errors.As(err, &be) || len(be.Errs) != len(leases)-1 {
						t.Fatalf("ConfirmBatch with WaitReplicas %d = %v; want a BatchError of %d items", tt.replicas, err, len(leases)-1)
					}
					for i, e := range be.Errs {
						if !errors.Is(e, tt.want) {
							t.Errorf("ConfirmBatch item %d = %v; want %v", i, e, tt.want)
						}
					}
				}
				if trips, sent := h.take(); trips != 1 {
					t.Errorf("ConfirmBatch with WaitReplicas cost %d round trips (%v); want 1", trips, sent)
				}
				// Replicated or not, the confirmation is on the master.
				checkAllDuplicate(t, s, keys)
			})
		}
	}
}

// TestRedisWaitReplicasCluster: the test cluster's masters have no
// replicas, which first contact refuses; past it (as if they lost their
// replicas later), a wait for one times out with ErrNotReplicated — after the
// confirm and its WAIT went to the master owning each key, one pipeline per
// master.
func TestRedisWaitReplicasCluster(t *testing.T) {
	c := testenv.Cluster(t)
	ctx := context.Background()
	for _, auto := range []bool{false, true} {
		s := newTestRedisStore(t, c, RedisOptions{WaitReplicas: 1, WaitTimeout: 20 * time.Millisecond, NoAutoPipeline: !auto})
		if err := s.Check(ctx); !errors.Is(err, ErrTooFewReplicas) {
			t.Errorf("Check with WaitReplicas 1 on masters without replicas = %v; want ErrTooFewReplicas", err)
		}
		lostReplicaAfterContact(s)
		loadScripts(t, c)
		keys := uuidKeys(30)
		leases := claimAllOK(t, s, keys, nil)
		trips, masters := hookMasters(t, c)
		var wg sync.WaitGroup
		for _, l := range leases[:10] {
			wg.Go(func() {
				if err := s.Confirm(ctx, l, nil); !errors.Is(err, ErrNotReplicated) {
					t.Errorf("Confirm(%q) on a master without replicas = %v; want %v", l.Key, err, ErrNotReplicated)
				}
			})
		}
		wg.Wait()
		trips.take()
		err := s.ConfirmBatch(ctx, leases[10:], nil)
		if !errors.Is(err, ErrNotReplicated) {
			t.Errorf("ConfirmBatch on masters without replicas = %v; want %v", err, ErrNotReplicated)
		}
		got := trips.take()
		if len(got) != masters {
			t.Errorf("ConfirmBatch of 20 keys reached %d masters (%v); want all %d", len(got), got, masters)
		}
		for node, n := range got {
			if n != 1 {
				t.Errorf("ConfirmBatch of 20 keys cost %d round trips to %s (%v); want 1 per master", n, node, got)
			}
		}
		checkAllDuplicate(t, s, keys)
	}
}

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
	s, err := NewRedisStore(c, RedisOptions{Prefix: testenv.UniquePrefix()})
	if err != nil {
		t.Fatalf("NewRedisStore = %v; want a store (it does no I/O)", err)
	}
	// Refused at first contact, by every call, until the server is fixed.
	for range 2 {
		if _, err := s.Claim(ctx, "k", nil); !errors.Is(err, ErrEviction) || !strings.Contains(err.Error(), "allkeys-lru") {
			t.Errorf("Claim on allkeys-lru = %v; want ErrEviction naming the policy", err)
		}
	}
	if err := s.Check(ctx); !errors.Is(err, ErrEviction) {
		t.Errorf("Check on allkeys-lru = %v; want ErrEviction", err)
	}
	allowed := newTestRedisStore(t, c, RedisOptions{Prefix: testenv.UniquePrefix(), AllowEviction: true})
	if _, err := allowed.Claim(ctx, "k", nil); err != nil {
		t.Errorf("Claim on allkeys-lru with AllowEviction = %v; want nil", err)
	}
	if err := c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatalf("restoring maxmemory-policy noeviction: %v", err)
	}
	// Fixed: Check says so at once, and the calls go through.
	if err := s.Check(ctx); err != nil {
		t.Errorf("Check on noeviction = %v; want nil", err)
	}
	if _, err := s.Claim(ctx, "k", nil); err != nil {
		t.Errorf("Claim on noeviction = %v; want nil", err)
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
	s := newTestRedisStore(t, c, RedisOptions{Prefix: testenv.UniquePrefix()})
	if err := s.Check(ctx); !errors.Is(err, ErrEviction) || !strings.Contains(err.Error(), "volatile-ttl") {
		t.Errorf("Check on a cluster with one volatile-ttl master = %v; want ErrEviction naming the policy", err)
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
		err := newTestRedisStore(t, c, RedisOptions{}).Check(context.Background())
		switch {
		case tt.refused && (!errors.Is(err, ErrEviction) || !strings.Contains(err.Error(), tt.policy)):
			t.Errorf("Check on %s with CONFIG refused = %v; want ErrEviction naming the policy", tt.policy, err)
		case !tt.refused && err != nil:
			t.Errorf("Check on %s with CONFIG refused = %v; want nil", tt.policy, err)
		}
	}
}

// TestRedisEvictionPolicyUnreadable: miniredis answers neither CONFIG nor
// INFO memory with the policy: the store works, with a warning.
func TestRedisEvictionPolicyUnreadable(t *testing.T) {
	t.Parallel()
	_, c := newMiniredisClient(t)
	if err := c.ConfigGet(context.Background(), "maxmemory-policy").Err(); err == nil {
		t.Fatalf("miniredis answered CONFIG GET; this test needs a server that refuses it")
	}
	if err := newTestRedisStore(t, c, RedisOptions{}).Check(context.Background()); err != nil {
		t.Errorf("Check on a server refusing CONFIG, no Logger = %v; want nil", err)
	}
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	if err := newTestRedisStore(t, c, RedisOptions{Logger: logger}).Check(context.Background()); err != nil {
		t.Errorf("Check on a server refusing CONFIG = %v; want nil", err)
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
		{"a URL as Addr", redis.NewClient(&redis.Options{Addr: "redis://127.0.0.1:6379/0"}), RedisOptions{},
			`idem: redis.Options.Addr: "redis://127.0.0.1:6379/0" is a URL, not host:port: build the client's options with redis.ParseURL`},
		{"a URL among Addrs", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:7000", "rediss://127.0.0.1:7001"}}), RedisOptions{},
			`idem: redis.ClusterOptions.Addrs: "rediss://127.0.0.1:7001" is a URL, not host:port`},
		{"typed nil client", nilClient, RedisOptions{}, "nil client"},
		{"typed nil client, AllowEviction", nilClient, RedisOptions{AllowEviction: true}, "nil client"},
		{"prefix with {", c, RedisOptions{Prefix: "a{"}, `idem: Prefix: "a{" must not contain`},
		{"prefix with }", c, RedisOptions{Prefix: "}a:"}, `idem: Prefix: "}a:" must not contain`},
		{"prefix with a hash tag", c, RedisOptions{Prefix: "{tenant}:"}, `idem: Prefix: "{tenant}:" must not contain`},
		{"negative Retention", c, RedisOptions{Retention: -time.Second}, "idem: Retention: -1s is negative; 0 means the default, 24h0m0s"},
		{"negative LeaseTTL", c, RedisOptions{LeaseTTL: -1}, "idem: LeaseTTL: -1ns is negative; 0 means the default, 30s"},
		{"sub-millisecond LeaseTTL", c, RedisOptions{LeaseTTL: 500 * time.Microsecond}, "idem: LeaseTTL: 500µs is under 500ms"},
		{"1ms LeaseTTL", c, RedisOptions{LeaseTTL: time.Millisecond}, "idem: LeaseTTL: 1ms is under 500ms"},
		{"sub-millisecond Retention", c, RedisOptions{Retention: time.Microsecond}, "idem: Retention: 1µs is under 1ms"},
		{"Retention shorter than LeaseTTL", c, RedisOptions{Retention: time.Second, LeaseTTL: time.Minute}, "idem: Retention: 1s is shorter than LeaseTTL 1m0s"},
		{"LeaseTTL over the default Retention", c, RedisOptions{LeaseTTL: 48 * time.Hour}, "idem: LeaseTTL: 48h0m0s is longer than the default Retention 24h0m0s; set Retention too"},
		{"negative MaxKeyBytes", c, RedisOptions{MaxKeyBytes: -1}, "idem: MaxKeyBytes: -1 is negative; 0 means the default, 1024"},
		{"negative MaxResultBytes", c, RedisOptions{MaxResultBytes: -1}, "idem: MaxResultBytes: -1 is negative; 0 means the default, 1048576"},
		{"Worker with NUL", c, RedisOptions{Worker: "a\x00b"}, `idem: Worker: "a\x00b" contains a NUL byte`},
		{"negative WaitReplicas", c, RedisOptions{WaitReplicas: -1}, "idem: WaitReplicas: -1 is negative; 0 means the default, no wait"},
		{"negative WaitTimeout", c, RedisOptions{WaitReplicas: 1, WaitTimeout: -time.Second}, "idem: WaitTimeout: -1s is negative; 0 means the default, 1s"},
		{"sub-millisecond WaitTimeout", c, RedisOptions{WaitReplicas: 1, WaitTimeout: time.Microsecond}, "idem: WaitTimeout: 1µs is under 1ms"},
		{"WaitTimeout not below ReadTimeout", c, RedisOptions{WaitReplicas: 1, WaitTimeout: c.Options().ReadTimeout}, "must be shorter than the client's ReadTimeout"},
		{"WaitTimeout without WaitReplicas", c, RedisOptions{WaitTimeout: time.Second}, "idem: WaitTimeout: 1s is set without WaitReplicas"},
		{"MaxResultBytes beyond a Redis string", c, RedisOptions{MaxResultBytes: 1 << 30}, "idem: MaxResultBytes: 1073741824 exceeds"},
		{"MaxKeyBytes beyond a Redis key", c, RedisOptions{MaxKeyBytes: 1 << 28}, "idem: MaxKeyBytes: 268435456 exceeds"},
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

// lostReplicaAfterContact lets s past its first-contact check, as if the
// replicas it counted then were lost since: what WaitReplicas must still
// report, with ErrNotReplicated, on every Confirm.
func lostReplicaAfterContact(s *RedisStore) { s.probe.passed.Store(true) }

// What a crashed key costs Redis: its lapsed claim is kept for the
// Retention past its lease, so that the next claim is told it takes over.
// A 36-byte key, a 36-byte Worker (the default, a UUID) and a 32-byte
// fingerprint (a SHA-256), as the README states it.
func TestRedisCrashedKeyMemory(t *testing.T) {
	c := testenv.Redis(t)
	ctx := t.Context()
	prefix := "idem:" + testenv.UniquePrefix()
	open := func() *RedisStore {
		s, err := NewRedisStore(c, RedisOptions{Prefix: prefix, LeaseTTL: MinLeaseTTL,
			Retention: time.Minute, Worker: uuid.NewString()})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := open(), open()
	key, fp := uuid.NewString(), make([]byte, 32)
	if _, err := a.Claim(ctx, key, fp); err != nil {
		t.Fatal(err)
	}
	usage := func(what string) int64 {
		t.Helper()
		n, err := c.MemoryUsage(ctx, a.RecordKey(key)).Result()
		if err != nil {
			t.Fatalf("MEMORY USAGE of %s = %v", what, err)
		}
		ttl := c.PTTL(ctx, a.RecordKey(key)).Val()
		t.Logf("%s: %d bytes (MEMORY USAGE), %v left", what, n, ttl.Round(time.Second))
		return n
	}
	time.Sleep(MinLeaseTTL * 3 / 2)
	crashed := usage("a lapsed claim, kept for the retention")
	cl, err := b.Claim(ctx, key, fp)
	if err != nil || !cl.TakeOver {
		t.Fatalf("Claim after the lapse = %+v, %v; want a take-over", cl, err)
	}
	if err := b.Checkpoint(ctx, cl.Lease, []byte("step-1")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(MinLeaseTTL * 3 / 2)
	again := usage("a lapsed take-over with a prior attempt and a 6-byte checkpoint")
	// Bounded: one key per record, at most a prior attempt and the
	// checkpoint more than a claim.
	if crashed > 256 || again > crashed+128 {
		t.Errorf("a crashed key costs %d bytes, %d after a take-over; want at most 256 and 128 more", crashed, again)
	}
}

// TestRedisFieldHashes checks where FieldHashes keeps a short confirmation
// (a field where the server has HSETEX, the key elsewhere) and that each
// operation finds it there: a claim, a batch's claim, Lookup, Inspect, a
// repeated and a late confirm, an operator's clear.
func TestRedisFieldHashes(t *testing.T) {
	t.Parallel()
	testenv.EachServer(t, func(t *testing.T, srv testenv.Server) {
		t.Parallel()
		c := srv.Client(t)
		ctx := context.Background()
		s := newTestRedisStore(t, c, RedisOptions{Prefix: testenv.UniquePrefix(), FieldHashes: 4, Retention: time.Hour})
		s.formGrace = 0
		fields := srv.FieldExpiry()
		where := func(k string) (key, field bool) {
			t.Helper()
			n, err := c.Exists(ctx, s.redisKey(k)).Result()
			if err != nil {
				t.Fatalf("EXISTS: %v", err)
			}
			f, err := c.HExists(ctx, s.fieldHash(s.form.Load(), k, false), escapeKey(k)).Result()
			if err != nil {
				t.Fatalf("HEXISTS: %v", err)
			}
			return n == 1, f
		}
		claim := func(k string, want Outcome) Claim {
			t.Helper()
			cl, err := s.Claim(ctx, k, nil)
			if err != nil || cl.Outcome != want {
				t.Fatalf("Claim(%q) = %v, %v; want outcome %v", k, cl.Outcome, err, want)
			}
			return cl
		}

		k := "order 1/{x}" // escaped, with braces of its own
		cl := claim(k, Claimed)
		if err := s.Confirm(ctx, cl.Lease, nil); err != nil {
			t.Fatalf("Confirm: %v", err)
		}
		if inKey, inField := where(k); inKey == fields || inField != fields {
			t.Fatalf("after Confirm: key %v, field %v; want the field only when the server has HSETEX (%v)", inKey, inField, fields)
		}
		dup := claim(k, Duplicate)
		if dup.Record == nil || dup.Record.Token != cl.Lease.Token || !dup.Record.Confirmed {
			t.Fatalf("duplicate's record %+v; want confirmed with token %d", dup.Record, cl.Lease.Token)
		}
		if left := time.Until(dup.Record.Expires); left < 59*time.Minute || left > time.Hour+time.Minute {
			t.Fatalf("duplicate's record expires in %v; want the hour of Retention", left)
		}
		cs, err := s.ClaimBatch(ctx, []string{"order 2", k}, nil)
		if err != nil || cs[0].Outcome != Claimed || cs[1].Outcome != Duplicate || cs[1].Record.Token != cl.Lease.Token {
			t.Fatalf("ClaimBatch = %+v, %v; want order 2 claimed, %q a duplicate", cs, err, k)
		}
		if err := s.ConfirmBatch(ctx, []*Lease{cs[0].Lease}, nil); err != nil {
			t.Fatalf("ConfirmBatch: %v", err)
		}
		if inKey, inField := where("order 2"); inKey == fields || inField != fields {
			t.Fatalf("after ConfirmBatch: key %v, field %v; want the field only when the server has HSETEX (%v)", inKey, inField, fields)
		}
		for _, read := range []func(context.Context, string) (*Record, error){s.Lookup, s.Inspect} {
			r, err := read(ctx, k)
			if err != nil || r == nil || !r.Confirmed || r.Token != cl.Lease.Token {
				t.Fatalf("Lookup/Inspect = %+v, %v; want confirmed with token %d", r, err, cl.Lease.Token)
			}
		}
		// A repeat of the same confirm, and another lease's: the first
		// confirmation stays.
		if err := s.Confirm(ctx, cl.Lease, nil); err != nil {
			t.Fatalf("repeated Confirm: %v", err)
		}
		short := newTestRedisStore(t, c, RedisOptions{Prefix: s.prefix, FieldHashes: 4, Retention: time.Hour, LeaseTTL: MinLeaseTTL})
		short.formGrace = 0
		first, err := short.Claim(ctx, "order 4", nil)
		if err != nil || first.Outcome != Claimed {
			t.Fatalf("Claim = %v, %v; want claimed", first.Outcome, err)
		}
		time.Sleep(MinLeaseTTL + 100*time.Millisecond)
		second := claim("order 4", Claimed)
		if err := s.Confirm(ctx, second.Lease, nil); err != nil {
			t.Fatalf("Confirm: %v", err)
		}
		if err := short.Confirm(ctx, first.Lease, nil); !errors.Is(err, ErrAlreadyConfirmed) {
			t.Fatalf("another lease's Confirm = %v; want ErrAlreadyConfirmed", err)
		}
		// A confirmation with a result is no short one: a key.
		cl3 := claim("order 3", Claimed)
		if err := s.Confirm(ctx, cl3.Lease, []byte("receipt")); err != nil {
			t.Fatalf("Confirm with a result: %v", err)
		}
		if inKey, inField := where("order 3"); !inKey || inField {
			t.Fatalf("a confirmation with a result: key %v, field %v; want the key", inKey, inField)
		}
		// An operator's clear removes the field, and the key runs again.
		if err := s.Resolve(ctx, k, Resolution{Force: true}); err != nil {
			t.Fatalf("Resolve Force: %v", err)
		}
		// (A key's clear leaves a forgotten claim's token, which reads as
		// no record.)
		if _, inField := where(k); inField {
			t.Fatalf("after a clear: the field is still there")
		}
		claim(k, Claimed)
	})
}

// SetFormGrace sets formGrace for the stores made after it: for the
// external tests of this package, from their TestMain, before any test.
func SetFormGrace(d time.Duration) { formGrace = d }

// TestRedisFieldForm checks the form's key: a store with FieldHashes
// writes it and keeps confirmations as keys for its grace; a store made
// without FieldHashes before it reads it on a later call and finds the
// fields (and keeps its own confirmations as fields too); a store with
// another FieldHashes, or a key idem did not write, is refused.
func TestRedisFieldForm(t *testing.T) {
	t.Parallel()
	for _, srv := range testenv.Servers {
		if !srv.FieldExpiry() {
			continue // no HSETEX: TestRedisFieldHashes checks keys stay keys
		}
		t.Run(srv.Name, func(t *testing.T) {
			t.Parallel()
			c := srv.Client(t)
			ctx := context.Background()
			prefix := testenv.UniquePrefix()
			t.Cleanup(func() { _ = testenv.DeletePrefix(context.Background(), c, prefix) })
			open := func(n int) *RedisStore {
				s, err := NewRedisStore(c, RedisOptions{Prefix: prefix, FieldHashes: n, Retention: time.Hour})
				if err != nil {
					t.Fatalf("NewRedisStore: %v", err)
				}
				s.formGrace = 1500 * time.Millisecond // before its first contact
				return s
			}
			confirm := func(s *RedisStore, k string) {
				t.Helper()
				cl, err := s.Claim(ctx, k, nil)
				if err != nil || cl.Outcome != Claimed {
					t.Fatalf("Claim(%q) = %v, %v; want claimed", k, cl.Outcome, err)
				}
				if err := s.Confirm(ctx, cl.Lease, nil); err != nil {
					t.Fatalf("Confirm(%q): %v", k, err)
				}
			}
			asField := func(k string) bool {
				t.Helper()
				n, err := c.Exists(ctx, prefix+"{"+k+"}").Result()
				if err != nil {
					t.Fatalf("EXISTS: %v", err)
				}
				return n == 0
			}
			before, idle := open(0), open(0)
			for _, s := range []*RedisStore{before, idle} {
				if err := s.Check(ctx); err != nil {
					t.Fatalf("Check without FieldHashes: %v", err)
				}
			}
			if before.form.Load() != nil {
				t.Fatalf("a store without FieldHashes, and no form key: form %+v; want none", before.form.Load())
			}
			on := open(2)
			if err := on.Check(ctx); err != nil {
				t.Fatalf("Check with FieldHashes 2: %v", err)
			}
			if v, err := c.Get(ctx, prefix+"fields").Result(); err != nil || !strings.HasPrefix(v, "2:") {
				t.Fatalf("form key = %q, %v; want 2:<ms>", v, err)
			}
			confirm(on, "early")
			// Asked only when the confirm ended within the grace: a stalled
			// machine may have let it pass.
			if time.Now().Before(on.form.Load().writeFrom) && asField("early") {
				t.Fatalf("a confirmation within the grace is a field; want a key, for stores that have not read the form key")
			}
			// The store made before reads the key again on a call, within
			// formEvery.
			time.Sleep(formEvery + 100*time.Millisecond)
			if _, err := before.Lookup(ctx, "early"); err != nil {
				t.Fatalf("Lookup: %v", err)
			}
			if f := before.form.Load(); f == nil || f.n != 2 {
				t.Fatalf("the earlier store's form after a call %+v; want 2 hashes a slot", f)
			}
			time.Sleep(time.Until(on.form.Load().writeFrom))
			confirm(on, "late")
			if !asField("late") {
				t.Fatalf("a confirmation after the grace is a key; want a field")
			}
			if cl, err := before.Claim(ctx, "late", nil); err != nil || cl.Outcome != Duplicate {
				t.Fatalf("the earlier store's Claim of a field's key = %v, %v; want a duplicate", cl.Outcome, err)
			}
			confirm(before, "adopted")
			if !asField("adopted") {
				t.Fatalf("the earlier store's confirmation is a key; want a field, as the form key says")
			}
			// A store idle since before the form key: its first calls after
			// the grace, all at once, each read the key (one reading, the
			// others wait for it) before they claim.
			var keys []string
			for i := range 32 {
				keys = append(keys, fmt.Sprintf("burst-%d", i))
				confirm(on, keys[i])
			}
			var wg sync.WaitGroup
			var claimed atomic.Int32
			for _, k := range keys {
				wg.Go(func() {
					if cl, err := idle.Claim(ctx, k, nil); err != nil || cl.Outcome != Duplicate {
						claimed.Add(1)
						t.Errorf("the idle store's Claim(%q) = %v, %v; want a duplicate", k, cl.Outcome, err)
					}
				})
			}
			wg.Wait()
			if n := claimed.Load(); n > 0 {
				t.Fatalf("the idle store answered %d of %d confirmed keys otherwise than a duplicate", n, len(keys))
			}
			// A field that is no token of 16 digits is damaged, to every reader.
			if err := c.HSet(ctx, on.fieldHash(on.form.Load(), "bad", false), "bad", "1F12345").Err(); err != nil {
				t.Fatalf("HSET: %v", err)
			}
			if _, err := on.Claim(ctx, "bad", nil); !errors.Is(err, ErrDamaged) {
				t.Fatalf("Claim of a damaged field = %v; want ErrDamaged", err)
			}
			if _, err := on.Lookup(ctx, "bad"); !errors.Is(err, ErrDamaged) {
				t.Fatalf("Lookup of a damaged field = %v; want ErrDamaged", err)
			}
			if _, err := on.ClaimBatch(ctx, []string{"bad", "fine"}, nil); !errors.Is(err, ErrDamaged) {
				t.Fatalf("ClaimBatch with a damaged field = %v; want ErrDamaged", err)
			}
			other := open(3)
			if err := other.Check(ctx); !errors.Is(err, ErrFieldHashes) || !strings.Contains(err.Error(), "set FieldHashes to 2") {
				t.Fatalf("Check with FieldHashes 3 = %v; want ErrFieldHashes naming 2", err)
			}
			if _, err := other.Claim(ctx, "late", nil); !errors.Is(err, ErrFieldHashes) {
				t.Fatalf("Claim with FieldHashes 3 = %v; want ErrFieldHashes", err)
			}
			// The form key changed under a running store: its next claim
			// after formEvery is refused.
			if err := c.Set(ctx, prefix+"fields", "3:1", 0).Err(); err != nil {
				t.Fatalf("SET: %v", err)
			}
			time.Sleep(formEvery + 100*time.Millisecond)
			if _, err := on.Claim(ctx, "after", nil); !errors.Is(err, ErrFieldHashes) {
				t.Fatalf("Claim with FieldHashes 2 once the key says 3 = %v; want ErrFieldHashes", err)
			}
			if err := c.Set(ctx, prefix+"fields", "two", 0).Err(); err != nil {
				t.Fatalf("SET: %v", err)
			}
			if err := open(0).Check(ctx); !errors.Is(err, ErrFieldHashes) {
				t.Fatalf("Check with a form key idem did not write = %v; want ErrFieldHashes", err)
			}
		})
	}
}
