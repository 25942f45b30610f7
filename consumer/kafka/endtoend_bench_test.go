package kafka_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/kafka"
)

// BenchmarkConsumer is the Kafka row of the end-to-end consumer benchmark
// (docs/BENCHMARKS.md, "A consumer end to end"; Redis Streams' and
// RabbitMQ's are `idem bench --groups consumer`, which cannot import this
// module). One group member reads b.N records from 4 partitions of kfake,
// franz-go's in-process fake broker (no Kafka broker installs here, so the
// broker's own cost is not a real Kafka's), 20% of them repeating the key
// header of one of the 200 records before them (a redelivery), with a
// handler that does nothing: bare (poll, mark, autocommit), through
// consumer.Idempotent one record at a time in the same loop, and through
// the Consumer (a batch claim and confirm per partition and poll). Each
// reports records/s and Redis's CPU per record (INFO cpu: run it on a Redis
// nobody else uses); with -kafka.rounds the three alternate and each round
// logs the ratios to bare. Run it with
//
//	IDEM_REDIS_ADDR=127.0.0.1:6379 go test -run '^$' -bench Consumer -benchtime 20000x -kafka.rounds 5
func BenchmarkConsumer(b *testing.B) {
	rc := testRedis(b)
	for round := range *rounds {
		var bare, perMsg, batched float64
		b.Run("bare/poll=500", func(b *testing.B) {
			kc, _ := fillRedelivered(b, b.N)
			cl := newGroupClient(b, kc)
			ctx := context.Background()
			b.ReportAllocs()
			cpu := startRedisCPU(b, rc)
			for done := 0; done < b.N; {
				rs := cl.PollRecords(ctx, kafka.DefaultMaxPollRecords).Records()
				cl.MarkCommitRecords(rs...)
				done += len(rs)
			}
			b.StopTimer()
			cpu.report(b)
			bare = float64(b.N) / b.Elapsed().Seconds()
			b.ReportMetric(bare, "records/s")
		})
		b.Run("idem-per-record/poll=500", func(b *testing.B) {
			kc, keys := fillRedelivered(b, b.N)
			cl := newGroupClient(b, kc)
			var ran atomic.Int64
			h := consumer.Idempotent(newStore(b, rc, prefix(b), "bench", time.Minute), headerKey,
				func(context.Context, *kgo.Record) error { ran.Add(1); return nil })
			ctx := context.Background()
			b.ReportAllocs()
			cpu := startRedisCPU(b, rc)
			for done := 0; done < b.N; {
				rs := cl.PollRecords(ctx, kafka.DefaultMaxPollRecords).Records()
				for _, r := range rs {
					if err := h(ctx, r); err != nil {
						b.Fatal(err)
					}
				}
				cl.MarkCommitRecords(rs...)
				done += len(rs)
			}
			b.StopTimer()
			cpu.report(b)
			if got, want := ran.Load(), int64(distinctKeys(keys)); got != want {
				b.Fatalf("the handler ran %d times; want %d, once per key", got, want)
			}
			perMsg = float64(b.N) / b.Elapsed().Seconds()
			b.ReportMetric(perMsg, "records/s")
		})
		b.Run("idem-batched/poll=500", func(b *testing.B) {
			kc, keys := fillRedelivered(b, b.N)
			var n, ran atomic.Int64
			all := make(chan struct{})
			want := int64(b.N)
			c, err := kafka.NewConsumer(newStore(b, rc, prefix(b), "bench", time.Minute),
				func(context.Context, *kgo.Record) error { ran.Add(1); return nil },
				kafka.Options{Group: "bench", Topics: []string{topic}, Client: clientOpts(kc), Logger: quiet,
					OnSettle: func(_ *kgo.Record, s kafka.Settlement) {
						if s.Action == kafka.Commit && n.Add(1) == want {
							close(all)
						}
					}})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			b.ReportAllocs()
			cpu := startRedisCPU(b, rc)
			go func() { done <- c.Run(ctx) }()
			<-all
			b.StopTimer()
			cpu.report(b)
			cancel()
			<-done
			if got, want := ran.Load(), int64(distinctKeys(keys)); got != want {
				b.Fatalf("the handler ran %d times; want %d, once per key", got, want)
			}
			batched = float64(b.N) / b.Elapsed().Seconds()
			b.ReportMetric(batched, "records/s")
		})
		if bare > 0 {
			b.Logf("round %d: bare %.0f records/s; idem per record %.0f (%.4f×), idem batched %.0f (%.4f×)",
				round+1, bare, perMsg, perMsg/bare, batched, batched/bare)
		}
	}
}

func headerKey(r *kgo.Record) string {
	for _, h := range r.Headers {
		if h.Key == kafka.DefaultKeyHeader {
			return string(h.Value)
		}
	}
	return ""
}

func distinctKeys(keys []string) int {
	m := make(map[string]struct{}, len(keys))
	for _, k := range keys {
		m[k] = struct{}{}
	}
	return len(m)
}

// newGroupClient is the bare loops' group member, marking and
// autocommitting as the Consumer does.
func newGroupClient(b *testing.B, kc *kfake.Cluster) *kgo.Client {
	b.Helper()
	cl, err := kgo.NewClient(append(clientOpts(kc), kgo.ConsumerGroup("bench"), kgo.ConsumeTopics(topic),
		kgo.AutoCommitMarks(), kgo.AutoCommitInterval(kafka.DefaultCommitInterval))...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cl.Close)
	return cl
}

// fillRedelivered starts a cluster with 4 partitions holding n records,
// one in five repeating the key header of one of the 200 before it,
// outside the timer, and returns it with the records' keys.
func fillRedelivered(b *testing.B, n int) (*kfake.Cluster, []string) {
	b.Helper()
	b.StopTimer()
	defer b.StartTimer()
	kc := newCluster(b, 4)
	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.ProducerLinger(0))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	rng := rand.New(rand.NewPCG(uint64(n), 47))
	keys := make([]string, n)
	pfx := prefix(b)
	for i := range keys {
		if i > 0 && (i+1)/5 > i/5 {
			keys[i] = keys[i-1-rng.IntN(min(i, 200))]
		} else {
			keys[i] = pfx + strconv.Itoa(i)
		}
	}
	ctx := context.Background()
	for i := 0; i < n; i += 1000 {
		rs := make([]*kgo.Record, 0, 1000)
		for _, k := range keys[i:min(n, i+1000)] {
			rs = append(rs, &kgo.Record{Topic: topic, Value: []byte("x"),
				Headers: []kgo.RecordHeader{{Key: kafka.DefaultKeyHeader, Value: []byte(k)}}})
		}
		if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			b.Fatal(err)
		}
	}
	return kc, keys
}

// redisCPU reads Redis's CPU time around a measurement.
type redisCPU struct {
	c     *redis.Client
	start time.Duration
}

func startRedisCPU(b *testing.B, c *redis.Client) *redisCPU {
	b.Helper()
	return &redisCPU{c: c, start: readRedisCPU(b, c)}
}

// report reports Redis's CPU per record since start.
func (r *redisCPU) report(b *testing.B) {
	b.Helper()
	d := readRedisCPU(b, r.c) - r.start
	b.ReportMetric(float64(d.Microseconds())/float64(b.N), "redis-µs/record")
}

func readRedisCPU(b *testing.B, c *redis.Client) time.Duration {
	b.Helper()
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var sum time.Duration
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == "used_cpu_user" || k == "used_cpu_sys" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("INFO cpu: %s %q: %v", k, v, err)
			}
			sum += time.Duration(f * float64(time.Second))
		}
	}
	return sum
}
