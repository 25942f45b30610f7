package redisstream_test

import (
	"context"
	"log"
	"os"
	"os/signal"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer/redisstream"
	"github.com/redis/go-redis/v9"
)

// A reader of the "orders" stream whose orders are charged once, however
// often they are added or delivered: keyed by their id field, acked by the
// Reader, a crashed consumer's entries reclaimed by the others.
func ExampleReader() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	store, err := idem.NewRedisStore(rc, idem.RedisOptions{})
	if err != nil {
		log.Fatal(err)
	}
	host, _ := os.Hostname()
	r, err := redisstream.NewReader(rc, store, func(ctx context.Context, m redis.XMessage) error {
		return chargeOrder(ctx, m.Values) // an error leaves the entry pending: retried after MinIdle
	}, redisstream.Options{Stream: "orders", Group: "billing", Consumer: host, KeyField: "id"})
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(ctx); err != context.Canceled {
		log.Fatal(err)
	}
}

func chargeOrder(context.Context, map[string]any) error { return nil }
