package kafka_test

import (
	"context"
	"log"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer/kafka"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The README's block, compiled (it needs a Kafka broker; its parameters
// are the reader's own names); ExampleNewConsumer is the same consumer with
// a dead-letter topic.
var _ = readmeConsumer

func readmeConsumer(ctx context.Context, store idem.Store) error {
	// README: kafka
	c, err := kafka.NewConsumer(store, func(ctx context.Context, r *kgo.Record) error {
		return chargeOrder(ctx, r.Value) // an error is retried in place
	}, kafka.Options{Group: "billing", Topics: []string{"orders"},
		Client: []kgo.Opt{kgo.SeedBrokers("127.0.0.1:9092")}})
	if err != nil {
		log.Fatal(err) // a required field empty or a bad one, named
	}
	defer c.Close() // revokes cleanly, commits, leaves the group
	err = c.Run(ctx)
	// README end
	return err
}
