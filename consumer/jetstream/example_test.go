package jetstream_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/idemgo/idem"
	idemjs "github.com/idemgo/idem/consumer/jetstream"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
)

// A consumer of the ORDERS stream whose orders are charged once, however
// often they are published or delivered: keyed by their Nats-Msg-Id
// header, acked, nakked or terminated by the Handler, kept alive with
// InProgress while the charge runs.
func ExampleHandler_MessageHandler() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	store, err := idem.NewRedisStore(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}), idem.RedisOptions{})
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	cons, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
		Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	h, err := idemjs.NewHandler(store, func(ctx context.Context, m jetstream.Msg) error {
		return chargeOrder(ctx, m.Data()) // an error naks the message: redelivered after a delay
	}, idemjs.Options{ProgressInterval: 10 * time.Second}) // a third of AckWait
	if err != nil {
		log.Fatal(err) // a negative duration, named
	}
	cc, err := cons.Consume(h.MessageHandler(ctx))
	if err != nil {
		log.Fatal(err)
	}
	<-ctx.Done()
	cc.Stop()
}

// The same consumer taking 100 messages at a time: one claim and one
// confirm round trip on the Redis store per batch.
func ExampleHandler_HandleBatch() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	store, err := idem.NewRedisStore(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}), idem.RedisOptions{})
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	cons, err := js.Consumer(ctx, "ORDERS", "billing")
	if err != nil {
		log.Fatal(err)
	}
	h, err := idemjs.NewHandler(store, func(ctx context.Context, m jetstream.Msg) error {
		return chargeOrder(ctx, m.Data())
	}, idemjs.Options{})
	if err != nil {
		log.Fatal(err)
	}
	for ctx.Err() == nil {
		batch, err := cons.Fetch(100, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				log.Print(err)
			}
			continue
		}
		var ms []jetstream.Msg
		for m := range batch.Messages() {
			ms = append(ms, m)
		}
		h.HandleBatch(ctx, ms)
	}
}

func chargeOrder(context.Context, []byte) error { return nil }

// Runnable: a real nats-server in this process, a stream where order-1 is
// published twice (by an Order-Id header: under Nats-Msg-Id, JetStream's
// own Duplicates window would drop the copy), and a memory store. Each
// order is charged once; all three messages are acked.
func Example() {
	dir, err := os.MkdirTemp("", "idem-example-js")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	srv, err := server.NewServer(&server.Options{JetStream: true, StoreDir: dir,
		Port: -1, Host: "127.0.0.1", NoLog: true, NoSigs: true})
	if err != nil {
		log.Fatal(err)
	}
	srv.Start()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(10 * time.Second) {
		log.Fatal("nats-server not ready")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	ctx := context.Background()
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		log.Fatal(err)
	}
	for _, id := range []string{"order-1", "order-1", "order-2"} {
		m := nats.NewMsg("orders.new")
		m.Header.Set("Order-Id", id)
		m.Data = []byte(id)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			log.Fatal(err)
		}
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{Durable: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	store, err := idem.NewMemoryStore(idem.Options{}) // a RedisStore in production
	if err != nil {
		log.Fatal(err)
	}
	h, err := idemjs.NewHandler(store, func(ctx context.Context, m jetstream.Msg) error {
		fmt.Println("charged", string(m.Data()))
		return nil
	}, idemjs.Options{KeyHeader: "Order-Id", OnSettle: func(m jetstream.Msg, s idemjs.Settlement) {
		fmt.Println(s.Action, m.Headers().Get("Order-Id"))
	}})
	if err != nil {
		log.Fatal(err)
	}
	batch, err := cons.Fetch(3, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	for m := range batch.Messages() {
		h.Handle(ctx, m)
	}
	// Output:
	// charged order-1
	// ack order-1
	// ack order-1
	// charged order-2
	// ack order-2
}
