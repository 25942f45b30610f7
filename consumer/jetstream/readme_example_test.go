package jetstream_test

import (
	"context"
	"log"
	"time"

	"github.com/idemgo/idem"
	idemjs "github.com/idemgo/idem/consumer/jetstream"
	"github.com/nats-io/nats.go/jetstream"
)

// The README's block, compiled (it needs a JetStream consumer; its
// parameters are the reader's own names); ExampleHandler_MessageHandler
// runs the same on an in-process nats-server.
var _ = readmeHandler

func readmeHandler(ctx context.Context, store idem.Store, cons jetstream.Consumer) error {
	// README: jetstream
	h, err := idemjs.NewHandler(store, func(ctx context.Context, m jetstream.Msg) error {
		return chargeOrder(ctx, m.Data()) // an error naks the message, with a delay
	}, idemjs.Options{ProgressInterval: 10 * time.Second})
	if err != nil {
		log.Fatal(err) // a negative duration, named
	}
	cc, err := cons.Consume(h.MessageHandler(ctx)) // or h.HandleBatch(ctx, fetched)
	// README end
	if err == nil {
		cc.Stop()
	}
	return err
}
