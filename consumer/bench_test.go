package consumer_test

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/internal/testing/testenv"
)

var benchRounds = flag.Int("consumer.rounds", 1,
	"rounds of BenchmarkThroughput: its sub-benchmarks alternate, so that a noisy machine affects both alike")

// BenchmarkThroughput measures messages per second through Idempotent (64
// goroutines, two round trips per message) and through Batch (batches of 100,
// two round trips per batch) on the real Redis, alternating for
// -consumer.rounds rounds, and logs the ratio of each round.
func BenchmarkThroughput(b *testing.B) {
	c := testenv.Redis(b)
	ctx := context.Background()
	store, err := idem.NewRedisStore(c, idem.RedisOptions{
		Prefix:    fmt.Sprintf("idembench:%d:", time.Now().UnixNano()),
		Retention: time.Minute,
	})
	if err != nil {
		b.Fatal(err)
	}
	var seq atomic.Int64
	next := func() string { return strconv.FormatInt(seq.Add(1), 36) }
	nop := func(context.Context, string) error { return nil }
	id := func(s string) string { return s }

	for r := range *benchRounds {
		var one, batch float64
		b.Run("one-by-one/goroutines=64", func(b *testing.B) {
			h := consumer.Idempotent(store, id, nop)
			b.ReportAllocs()
			b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := h(ctx, next()); err != nil {
						b.Error(err)
						return
					}
				}
			})
			one = float64(b.N) / b.Elapsed().Seconds()
			b.ReportMetric(one, "msgs/s")
		})
		b.Run("batch/size=100", func(b *testing.B) {
			h := consumer.Batch(store, id, nop)
			b.ReportAllocs()
			// A few consumers, each with its batch in flight, as a broker
			// with a prefetch of several batches would feed them.
			b.SetParallelism(max(1, 4/runtime.GOMAXPROCS(0)))
			b.RunParallel(func(pb *testing.PB) {
				ms := make([]string, 0, 100)
				flush := func() {
					for _, err := range h(ctx, ms) {
						if err != nil {
							b.Error(err)
						}
					}
					ms = ms[:0]
				}
				for pb.Next() {
					if ms = append(ms, next()); len(ms) == 100 {
						flush()
					}
				}
				if len(ms) > 0 {
					flush()
				}
			})
			batch = float64(b.N) / b.Elapsed().Seconds()
			b.ReportMetric(batch, "msgs/s")
		})
		if one > 0 {
			b.Logf("round %d: one-by-one %.0f msgs/s, batch %.0f msgs/s, ratio %.1f×", r+1, one, batch, batch/one)
		}
	}
}
