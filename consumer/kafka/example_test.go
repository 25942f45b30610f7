package kafka_test

import (
	"context"
	"log"
	"os"
	"os/signal"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer/kafka"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A consumer of the "orders" topic whose orders are charged once, however
// often they are produced or fetched: keyed by their Idempotency-Key
// header, offsets committed only past charged (or duplicate) orders, a
// failing order retried in place three times and then handed to a
// dead-letter topic.
func ExampleNewConsumer() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	store, err := idem.NewRedisStore(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}), idem.RedisOptions{})
	if err != nil {
		log.Fatal(err)
	}
	dlq, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:9092"))
	if err != nil {
		log.Fatal(err)
	}
	defer dlq.Close()
	c, err := kafka.NewConsumer(store, func(ctx context.Context, r *kgo.Record) error {
		return chargeOrder(ctx, r.Value) // an error is retried in place, then dead-lettered
	}, kafka.Options{Group: "billing", Topics: []string{"orders"},
		Client: []kgo.Opt{kgo.SeedBrokers("127.0.0.1:9092")}, MaxAttempts: 3,
		DeadLetter: func(ctx context.Context, r *kgo.Record, err error) error {
			dead := &kgo.Record{Topic: "orders.dead", Key: r.Key, Value: r.Value,
				Headers: append(r.Headers, kgo.RecordHeader{Key: "error", Value: []byte(err.Error())})}
			return dlq.ProduceSync(ctx, dead).FirstErr()
		}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if err := c.Run(ctx); err != context.Canceled {
		log.Fatal(err)
	}
}

func chargeOrder(context.Context, []byte) error { return nil }
