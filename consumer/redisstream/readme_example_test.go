package redisstream_test

import (
	"context"
	"log"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer/redisstream"
	"github.com/redis/go-redis/v9"
)

// The README's block, compiled (it needs a Redis; its parameters are the
// reader's own names); ExampleReader is the same reader.
var _ = readmeReader

func readmeReader(ctx context.Context, rc redis.UniversalClient, store idem.Store, host string) error {
	// README: redisstream
	r, err := redisstream.NewReader(rc, store, func(ctx context.Context, m redis.XMessage) error {
		return chargeOrder(ctx, m.Values) // an error leaves the entry pending
	}, redisstream.Options{Stream: "orders", Group: "billing", Consumer: host, KeyField: "id"})
	if err != nil {
		log.Fatal(err) // a required field empty or a negative one, named
	}
	err = r.Run(ctx) // until ctx ends; creates the group at 0 if missing, waiting for a Redis not up yet
	// README end
	return err
}
