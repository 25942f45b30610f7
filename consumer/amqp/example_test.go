package amqp_test

import (
	"context"
	"log"

	"github.com/idemgo/idem"
	idemamqp "github.com/idemgo/idem/consumer/amqp"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
)

// A RabbitMQ consumer whose orders are charged once, however often the
// broker delivers them: keyed by MessageId, settled by the adapter.
func ExampleHandler() {
	ctx := context.Background()
	store, err := idem.NewRedisStore(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}), idem.RedisOptions{})
	if err != nil {
		log.Fatal(err)
	}
	conn, err := amqp091.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	_ = ch.Qos(64, 0, false)
	deliveries, err := ch.ConsumeWithContext(ctx, "orders", "", false /* auto-ack off: the adapter settles */, false, false, false, nil)
	if err != nil {
		log.Fatal(err)
	}

	handle := idemamqp.Handler(store, func(ctx context.Context, d amqp091.Delivery) error {
		return chargeOrder(ctx, d.Body) // an error nacks with requeue after a growing delay
	}, idemamqp.Options{})
	for d := range deliveries {
		handle(ctx, d) // acks, nacks or rejects d itself
	}
}

func chargeOrder(context.Context, []byte) error { return nil }
