package amqp_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	idemamqp "github.com/idemgo/idem/consumer/amqp"
	"github.com/idemgo/idem/internal/testing/testenv"
	amqp091 "github.com/rabbitmq/amqp091-go"
)

// AMQPURLVar names the RabbitMQ that integration tests run against
// (`make test` starts one and sets it).
const AMQPURLVar = "IDEM_AMQP_URL"

// dial connects to the test broker, retrying briefly: `make test` waits for
// its port, but the broker may still be finishing its boot.
func dial(t *testing.T) *amqp091.Connection {
	t.Helper()
	url := testenv.Lookup(t, AMQPURLVar)
	deadline := time.Now().Add(15 * time.Second)
	for {
		conn, err := amqp091.Dial(url)
		if err == nil {
			t.Cleanup(func() { _ = conn.Close() })
			return conn
		}
		if time.Now().After(deadline) {
			t.Fatalf("RabbitMQ at %s does not answer: %v", url, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Publish 10,000 messages (8,000 distinct ids, 2,000 duplicates, shuffled)
// plus one without a MessageId; four consumers with eight goroutines each
// and their own store; every 25th message's handler fails once. Every
// message's effect must be in the ledger exactly once, the id-less one
// rejected, and nothing left in the queue.
func TestRabbitMQEffectsOnce(t *testing.T) {
	const (
		distinct  = 8000
		dups      = 2000
		consumers = 4
		perConn   = 8
	)
	conn := dial(t)
	rc := testenv.Redis(t)
	prefix := fmt.Sprintf("idemtest:amqp:%d:", time.Now().UnixNano())
	queue := fmt.Sprintf("idem-test-%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	pub, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		t.Fatalf("QueueDeclare: %v", err)
	}
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
		}
	})
	if err := pub.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 0, distinct+dups)
	for i := range distinct {
		ids = append(ids, "m-"+strconv.Itoa(i))
	}
	for range dups {
		ids = append(ids, ids[rand.IntN(distinct)])
	}
	rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	ids = append(ids, "") // no MessageId
	var confirms []*amqp091.DeferredConfirmation
	for _, id := range ids {
		c, err := pub.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false,
			amqp091.Publishing{MessageId: id, Body: []byte(id)})
		if err != nil {
			t.Fatalf("publish: %v", err)
		}
		confirms = append(confirms, c)
	}
	for _, c := range confirms {
		if ok, err := c.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("publish not confirmed by the broker: %v, %v", ok, err)
		}
	}

	var mu sync.Mutex
	ledger := map[string]int{}
	failed := map[string]bool{}
	var acks, nacks, rejects atomic.Int64
	allAcked := make(chan struct{})
	onSettle := func(_ *amqp091.Delivery, s idemamqp.Settlement) {
		switch s.Action {
		case idemamqp.Ack:
			if acks.Add(1) == distinct+dups {
				close(allAcked)
			}
		case idemamqp.Nack:
			nacks.Add(1)
		case idemamqp.Reject:
			rejects.Add(1)
		}
	}
	handle := func(ctx context.Context, d amqp091.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		n, _ := strconv.Atoi(d.MessageId[2:])
		if n%25 == 0 && !failed[d.MessageId] {
			failed[d.MessageId] = true
			return fmt.Errorf("first attempt of %s fails", d.MessageId)
		}
		ledger[d.MessageId]++
		return nil
	}

	var wg sync.WaitGroup
	var chans []*amqp091.Channel
	for c := range consumers {
		store, err := idem.NewRedisStore(rc, idem.RedisOptions{Prefix: prefix,
			Worker: fmt.Sprintf("consumer-%d", c), Retention: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		h := idemamqp.Handler(store, handle, idemamqp.Options{MinDelay: 20 * time.Millisecond,
			MaxDelay: 200 * time.Millisecond, OnSettle: onSettle, Logger: slog.New(slog.DiscardHandler)})
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		chans = append(chans, ch)
		if err := ch.Qos(64, 0, false); err != nil {
			t.Fatal(err)
		}
		deliveries, err := ch.ConsumeWithContext(ctx, queue, fmt.Sprintf("c%d", c), false, false, false, false, nil)
		if err != nil {
			t.Fatalf("Consume: %v", err)
		}
		for range perConn {
			wg.Go(func() {
				for d := range deliveries {
					h(ctx, d)
				}
			})
		}
	}

	select {
	case <-allAcked:
	case <-ctx.Done():
		t.Fatalf("after 30s: %d of %d deliveries acked, %d nacks, %d rejects", acks.Load(), distinct+dups, nacks.Load(), rejects.Load())
	}
	for i, ch := range chans {
		if err := ch.Cancel(fmt.Sprintf("c%d", i), false); err != nil {
			t.Errorf("Cancel: %v", err)
		}
	}
	wg.Wait()
	// Closing the consumers' channels requeues anything they still held:
	// the queue is empty only if every delivery was settled.
	for _, ch := range chans {
		_ = ch.Close()
	}
	check, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := check.QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		t.Fatalf("QueueDeclarePassive: %v", err)
	}
	if q.Messages != 0 {
		t.Errorf("%d messages left in the queue; want 0 (every delivery settled)", q.Messages)
	}

	mu.Lock()
	defer mu.Unlock()
	wrong := 0
	for i := range distinct {
		id := "m-" + strconv.Itoa(i)
		if ledger[id] != 1 {
			if wrong++; wrong <= 10 {
				t.Errorf("%s: effect done %d times; want exactly once", id, ledger[id])
			}
		}
	}
	if len(ledger) != distinct || ledger[""] != 0 {
		t.Errorf("ledger has %d ids (id-less effect %d); want %d and none", len(ledger), ledger[""], distinct)
	}
	if r := rejects.Load(); r != 1 {
		t.Errorf("%d rejects; want 1: the delivery without a MessageId", r)
	}
	if n := nacks.Load(); n < int64(len(failed)) {
		t.Errorf("%d nacks for %d failed first attempts; want at least one each", n, len(failed))
	}
	t.Logf("%d deliveries: %d acks, %d nacks (%d failed first attempts), %d rejects",
		len(ids), acks.Load(), nacks.Load(), len(failed), rejects.Load())
}
