package watermill_test

import (
	"context"
	"fmt"
	"log"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/idemgo/idem"
	idemwatermill "github.com/idemgo/idem/consumer/watermill"
)

// A router handler behind the deduplicating middleware: an event published
// twice is handled once (use a RedisStore to deduplicate across instances).
func ExampleMiddleware() {
	store, err := idem.NewMemoryStore(idem.Options{})
	if err != nil {
		log.Fatal(err)
	}
	// Publish returns once the message is acked: the output's order is fixed.
	pubsub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	router, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})

	handled := make(chan string, 3)
	router.AddConsumerHandler("charge", "orders", pubsub, func(msg *message.Message) error {
		handled <- msg.Metadata.Get("order_id")
		return nil
	})
	router.AddMiddleware(idemwatermill.Middleware(store, idemwatermill.Options{MetadataKey: "order_id"}))
	go func() { _ = router.Run(context.Background()) }()
	defer router.Close()
	<-router.Running()

	for _, id := range []string{"o-1", "o-1", "o-2"} {
		msg := message.NewMessage(watermill.NewUUID(), nil) // a new UUID per publish, as producers retry
		msg.Metadata.Set("order_id", id)
		_ = pubsub.Publish("orders", msg)
	}
	close(handled)
	for id := range handled {
		fmt.Println("charged", id)
	}
	// Output:
	// charged o-1
	// charged o-2
}
