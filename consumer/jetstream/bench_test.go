package jetstream_test

import (
	"context"
	"flag"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idemjs "github.com/idemgo/idem/consumer/jetstream"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
)

// BenchmarkThroughput measures messages per second taken from a durable
// pull consumer (Consume, nats.go's default of 500 messages buffered) on a
// real in-process nats-server, with a handler that does nothing: through
// the Handler (a claim and a confirm on the Redis store per message, then
// Ack) and through the same loop without idem (Ack only), side by side,
// and logs their ratios. Each message has its own Nats-Msg-Id, so none is
// a duplicate. consume/serial handles on Consume's goroutine, one
// message at a time (Handle); consume/workers=16 hands each message to one
// of 16 goroutines (Handle); fetch=100 fetches 100 at a time (HandleBatch;
// bare: Ack each). With -jetstream.rounds the sub-benchmarks alternate,
// each round logging its ratios.
func BenchmarkThroughput(b *testing.B) {
	rc := testRedis(b)
	_, js := connect(b, startServer(b))
	for round := range *rounds {
		for _, mode := range []struct {
			name           string
			workers, fetch int
		}{{"consume/serial", 1, 0}, {"consume/workers=16", 16, 0}, {"fetch=100", 0, 100}} {
			var bare, with float64
			b.Run("bare/"+mode.name, func(b *testing.B) {
				if mode.fetch > 0 {
					bare = benchFetch(b, rc, js, mode.fetch, false)
				} else {
					bare = benchConsume(b, rc, js, mode.workers, false)
				}
			})
			b.Run("idem/"+mode.name, func(b *testing.B) {
				if mode.fetch > 0 {
					with = benchFetch(b, rc, js, mode.fetch, true)
				} else {
					with = benchConsume(b, rc, js, mode.workers, true)
				}
			})
			if bare > 0 && with > 0 {
				b.Logf("round %d, %s: through the Handler %.0f msgs/s, without idem %.0f msgs/s: ratio %.2f",
					round+1, mode.name, with, bare, with/bare)
			}
		}
	}
}

var rounds = flag.Int("jetstream.rounds", 1,
	"rounds of BenchmarkThroughput: its sub-benchmarks alternate, so that a noisy machine affects both alike")

// benchFetch fills a new stream with b.N messages, outside the timer, and
// fetches them n at a time, acking each (bare) or handing the batch to
// HandleBatch, and returns the rate.
func benchFetch(b *testing.B, rc *redis.Client, js jetstream.JetStream, n int, withIdem bool) float64 {
	cons := fill(b, js, b.N)
	handle := func(ms []jetstream.Msg) {
		for _, m := range ms {
			if err := m.Ack(); err != nil {
				b.Error(err)
			}
		}
	}
	if withIdem {
		h, err := idemjs.NewHandler(newStore(b, rc, prefix(b), "bench", time.Minute),
			func(context.Context, jetstream.Msg) error { return nil },
			idemjs.Options{Logger: quiet, OnSettle: func(_ jetstream.Msg, s idemjs.Settlement) {
				if s.Action != idemjs.Ack || s.SettleErr != nil {
					b.Errorf("settled %+v; want Ack", s)
				}
			}})
		if err != nil {
			b.Fatal(err)
		}
		handle = func(ms []jetstream.Msg) { h.HandleBatch(context.Background(), ms) }
	}
	ms := make([]jetstream.Msg, 0, n)
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; {
		batch, err := cons.Fetch(min(n, b.N-done), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			b.Fatal(err)
		}
		ms = ms[:0]
		for m := range batch.Messages() {
			ms = append(ms, m)
		}
		if len(ms) == 0 {
			b.Fatalf("fetch: no messages after %d of %d (%v)", done, b.N, batch.Error())
		}
		handle(ms)
		done += len(ms)
	}
	b.StopTimer()
	r := float64(b.N) / b.Elapsed().Seconds()
	b.ReportMetric(r, "msgs/s")
	return r
}

var benchSeq atomic.Int64

// benchConsume fills a new stream with b.N messages, outside the timer, and
// consumes them all, returning the rate.
func benchConsume(b *testing.B, rc *redis.Client, js jetstream.JetStream, workers int, withIdem bool) float64 {
	cons := fill(b, js, b.N)
	n := int64(b.N)
	var settled atomic.Int64
	all := make(chan struct{})
	done := func() {
		if settled.Add(1) == n {
			close(all)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	handle := func(m jetstream.Msg) {
		if err := m.Ack(); err != nil {
			b.Error(err)
		}
		done()
	}
	if withIdem {
		h, err := idemjs.NewHandler(newStore(b, rc, prefix(b), "bench", time.Minute),
			func(context.Context, jetstream.Msg) error { return nil },
			idemjs.Options{Logger: quiet, OnSettle: func(_ jetstream.Msg, s idemjs.Settlement) {
				if s.Action != idemjs.Ack || s.SettleErr != nil {
					b.Errorf("settled %+v; want Ack", s)
				}
				done()
			}})
		if err != nil {
			b.Fatal(err)
		}
		handle = h.MessageHandler(ctx)
	}
	cb := handle
	var wg sync.WaitGroup
	if workers > 1 {
		ch := make(chan jetstream.Msg, workers)
		for range workers {
			wg.Go(func() {
				for m := range ch {
					handle(m)
				}
			})
		}
		defer func() { close(ch); wg.Wait() }()
		cb = func(m jetstream.Msg) { ch <- m }
	}
	b.ReportAllocs()
	b.ResetTimer()
	cc, err := cons.Consume(cb)
	if err != nil {
		b.Fatal(err)
	}
	<-all
	b.StopTimer()
	cc.Stop()
	r := float64(b.N) / b.Elapsed().Seconds()
	b.ReportMetric(r, "msgs/s")
	return r
}

// fill publishes n messages, each with its own Nats-Msg-Id, to a new
// stream and returns its new durable consumer.
func fill(b *testing.B, js jetstream.JetStream, n int) jetstream.Consumer {
	b.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("B%d", benchSeq.Add(1))
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}}); err != nil {
		b.Fatal(err)
	}
	for i := range n {
		m := nats.NewMsg(name + ".x")
		m.Data = []byte("x")
		m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("%s/%d", name, i))
		if _, err := js.PublishMsgAsync(m); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("publishing did not complete in a minute")
	}
	c, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		b.Fatal(err)
	}
	return c
}
