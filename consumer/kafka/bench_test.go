package kafka_test

import (
	"context"
	"flag"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/consumer/kafka"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkThroughput measures records per second consumed by one group
// member from 4 partitions on kfake, up to 500 records per poll
// (Options.MaxPollRecords's default), with a handler that does nothing:
// through the Consumer (a batch claim and a batch confirm per partition
// and poll, offsets marked and autocommitted), and through the same
// poll/mark/autocommit loop without idem, side by side, and logs their
// ratio. Each record has its own key header, so none is a duplicate. With
// -kafka.rounds the two alternate, each round logging its ratio.
func BenchmarkThroughput(b *testing.B) {
	rc := testRedis(b)
	for round := range *rounds {
		var bare, withIdem float64
		b.Run("bare/poll=500", func(b *testing.B) {
			kc, group := fill(b, b.N)
			cl, err := kgo.NewClient(append(clientOpts(kc), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
				kgo.AutoCommitMarks(), kgo.AutoCommitInterval(kafka.DefaultCommitInterval))...)
			if err != nil {
				b.Fatal(err)
			}
			defer cl.Close()
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; {
				fs := cl.PollRecords(ctx, kafka.DefaultMaxPollRecords)
				rs := fs.Records()
				cl.MarkCommitRecords(rs...)
				done += len(rs)
			}
			b.StopTimer()
			bare = float64(b.N) / b.Elapsed().Seconds()
			b.ReportMetric(bare, "records/s")
		})
		b.Run("idem/poll=500", func(b *testing.B) {
			kc, group := fill(b, b.N)
			var n atomic.Int64
			all := make(chan struct{})
			want := int64(b.N)
			c, err := kafka.NewConsumer(newStore(b, rc, prefix(b), "bench", time.Minute),
				func(context.Context, *kgo.Record) error { return nil },
				kafka.Options{Group: group, Topics: []string{topic}, Client: clientOpts(kc), Logger: quiet,
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
			b.ResetTimer()
			go func() { done <- c.Run(ctx) }()
			<-all
			b.StopTimer()
			cancel()
			<-done
			withIdem = float64(b.N) / b.Elapsed().Seconds()
			b.ReportMetric(withIdem, "records/s")
		})
		if bare > 0 && withIdem > 0 {
			b.Logf("round %d: through the Consumer %.0f records/s, bare poll/mark loop %.0f records/s: ratio %.2f",
				round+1, withIdem, bare, withIdem/bare)
		}
	}
}

var rounds = flag.Int("kafka.rounds", 1,
	"rounds of BenchmarkThroughput: its sub-benchmarks alternate, so that a noisy machine affects both alike")

// fill starts a cluster with 4 partitions holding n records, each with its
// own key header, outside the timer, and returns it with a group name.
func fill(b *testing.B, n int) (*kfake.Cluster, string) {
	b.Helper()
	b.StopTimer()
	defer b.StartTimer()
	kc := newCluster(b, 4)
	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.ProducerLinger(0))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	pfx := prefix(b)
	for i := 0; i < n; i += 1000 {
		rs := make([]*kgo.Record, 0, 1000)
		for j := i; j < min(n, i+1000); j++ {
			id := pfx + strconv.Itoa(j)
			rs = append(rs, &kgo.Record{Topic: topic, Value: []byte("x"),
				Headers: []kgo.RecordHeader{{Key: kafka.DefaultKeyHeader, Value: []byte(id)}}})
		}
		if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			b.Fatal(err)
		}
	}
	return kc, "bench"
}
