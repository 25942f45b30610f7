package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/redisadmin"
)

// Cost is what one message costs, measured by the cost pass on one
// goroutine.
type Cost struct {
	Msgs int // messages the pass ran
	// Redis is false for a contender that does not talk to Redis; the
	// three Redis figures are then meaningless.
	Redis      bool
	Sent       float64 // commands the client sent per message (hook)
	RoundTrips float64 // round trips per message (hook: one per command or pipeline)
	Ran        float64 // commands Redis ran per message, a script's own calls included (INFO commandstats)
	Allocs     float64 // heap allocations per message (runtime.MemStats.Mallocs delta)
	Bytes      float64 // heap bytes allocated per message (runtime.MemStats.TotalAlloc delta)
}

// counter is a go-redis hook that counts commands and round trips.
type counter struct{ cmds, trips atomic.Int64 }

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.cmds.Add(1)
		c.trips.Add(1)
		return next(ctx, cmd)
	}
}

func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.cmds.Add(int64(len(cmds)))
		c.trips.Add(1)
		return next(ctx, cmds)
	}
}

// measureCost runs c for msgs messages on one goroutine, on clients of
// their own that carry a counting hook (the timed rounds run without it).
func measureCost(ctx context.Context, e *Env, c Contender, msgs int) (Cost, error) {
	ce := *e
	cnt := &counter{}
	var closers []func() error
	defer func() {
		for _, f := range closers {
			_ = f()
		}
	}()
	if e.Redis != nil {
		r := redis.NewClient(e.Redis.Options())
		r.AddHook(cnt)
		ce.Redis, closers = r, append(closers, r.Close)
	}
	if e.Cluster != nil {
		r := redis.NewClusterClient(e.Cluster.Options())
		r.AddHook(cnt)
		ce.Cluster, closers = r, append(closers, r.Close)
	}
	in, err := c.Open(ctx, &ce)
	if err != nil {
		return Cost{}, err
	}
	if in.Close != nil {
		closers = append(closers, in.Close)
	}
	op := in.Worker()
	ops := max(1, msgs/c.msgs())
	// Warm up: connections dialled, scripts loaded, pools filled.
	for range min(ops, 20) {
		if err := op(ctx); err != nil {
			return Cost{}, err
		}
	}
	ran := func() (int64, error) { return 0, nil }
	if c.Redis {
		switch c.Group {
		case GroupCluster:
			ran = func() (int64, error) { return clusterCalls(ctx, ce.Cluster) }
		default:
			ran = func() (int64, error) { return commandCalls(ctx, ce.Redis) }
		}
	}
	ran0, err := ran()
	if err != nil {
		return Cost{}, err
	}
	cmds0, trips0 := cnt.cmds.Load(), cnt.trips.Load()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	for range ops {
		if err := op(ctx); err != nil {
			return Cost{}, err
		}
	}
	runtime.ReadMemStats(&m1)
	cmds, trips := cnt.cmds.Load()-cmds0, cnt.trips.Load()-trips0
	ran1, err := ran()
	if err != nil {
		return Cost{}, err
	}
	n := float64(ops * c.msgs())
	return Cost{
		Msgs:       ops * c.msgs(),
		Redis:      c.Redis,
		Sent:       float64(cmds) / n,
		RoundTrips: float64(trips) / n,
		Ran:        float64(ran1-ran0) / n,
		Allocs:     float64(m1.Mallocs-m0.Mallocs) / n,
		Bytes:      float64(m1.TotalAlloc-m0.TotalAlloc) / n,
	}, nil
}

// commandCalls sums the calls of INFO commandstats, leaving out the
// commands a client sends to look after itself and the cost pass's own
// INFO: what remains is the work's.
func commandCalls(ctx context.Context, c *redis.Client) (int64, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO commandstats: %w", err)
	}
	var sum int64
	for _, line := range strings.Split(info, "\r\n") {
		stat, ok := strings.CutPrefix(line, "cmdstat_")
		if !ok {
			continue // the section's heading
		}
		name, rest, _ := strings.Cut(stat, ":")
		switch {
		case name == "info", name == "ping", name == "hello", name == "readonly",
			strings.HasPrefix(name, "cluster"), strings.HasPrefix(name, "command"), strings.HasPrefix(name, "client"):
			continue
		}
		v, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO commandstats: line %q: %w", line, err)
		}
		sum += n
	}
	return sum, nil
}

// clusterCalls is commandCalls summed over the cluster's masters.
func clusterCalls(ctx context.Context, c *redis.ClusterClient) (int64, error) {
	return sumMasters(ctx, c, commandCalls)
}

// serverCPU returns the CPU time that the Redis of group has used so far
// (summed over a cluster's masters).
func serverCPU(ctx context.Context, e *Env, group string) (time.Duration, error) {
	if group != GroupCluster {
		return redisCPU(ctx, e.Redis)
	}
	return sumMasters(ctx, e.Cluster, redisCPU)
}

// sumMasters returns the sum of f over the cluster's masters, which
// ForEachMaster visits at once.
func sumMasters[T int64 | time.Duration](ctx context.Context, c *redis.ClusterClient, f func(context.Context, *redis.Client) (T, error)) (T, error) {
	var (
		mu  sync.Mutex
		sum T
	)
	err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		v, err := f(ctx, m)
		mu.Lock()
		sum += v
		mu.Unlock()
		return err
	})
	return sum, err
}

// redisCPU reads used_cpu_user + used_cpu_sys (seconds, to the microsecond)
// from INFO cpu.
func redisCPU(ctx context.Context, c *redis.Client) (time.Duration, error) {
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO cpu: %w", err)
	}
	var sum time.Duration
	for _, field := range []string{"used_cpu_user", "used_cpu_sys"} {
		v, ok := redisadmin.InfoValue(info, field)
		if !ok {
			return 0, fmt.Errorf("INFO cpu: no %s in %q", field, info)
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu: %s %q: %w", field, v, err)
		}
		sum += time.Duration(f * float64(time.Second))
	}
	return sum, nil
}

// Memory is what one confirmed record costs Redis: a 36-byte key (a UUID),
// the default prefix, no fingerprint, an empty result.
type Memory struct {
	Records int
	KeyLen  int // the Redis key's length, prefix and hash tag included
	// UsedMemory is the used_memory delta per record: what a deployment
	// pays, allocator overhead and the key space's tables included. Other
	// clients' writes to the same Redis during the pass distort it.
	UsedMemory float64
	// MemoryUsage is the mean MEMORY USAGE of a sample of the records: the
	// record alone, immune to other clients.
	MemoryUsage float64
	// ExpireCPU is the Redis CPU per record, in microseconds, that the
	// records cost again when their retention ends and Redis expires them
	// (see measureExpiry). The timed rounds delete their records before
	// that, so no per-message figure includes it.
	ExpireCPU float64
	// ExpireSpread is the span over which the records' due times were
	// evenly set.
	ExpireSpread time.Duration
}

// measureMemory writes n confirmed records through a RedisStore, reads
// used_memory before and after, then lets them expire over spread to measure
// what their expiry costs (measureExpiry); whatever is left is deleted.
func measureMemory(ctx context.Context, c *redis.Client, n int, spread time.Duration) (*Memory, error) {
	const batch = 500
	s, err := idem.NewRedisStore(c, idem.RedisOptions{Retention: 10 * time.Minute})
	if err != nil {
		return nil, err
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = uuid.NewString()
	}
	used := func() (int64, error) {
		v, ok := redisadmin.InfoField(ctx, c, "memory", "used_memory")
		if !ok {
			return 0, errors.New("INFO memory has no used_memory")
		}
		return strconv.ParseInt(v, 10, 64)
	}
	defer func() {
		rks := make([]string, 0, batch)
		for i, k := range keys {
			rks = append(rks, idem.DefaultPrefix+"{"+k+"}")
			if len(rks) == batch || i == len(keys)-1 {
				_ = c.Unlink(context.WithoutCancel(ctx), rks...).Err()
				rks = rks[:0]
			}
		}
	}()
	before, err := used()
	if err != nil {
		return nil, err
	}
	leases := make([]*idem.Lease, 0, batch)
	for i := 0; i < n; i += batch {
		part := keys[i:min(i+batch, n)]
		cs, err := s.ClaimBatch(ctx, part, nil)
		if err != nil {
			return nil, err
		}
		leases = leases[:0]
		for j, cl := range cs {
			if cl.Outcome != idem.Claimed {
				return nil, fmt.Errorf("ClaimBatch: %q = %v; want claimed", part[j], cl.Outcome)
			}
			leases = append(leases, cl.Lease)
		}
		if err := s.ConfirmBatch(ctx, leases, nil); err != nil {
			return nil, err
		}
	}
	after, err := used()
	if err != nil {
		return nil, err
	}
	// A UUID has no byte that the key encoding escapes, so the Redis key is
	// the prefix, the key in braces: 43 bytes.
	rk := idem.DefaultPrefix + "{" + keys[0] + "}"
	if rec, err := s.Lookup(ctx, keys[0]); err != nil || !rec.Confirmed {
		return nil, fmt.Errorf("Lookup(%q) after the confirm = %v, %v; want a confirmation", keys[0], rec, err)
	}
	sample := min(n, 200)
	var sum int64
	for _, k := range keys[:sample] {
		u, err := c.MemoryUsage(ctx, idem.DefaultPrefix+"{"+k+"}").Result()
		if err != nil {
			return nil, fmt.Errorf("MEMORY USAGE: %w", err)
		}
		sum += u
	}
	m := &Memory{
		Records:      n,
		KeyLen:       len(rk),
		UsedMemory:   float64(after-before) / float64(n),
		MemoryUsage:  float64(sum) / float64(sample),
		ExpireSpread: spread,
	}
	rks := make([]string, n)
	for i, k := range keys {
		rks[i] = idem.DefaultPrefix + "{" + k + "}"
	}
	if m.ExpireCPU, err = measureExpiry(ctx, c, rks, spread); err != nil {
		return nil, fmt.Errorf("expiry: %w", err)
	}
	return m, nil
}

// measureExpiry makes keys (records with a long retention, nothing else
// touching them) expire evenly over spread and returns the Redis CPU per key,
// in microseconds, spent until Redis has expired them, less what the server
// spends idle over as long. Nothing reads the keys, so Redis finds them by
// its active expiry, as it finds the records of keys never seen again. The
// figure means something on a Redis that nothing else uses meanwhile (as
// `make bench` starts one); on a shared one other clients' work and expiries
// blur it, and it may even come out below zero.
func measureExpiry(ctx context.Context, c *redis.Client, keys []string, spread time.Duration) (float64, error) {
	const poll = 50 * time.Millisecond
	expired := func() (int64, error) {
		info, err := c.Info(ctx, "stats").Result()
		if err != nil {
			return 0, fmt.Errorf("INFO stats: %w", err)
		}
		v, ok := redisadmin.InfoValue(info, "expired_keys")
		if !ok {
			return 0, errors.New("INFO stats has no expired_keys")
		}
		return strconv.ParseInt(v, 10, 64)
	}
	// The idle server over spread, read the way the expiry is watched
	// (INFO every poll), so that both include the same polling.
	cpu0, err := redisCPU(ctx, c)
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	for time.Since(t0) < spread {
		if _, err := expired(); err != nil {
			return 0, err
		}
		time.Sleep(poll)
	}
	cpu1, err := redisCPU(ctx, c)
	if err != nil {
		return 0, err
	}
	idle := float64(cpu1-cpu0) / float64(time.Since(t0))

	// The due times are on the server's clock, and every expiry is set
	// before the first falls due (pipelined, a thousand take well under
	// 20ms here): the count below starts with all the keys in place.
	now, err := c.Time(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("TIME: %w", err)
	}
	lead := 500*time.Millisecond + time.Duration(len(keys))*20*time.Microsecond
	start := now.Add(lead)
	for lo := 0; lo < len(keys); lo += 1000 {
		_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := lo; i < min(lo+1000, len(keys)); i++ {
				p.PExpireAt(ctx, keys[i], start.Add(spread*time.Duration(i)/time.Duration(len(keys))))
			}
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("PEXPIREAT: %w", err)
		}
	}
	if now, err = c.Time(ctx).Result(); err != nil {
		return 0, fmt.Errorf("TIME: %w", err)
	}
	if start.Sub(now) < poll {
		return 0, fmt.Errorf("setting %d expiries took longer than %v", len(keys), lead)
	}
	e0, err := expired()
	if err != nil {
		return 0, err
	}
	cpu0, err = redisCPU(ctx, c)
	if err != nil {
		return 0, err
	}
	t0 = time.Now()
	for {
		e, err := expired()
		if err != nil {
			return 0, err
		}
		// On a shared Redis other clients' keys count in expired_keys too:
		// the pass also waits for the key that falls due last.
		if e-e0 >= int64(len(keys)) {
			if n, err := c.Exists(ctx, keys[len(keys)-1]).Result(); err != nil {
				return 0, err
			} else if n == 0 {
				break
			}
		}
		if time.Since(t0) > lead+spread+30*time.Second {
			return 0, fmt.Errorf("only %d of %d keys expired in %v", e-e0, len(keys), time.Since(t0))
		}
		time.Sleep(poll)
	}
	cpu1, err = redisCPU(ctx, c)
	if err != nil {
		return 0, err
	}
	busy := float64(cpu1-cpu0) - idle*float64(time.Since(t0))
	return busy / float64(time.Microsecond) / float64(len(keys)), nil
}
