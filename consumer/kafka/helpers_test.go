package kafka_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer/kafka"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

var quiet = slog.New(slog.DiscardHandler)

const topic = "orders"

// newCluster starts an in-process fake Kafka (kfake) with topic's
// partitions, closed at the test's end.
func newCluster(t testing.TB, partitions int32) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// prefix returns a store prefix of this test's own.
func prefix(t testing.TB) string {
	return fmt.Sprintf("idemtest:kafka:%s:%d:", t.Name(), time.Now().UnixNano())
}

func newStore(t testing.TB, c redis.UniversalClient, prefix, worker string, ttl time.Duration) *idem.RedisStore {
	t.Helper()
	// MaxTakeOvers: the fleet tests crash and stop consumers on purpose, and
	// on a busy machine a stalled renewal adds take-overs of its own; they
	// check once-ness, storetest that a crash loop stops.
	s, err := idem.NewRedisStore(c, idem.RedisOptions{Prefix: prefix, Worker: worker, LeaseTTL: ttl,
		Retention: time.Minute, MaxTakeOvers: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// produce produces one record per id (header Idempotency-Key; "" : none)
// to partition p (-1: by the record key, which is the id).
func produce(t testing.TB, kc *kfake.Cluster, p int32, ids ...string) {
	t.Helper()
	opts := []kgo.Opt{kgo.SeedBrokers(kc.ListenAddrs()...)}
	if p >= 0 {
		opts = append(opts, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rs := make([]*kgo.Record, len(ids))
	for i, id := range ids {
		r := &kgo.Record{Topic: topic, Partition: p, Key: []byte(id), Value: []byte("payload of " + id)}
		if id != "" {
			r.Headers = []kgo.RecordHeader{{Key: kafka.DefaultKeyHeader, Value: []byte(id)}}
		}
		rs[i] = r
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// committed returns the group's committed offsets of topic by partition.
func committed(t testing.TB, kc *kfake.Cluster, group string) map[int32]int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return offsetFetch(t, ctx, cl, group)
}

// settlements collects a consumer's settlements.
type settlements struct {
	mu   sync.Mutex
	all  []kafka.Settlement
	offs []int64
}

func (s *settlements) on(r *kgo.Record, st kafka.Settlement) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.all = append(s.all, st)
	s.offs = append(s.offs, r.Offset)
}

func (s *settlements) count(a kafka.Action) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, st := range s.all {
		if st.Action == a {
			n++
		}
	}
	return n
}

// runUntil runs c until cond holds (checked every 10ms) or 10s pass, then
// stops and closes it and waits for Run to return.
func runUntil(t testing.TB, c *kafka.Consumer, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			cancel()
			<-done
			c.Close()
			t.Fatal("condition not met within 10s")
		}
		select {
		case err := <-done:
			cancel()
			t.Fatalf("Run returned early: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; err != context.Canceled {
		t.Errorf("Run = %v; want context.Canceled", err)
	}
	c.Close()
}

// clientOpts are the test consumers' client options: quick group timings.
func clientOpts(kc *kfake.Cluster) []kgo.Opt {
	return []kgo.Opt{kgo.SeedBrokers(kc.ListenAddrs()...), kgo.FetchMaxWait(50 * time.Millisecond),
		kgo.SessionTimeout(6 * time.Second), kgo.HeartbeatInterval(100 * time.Millisecond),
		kgo.RebalanceTimeout(5 * time.Second), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}
}
