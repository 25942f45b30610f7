package redisstream_test

import (
	"context"
	"flag"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/consumer/redisstream"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/redis/go-redis/v9"
)

// BenchmarkThroughput measures entries per second read from a stream by one
// consumer of a group, 100 entries per XREADGROUP (Options.Count's
// default), with a handler that does nothing: through the Reader (a batch
// claim, a batch confirm and one XACK per read), and through the same
// XREADGROUP/XACK loop without idem, side by side, and logs their ratio.
// Each entry has its own id field, so none is a duplicate. With
// -redisstream.rounds the two alternate, each round logging its ratio.
func BenchmarkThroughput(b *testing.B) {
	c := testenv.Redis(b)
	const count = 100
	for round := range *rounds {
		bare, withIdem := benchRound(b, c, count)
		if bare > 0 && withIdem > 0 {
			b.Logf("round %d: through the Reader %.0f msgs/s, bare XREADGROUP/XACK %.0f msgs/s: ratio %.2f",
				round+1, withIdem, bare, withIdem/bare)
		}
	}
}

var rounds = flag.Int("redisstream.rounds", 1,
	"rounds of BenchmarkThroughput: its sub-benchmarks alternate, so that a noisy machine affects both alike")

// benchRound runs the two sub-benchmarks once and returns their rates.
func benchRound(b *testing.B, c *redis.Client, count int) (bare, withIdem float64) {
	b.Run("bare/count=100", func(b *testing.B) {
		stream := fill(b, c, b.N)
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		for done := 0; done < b.N; {
			ss, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c",
				Streams: []string{stream, ">"}, Count: int64(count), Block: 100 * time.Millisecond}).Result()
			if err != nil {
				b.Fatal(err)
			}
			ids := make([]string, 0, count)
			for _, m := range ss[0].Messages {
				ids = append(ids, m.ID)
			}
			if err := c.XAck(ctx, stream, "g", ids...).Err(); err != nil {
				b.Fatal(err)
			}
			done += len(ids)
		}
		b.StopTimer()
		bare = float64(b.N) / b.Elapsed().Seconds()
		b.ReportMetric(bare, "msgs/s")
	})
	b.Run("idem/count=100", func(b *testing.B) {
		stream := fill(b, c, b.N)
		var acked atomic.Int64
		all := make(chan struct{})
		n := int64(b.N)
		r, err := redisstream.NewReader(c, newStore(b, c, prefix(b), "bench", time.Minute),
			func(context.Context, redis.XMessage) error { return nil },
			redisstream.Options{Stream: stream, Group: "g", Consumer: "c", KeyField: "id", Count: count,
				Block: 100 * time.Millisecond, Logger: quiet,
				OnSettle: func(_ *redis.XMessage, s redisstream.Settlement) {
					if s.Action == redisstream.Ack && acked.Add(1) == n {
						close(all)
					}
				}})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		b.ReportAllocs()
		b.ResetTimer()
		go func() { done <- r.Run(ctx) }()
		<-all
		b.StopTimer()
		cancel()
		<-done
		withIdem = float64(b.N) / b.Elapsed().Seconds()
		b.ReportMetric(withIdem, "msgs/s")
	})
	return bare, withIdem
}

// fill adds n entries, each with its own id, to a new stream and creates
// its group "g" at the start, outside the timer.
func fill(b *testing.B, c *redis.Client, n int) string {
	b.Helper()
	b.StopTimer()
	defer b.StartTimer()
	ctx := context.Background()
	stream := unique(b, "bench")
	b.Cleanup(func() { _ = c.Del(context.Background(), stream).Err() })
	for i := 0; i < n; i += 1000 {
		p := c.Pipeline()
		for j := i; j < min(n, i+1000); j++ {
			p.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"id", stream + "/" + strconv.Itoa(j), "body", "x"}})
		}
		if _, err := p.Exec(ctx); err != nil {
			b.Fatal(err)
		}
	}
	if err := c.XGroupCreateMkStream(ctx, stream, "g", "0").Err(); err != nil {
		b.Fatal(err)
	}
	return stream
}
