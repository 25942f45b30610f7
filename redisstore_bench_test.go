package idem

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/testing/testenv"
)

// Benchmarks on the real Redis (IDEM_REDIS_ADDR). Throughput is reported as
// msgs/s: messages deduplicated per second, whatever an op carries.
//
// Client and server share the machine, so absolute figures are noisy;
// compare ratios within one run. Go's -count repeats each benchmark in
// sequence, so rounds of different benchmarks never interleave; for that,
// BenchmarkRedisCompare runs -idem.rounds rounds of all of them:
//
//	go test -run '^$' -bench RedisCompare -benchtime 500ms -idem.rounds 7 .

var benchRounds = flag.Int("idem.rounds", 1,
	"rounds of BenchmarkRedisCompare, each running every store and baseline benchmark once")

// benchGoroutines is how many goroutines the parallel benchmarks run: a busy
// consumer fleet, whatever GOMAXPROCS is.
const benchGoroutines = 64

// runGoroutines runs body in g goroutines (g = 1: the benchmark's own), each
// calling next until it reports false, as RunParallel's pb.Next does.
func runGoroutines(b *testing.B, g int, body func(next func() bool)) {
	b.ReportAllocs()
	b.ResetTimer()
	if g == 1 {
		i := 0
		body(func() bool { i++; return i <= b.N })
		return
	}
	b.SetParallelism(max(1, (g+runtime.GOMAXPROCS(0)-1)/runtime.GOMAXPROCS(0)))
	b.RunParallel(func(pb *testing.PB) { body(pb.Next) })
}

func reportMsgs(b *testing.B, msgs int) {
	b.ReportMetric(float64(msgs)/b.Elapsed().Seconds(), "msgs/s")
}

// benchStore returns a store on c whose keys are deleted when b ends.
func benchStore(b *testing.B, c *redis.Client) *RedisStore {
	b.Helper()
	// Short retention: should the clean-up not run, Redis forgets the keys
	// by itself.
	return newTestRedisStore(b, c, RedisOptions{Retention: 10 * time.Minute})
}

func BenchmarkRedisClaimConfirm(b *testing.B) {
	benchClaimConfirm(b, testenv.Redis(b), benchGoroutines, false)
}

func BenchmarkRedisClaimConfirmAutoPipeline(b *testing.B) {
	benchClaimConfirm(b, testenv.Redis(b), benchGoroutines, true)
}

func BenchmarkRedisBatch100(b *testing.B) { benchBatch100(b, testenv.Redis(b)) }

func BenchmarkRedisSetNXBaseline(b *testing.B) { benchSetNX(b, testenv.Redis(b), benchGoroutines) }

// BenchmarkRedisCompare interleaves the benchmarks, round after round, so
// that a change in the machine's load shows in all of them alike: Claim and
// Confirm with and without AutoPipeline and the SET NX + SET XX floor at 1
// goroutine (latency: ns/op is one message's two calls), 64 and 256
// goroutines (throughput: msgs/s), then batches and the script floor.
func BenchmarkRedisCompare(b *testing.B) {
	c := testenv.Redis(b)
	for range *benchRounds {
		// A caller whose context can be cancelled hands a pipeline it sends
		// to a goroutine (see autoPipe.do): at 1 goroutine, both kinds.
		b.Run("ClaimConfirmCtx/g=1", func(b *testing.B) { benchClaimConfirmCtx(b, c, cancellable(b), 1, false) })
		b.Run("ClaimConfirmAutoCtx/g=1", func(b *testing.B) { benchClaimConfirmCtx(b, c, cancellable(b), 1, true) })
		for _, g := range []int{1, benchGoroutines, 256} {
			b.Run(fmt.Sprintf("ClaimConfirm/g=%d", g), func(b *testing.B) { benchClaimConfirm(b, c, g, false) })
			b.Run(fmt.Sprintf("ClaimConfirmAuto/g=%d", g), func(b *testing.B) { benchClaimConfirm(b, c, g, true) })
			b.Run(fmt.Sprintf("SetNXBaseline/g=%d", g), func(b *testing.B) { benchSetNX(b, c, g) })
		}
		b.Run("Batch100", func(b *testing.B) { benchBatch100(b, c) })
		b.Run("ScriptFloor", func(b *testing.B) { benchScriptFloor(b, c) })
	}
}

// benchClaimConfirm: one Claim and one Confirm per message, unique keys, in
// g goroutines, with or without AutoPipeline.
func benchClaimConfirm(b *testing.B, c *redis.Client, g int, auto bool) {
	benchClaimConfirmCtx(b, c, context.Background(), g, auto)
}

// cancellable returns a context that can be cancelled, as a request's can.
func cancellable(b *testing.B) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	return ctx
}

func benchClaimConfirmCtx(b *testing.B, c *redis.Client, ctx context.Context, g int, auto bool) {
	s := newTestRedisStore(b, c, RedisOptions{Retention: 10 * time.Minute, NoAutoPipeline: !auto})
	var next atomic.Uint64
	cost := redisCost{c: c}
	cost.start(b)
	runGoroutines(b, g, func(more func() bool) {
		result := []byte("ok")
		for more() {
			key := strconv.FormatUint(next.Add(1), 10)
			cl, err := s.Claim(ctx, key, nil)
			if err != nil || cl.Outcome != Claimed {
				b.Errorf("Claim(%q) = %v, %v; want claimed", key, cl.Outcome, err)
				return
			}
			if err := s.Confirm(ctx, cl.Lease, result); err != nil {
				b.Errorf("Confirm(%q): %v", key, err)
				return
			}
		}
	})
	b.StopTimer()
	cost.report(b)
	reportMsgs(b, b.N)
}

// benchBatch100: one ClaimBatch and one ConfirmBatch of 100 messages per op.
func benchBatch100(b *testing.B, c *redis.Client) {
	const size = 100
	s := benchStore(b, c)
	ctx := context.Background()
	var next atomic.Uint64
	runGoroutines(b, benchGoroutines, func(more func() bool) {
		keys := make([]string, size)
		leases := make([]*Lease, size)
		for more() {
			for i := range keys {
				keys[i] = strconv.FormatUint(next.Add(1), 10)
			}
			cs, err := s.ClaimBatch(ctx, keys, nil)
			if err != nil {
				b.Errorf("ClaimBatch: %v", err)
				return
			}
			for i, cl := range cs {
				if cl.Outcome != Claimed {
					b.Errorf("ClaimBatch: item %q = %v; want claimed", keys[i], cl.Outcome)
					return
				}
				leases[i] = cl.Lease
			}
			if err := s.ConfirmBatch(ctx, leases, nil); err != nil {
				b.Errorf("ConfirmBatch: %v", err)
				return
			}
		}
	})
	reportMsgs(b, b.N*size)
}

// benchSetNX is the floor: what the same two writes per message cost as
// plain commands, SET NX PX to claim and SET XX PX to confirm.
func benchSetNX(b *testing.B, c *redis.Client, g int) {
	// An odd millisecond makes go-redis send PX, as the store's scripts do.
	lease := redis.SetArgs{Mode: "NX", TTL: 30*time.Second + time.Millisecond}
	retention := redis.SetArgs{Mode: "XX", TTL: 10*time.Minute + time.Millisecond}
	benchRawPerMessage(b, c, g, func(ctx context.Context, key string) error {
		if err := c.SetArgs(ctx, key, "v", lease).Err(); err != nil {
			return fmt.Errorf("SET %s NX PX: %w", key, err)
		}
		if err := c.SetArgs(ctx, key, "v2", retention).Err(); err != nil {
			return fmt.Errorf("SET %s XX PX: %w", key, err)
		}
		return nil
	})
}

// The least any atomic, script-based claim and confirm must send: a claim
// that reads the server clock (the fencing token) and writes with NX, and a
// confirm that reads the record before writing it. idem's own scripts do
// these same four Redis calls, so this separates what Lua costs from what
// idem adds.
var (
	// Made when first used: redis.NewScript hashes with SHA-1, which the
	// test binary must not do at init (the suite runs under
	// GODEBUG=fips140=only too).
	floorClaim = sync.OnceValue(func() *redis.Script {
		return redis.NewScript("local t = redis.call('TIME') return redis.call('SET', KEYS[1], t[1] .. t[2], 'NX', 'PX', ARGV[1])")
	})
	floorConfirm = sync.OnceValue(func() *redis.Script {
		return redis.NewScript("local v = redis.call('GET', KEYS[1]) return redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])")
	})
)

// benchScriptFloor runs floorClaim and floorConfirm per message.
func benchScriptFloor(b *testing.B, c *redis.Client) {
	benchRawPerMessage(b, c, benchGoroutines, func(ctx context.Context, key string) error {
		if err := floorClaim().Run(ctx, c, []string{key}, "30001").Err(); err != nil {
			return fmt.Errorf("floor claim %s: %w", key, err)
		}
		if err := floorConfirm().Run(ctx, c, []string{key}, "done", "600001").Err(); err != nil {
			return fmt.Errorf("floor confirm %s: %w", key, err)
		}
		return nil
	})
}

// benchRawPerMessage runs msg once per message in g goroutines on a fresh
// key of its own prefix, as the store benchmarks do, and deletes the keys
// afterwards.
func benchRawPerMessage(b *testing.B, c *redis.Client, g int, msg func(ctx context.Context, key string) error) {
	prefix := testenv.UniquePrefix()
	b.Cleanup(func() {
		if err := testenv.DeletePrefix(context.Background(), c, prefix); err != nil {
			b.Errorf("deleting the benchmark's keys: %v", err)
		}
	})
	ctx := context.Background()
	var next atomic.Uint64
	runGoroutines(b, g, func(more func() bool) {
		for more() {
			if err := msg(ctx, prefix+"{"+strconv.FormatUint(next.Add(1), 10)+"}"); err != nil {
				b.Error(err)
				return
			}
		}
	})
	reportMsgs(b, b.N)
}

// cannedReplies answers every command in the client, without I/O: a claim
// script (idem's or the floor's) with a new token, anything else with 1.
type cannedReplies struct{ tok atomic.Int64 }

func (h *cannedReplies) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *cannedReplies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *cannedReplies) ProcessHook(redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c, ok := cmd.(*redis.Cmd)
		if !ok {
			return fmt.Errorf("canned replies: unexpected %s", cmd.Name())
		}
		if sha, _ := c.Args()[1].(string); sha == claimScript.Hash() || sha == floorClaim().Hash() {
			c.SetVal(strconv.FormatInt(1_764_500_000_000_000+h.tok.Add(1), 10))
		} else {
			c.SetVal(int64(1))
		}
		return nil
	}
}

// BenchmarkRedisClientCost is what a message costs the client alone, with
// Redis's replies canned (no I/O): the store's Claim and Confirm, and the
// script floor's two Script.Run calls, each including go-redis's command
// building. It needs no Redis.
func BenchmarkRedisClientCost(b *testing.B) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	c.AddHook(&cannedReplies{})
	b.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	var next atomic.Uint64
	key := func() string { return "b0123456789_cc:" + strconv.FormatUint(next.Add(1), 36) }
	b.Run("Store", func(b *testing.B) {
		s, err := NewRedisStore(c, RedisOptions{AllowEviction: true})
		if err != nil {
			b.Fatal(err)
		}
		// No server to check or to load the scripts into: pass the first
		// contact, and take the digests a server would answer.
		s.probe.passed.Store(true)
		for _, sc := range scripts {
			sc.sha.Store(sc.Hash())
		}
		b.ReportAllocs()
		for b.Loop() {
			cl, err := s.Claim(ctx, key(), nil)
			if err != nil || cl.Outcome != Claimed {
				b.Fatalf("Claim = %v, %v; want Claimed", cl.Outcome, err)
			}
			if err := s.Confirm(ctx, cl.Lease, nil); err != nil {
				b.Fatalf("Confirm: %v", err)
			}
		}
	})
	b.Run("ScriptFloor", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			k := key()
			tok, err := floorClaim().Run(ctx, c, []string{k}, "30001").Text()
			if err != nil || tok == "" {
				b.Fatalf("floor claim = %q, %v; want a token", tok, err)
			}
			if err := floorConfirm().Run(ctx, c, []string{k}, "done", "600001").Err(); err != nil {
				b.Fatalf("floor confirm: %v", err)
			}
		}
	})
}

// redisCost reads what Redis spent since the last call: CPU (user +
// system) and commands run (INFO commandstats, script calls and what
// scripts run inside them), for a benchmark's per-op figures.
type redisCost struct {
	c         *redis.Client
	cpu, cmds float64
}

func (r *redisCost) read(b *testing.B) (cpu, cmds float64) {
	b.Helper()
	info, err := r.c.Info(context.Background(), "cpu", "commandstats").Result()
	if err != nil {
		b.Fatalf("INFO: %v", err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		switch {
		case strings.HasPrefix(line, "used_cpu_user:"), strings.HasPrefix(line, "used_cpu_sys:"):
			v, _ := strconv.ParseFloat(line[strings.IndexByte(line, ':')+1:], 64)
			cpu += v
		case strings.HasPrefix(line, "cmdstat_"):
			f := line[strings.IndexByte(line, ':')+1:]
			if v, ok := strings.CutPrefix(strings.Split(f, ",")[0], "calls="); ok {
				n, _ := strconv.ParseFloat(v, 64)
				cmds += n
			}
		}
	}
	return cpu, cmds
}

func (r *redisCost) start(b *testing.B) { r.cpu, r.cmds = r.read(b) }

// report reports Redis's CPU and commands per op since start.
func (r *redisCost) report(b *testing.B) {
	cpu, cmds := r.read(b)
	b.ReportMetric((cpu-r.cpu)*1e6/float64(b.N), "redis-µs/op")
	// INFO itself is one command, counted in the second read.
	b.ReportMetric((cmds-r.cmds-1)/float64(b.N), "cmds/op")
}

// BenchmarkRedisReplay: a Claim of a key confirmed before, the path of
// every duplicate delivery, in 64 goroutines over 1,024 keys, with the
// default options and without automatic pipelining; Redis's CPU and
// commands per Claim reported beside the throughput.
//
// With -idem.rounds N the rounds alternate the two configurations, and a
// mix of 80 % duplicates (each fifth Claim a new key, then confirmed) and
// fresh keys alone run beside the replays:
//
//	go test -run '^$' -bench RedisReplay -benchtime 20000x -idem.rounds 7 .
func BenchmarkRedisReplay(b *testing.B) {
	c := testenv.Redis(b)
	for range *benchRounds {
		for _, g := range []int{1, benchGoroutines} {
			for _, o := range []struct {
				name string
				o    RedisOptions
			}{{"default", RedisOptions{}}, {"NoAutoPipeline", RedisOptions{NoAutoPipeline: true}}} {
				b.Run(fmt.Sprintf("replay/%s/g=%d", o.name, g), func(b *testing.B) { benchReplay(b, c, g, o.o, 0) })
				b.Run(fmt.Sprintf("mix80/%s/g=%d", o.name, g), func(b *testing.B) { benchReplay(b, c, g, o.o, 5) })
				b.Run(fmt.Sprintf("fresh/%s/g=%d", o.name, g), func(b *testing.B) { benchReplay(b, c, g, o.o, 1) })
			}
		}
	}
}

// benchReplay claims confirmed keys; with every > 0, each every-th Claim
// is of a new key instead, confirmed at once (1: fresh keys only).
func benchReplay(b *testing.B, c *redis.Client, g int, o RedisOptions, every uint64) {
	o.Retention = 10 * time.Minute
	s := newTestRedisStore(b, c, o)
	ctx := context.Background()
	const keys = 1024
	for i := range keys {
		key := strconv.Itoa(i)
		cl, err := s.Claim(ctx, key, nil)
		if err != nil || cl.Outcome != Claimed {
			b.Fatalf("Claim(%q) = %v, %v", key, cl.Outcome, err)
		}
		if err := s.Confirm(ctx, cl.Lease, []byte("a result of some size, as a response is")); err != nil {
			b.Fatal(err)
		}
	}
	cost := redisCost{c: c}
	var next atomic.Uint64
	cost.start(b)
	fresh := "fresh-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
	runGoroutines(b, g, func(more func() bool) {
		for more() {
			n := next.Add(1)
			if every > 0 && n%every == 0 {
				key := fresh + strconv.FormatUint(n, 10)
				cl, err := s.Claim(ctx, key, nil)
				if err == nil && cl.Outcome == Claimed {
					err = s.Confirm(ctx, cl.Lease, []byte("ok"))
				}
				if err != nil {
					b.Errorf("Claim+Confirm(%q): %v", key, err)
					return
				}
				continue
			}
			key := strconv.FormatUint(n%keys, 10)
			cl, err := s.Claim(ctx, key, nil)
			if err != nil || cl.Outcome != Duplicate {
				b.Errorf("Claim(%q) = %v, %v; want duplicate", key, cl.Outcome, err)
				return
			}
		}
	})
	b.StopTimer()
	cost.report(b)
	reportMsgs(b, b.N)
}
