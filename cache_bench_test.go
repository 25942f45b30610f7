package idem_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/idemgo/idem/middleware"
)

// The cache side by side with its store on the real Redis
// (IDEM_REDIS_ADDR), round after round in one run, so that the machine's
// load weighs on both alike:
//
//	go test -run '^$' -bench CacheCompare -benchtime 1s -idem.cacherounds 5 .
//
// Each round runs, with and without a Cache: the middleware's replay at 64
// goroutines, its first write (a new key each request: what the cache
// costs where it cannot help), a consumer at 64 goroutines whose messages are 80%
// duplicates of hot keys, and a Claim of a confirmed key at one goroutine
// (cmds/op: the Redis commands each duplicate sends). At the end the
// benchmark logs each workload's ratio, with ÷ without, per round and the
// median (on standard output).

var cacheRounds = flag.Int("idem.cacherounds", 1, "rounds of BenchmarkCacheCompare")

// cacheGoroutines is how many goroutines the throughput workloads run.
const cacheGoroutines = 64

func BenchmarkCacheCompare(b *testing.B) {
	c := testenv.Redis(b)
	cmds := &testenv.IOCounter{}
	c.AddHook(cmds)
	workloads := []struct {
		name string
		run  func(b *testing.B, s idem.Store) float64
	}{
		{"MiddlewareReplay", benchReplay},
		{"MiddlewareFirstWrite", benchFirstWrite},
		{"Consumer80PercentDuplicates", benchConsumerDuplicates},
		{"DuplicateClaim", func(b *testing.B, s idem.Store) float64 { return benchDuplicateClaim(b, s, cmds) }},
	}
	rates := map[string][]float64{}
	for round := range *cacheRounds {
		for _, w := range workloads {
			// Which goes first alternates, so that neither always runs on
			// the other's leftovers (connections warm, keys in Redis).
			order := []bool{false, true}
			if round%2 == 1 {
				order = []bool{true, false}
			}
			for _, cached := range order {
				name := w.name + "/nocache"
				if cached {
					name = w.name + "/cache"
				}
				var rate float64
				b.Run(name, func(b *testing.B) {
					var s idem.Store = newBenchRedisStore(b, c)
					if cached {
						s = must(idem.NewCache(s, idem.CacheOptions{}))
					}
					rate = w.run(b, s)
				})
				if rate > 0 { // not filtered out by -bench
					rates[name] = append(rates[name], rate)
				}
			}
		}
	}
	for _, w := range workloads[:3] {
		with, without := rates[w.name+"/cache"], rates[w.name+"/nocache"]
		if len(with) == 0 || len(with) != len(without) {
			continue
		}
		ratios := make([]float64, len(with))
		for i := range with {
			ratios[i] = with[i] / without[i]
		}
		sorted := slices.Clone(ratios)
		slices.Sort(sorted)
		// Printed, not logged: a benchmark with sub-benchmarks shows its
		// own log only with -v.
		fmt.Printf("%s at %d goroutines, with ÷ without the cache: median %.2f× (%.2f–%.2f) over %d rounds: %s\n",
			w.name, cacheGoroutines, sorted[len(sorted)/2], sorted[0], sorted[len(sorted)-1], len(ratios), fmtRatios(ratios))
	}
}

func fmtRatios(rs []float64) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = strconv.FormatFloat(r, 'f', 2, 64)
	}
	return strings.Join(s, " ")
}

// newBenchRedisStore returns a RedisStore under a prefix of its own, whose
// keys are deleted when b ends.
func newBenchRedisStore(b *testing.B, c *redis.Client) *idem.RedisStore {
	b.Helper()
	prefix := testenv.UniquePrefix()
	b.Cleanup(func() { _ = testenv.DeletePrefix(context.Background(), c, prefix) })
	return must(idem.NewRedisStore(c, idem.RedisOptions{Prefix: prefix, Retention: 10 * time.Minute}))
}

// parallel runs body in cacheGoroutines goroutines until b.N calls were
// made, and returns the calls per second.
func parallel(b *testing.B, body func(pb *testing.PB)) float64 {
	b.ReportAllocs()
	b.SetParallelism(max(1, (cacheGoroutines+runtime.GOMAXPROCS(0)-1)/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	b.RunParallel(body)
	rate := float64(b.N) / b.Elapsed().Seconds()
	b.ReportMetric(rate, "msgs/s")
	return rate
}

// benchReplay: the middleware's replay on s, each goroutine replaying its
// own key after the first request wrote it.
func benchReplay(b *testing.B, s idem.Store) float64 {
	h := orders(b, s)
	var next atomic.Int64
	return parallel(b, func(pb *testing.PB) {
		key := "replay-" + strconv.FormatInt(next.Add(1), 10)
		if err := serveOrder(h, key, false); err != nil {
			b.Error(err)
			return
		}
		for pb.Next() {
			if err := serveOrder(h, key, true); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// benchFirstWrite: the middleware's first write on s, a new key each
// request.
func benchFirstWrite(b *testing.B, s idem.Store) float64 {
	h := orders(b, s)
	var next atomic.Int64
	return parallel(b, func(pb *testing.PB) {
		for pb.Next() {
			if err := serveOrder(h, "first-"+strconv.FormatInt(next.Add(1), 10), false); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// orders returns the middleware on s around a handler that creates an
// order.
func orders(b *testing.B, s idem.Store) http.Handler {
	mw, err := middleware.New(middleware.Options{Store: s, SingleTenant: true})
	if err != nil {
		b.Fatal(err)
	}
	return mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"ord_123","status":"created"}`))
	}))
}

// serveOrder sends one order to h in process and checks that it was
// created, and replayed when replay is set.
func serveOrder(h http.Handler, key string, replay bool) error {
	r, err := http.NewRequest(http.MethodPost, "http://bench.test/orders", strings.NewReader(`{"amount":1000,"currency":"eur"}`))
	if err != nil {
		return err
	}
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", key)
	w := &benchWriter{header: http.Header{}}
	h.ServeHTTP(w, r)
	if w.code != http.StatusCreated || (w.header.Get(middleware.HeaderReplayed) == "true") != replay {
		return fmt.Errorf("POST /orders (key %q) = %d, replayed %q; want 201, replayed %v",
			key, w.code, w.header.Get(middleware.HeaderReplayed), replay)
	}
	return nil
}

// benchWriter is the least http.ResponseWriter: headers and status.
type benchWriter struct {
	header http.Header
	code   int
}

func (w *benchWriter) Header() http.Header { return w.header }
func (w *benchWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}
func (w *benchWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return len(p), nil
}

// hotKeys is how many keys the consumer's duplicates are spread over.
const hotKeys = 1000

// benchConsumerDuplicates: consumer.Idempotent on s, 80% of the messages
// duplicates of hot keys handled before (a redelivery storm after a
// rebalance), 20% new keys, each handled once.
func benchConsumerDuplicates(b *testing.B, s idem.Store) float64 {
	type msg struct{ id string }
	var handled atomic.Int64
	handle := consumer.Idempotent(s, func(m msg) string { return m.id },
		func(context.Context, msg) error { handled.Add(1); return nil })
	ctx := context.Background()
	for i := range hotKeys {
		if err := handle(ctx, msg{"hot-" + strconv.Itoa(i)}); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Int64
	handled.Store(0)
	var fresh atomic.Int64
	rate := parallel(b, func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(uint64(next.Add(1)), 0))
		for pb.Next() {
			id := "hot-" + strconv.Itoa(rng.IntN(hotKeys))
			if rng.IntN(10) < 2 {
				id = "new-" + strconv.FormatInt(next.Add(1), 10)
				fresh.Add(1)
			}
			if err := handle(ctx, msg{id}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	if h, f := handled.Load(), fresh.Load(); h != f {
		b.Errorf("handler ran %d times for %d new keys; want once each, never for a duplicate", h, f)
	}
	return rate
}

// benchDuplicateClaim: Claim of one confirmed key, at one goroutine; cmds/op
// is the Redis commands each sends.
func benchDuplicateClaim(b *testing.B, s idem.Store, cmds *testenv.IOCounter) float64 {
	ctx := context.Background()
	cl := must(s.Claim(ctx, "dup", nil))
	if err := s.Confirm(ctx, cl.Lease, []byte("result")); err != nil {
		b.Fatal(err)
	}
	if cl, err := s.Claim(ctx, "dup", nil); err != nil || cl.Outcome != idem.Duplicate {
		b.Fatalf("Claim = %v, %v; want Duplicate", cl.Outcome, err)
	}
	b.ReportAllocs()
	before := cmds.N.Load()
	b.ResetTimer()
	for range b.N {
		if cl, err := s.Claim(ctx, "dup", nil); err != nil || cl.Outcome != idem.Duplicate {
			b.Fatalf("Claim = %v, %v; want Duplicate", cl.Outcome, err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(cmds.N.Load()-before)/float64(b.N), "cmds/op")
	return float64(b.N) / b.Elapsed().Seconds()
}
