package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	idemamqp "github.com/idemgo/idem/consumer/amqp"
	"github.com/idemgo/idem/internal/testing/sqltest"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/idemgo/idem/sqlstore"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
)

// brokerLog is an amqp091.Acknowledger that records what the broker was
// told.
type brokerLog struct {
	mu  sync.Mutex
	got []string
}

func (b *brokerLog) add(s string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.got = append(b.got, s)
	return nil
}

func (b *brokerLog) Ack(uint64, bool) error { return b.add("ack") }
func (b *brokerLog) Nack(_ uint64, _ bool, requeue bool) error {
	if requeue {
		return b.add("nack-requeue")
	}
	return b.add("nack-drop")
}
func (b *brokerLog) Reject(_ uint64, requeue bool) error {
	if requeue {
		return b.add("reject-requeue")
	}
	return b.add("reject")
}

func (b *brokerLog) all() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.got...)
}

// settleOne runs one delivery with key through an amqp Handler on store and
// returns how it was settled and what the broker saw.
func settleOne(t *testing.T, store idem.Store, key string, h func(context.Context, amqp091.Delivery) error) (idemamqp.Settlement, []string) {
	t.Helper()
	settled := make(chan idemamqp.Settlement, 1)
	handle := idemamqp.Handler(store, h, idemamqp.Options{
		MinDelay: time.Millisecond,
		OnSettle: func(_ *amqp091.Delivery, s idemamqp.Settlement) { settled <- s },
		Logger:   slog.New(slog.DiscardHandler),
	})
	broker := &brokerLog{}
	handle(context.Background(), amqp091.Delivery{Acknowledger: broker, MessageId: key, DeliveryTag: 1})
	select {
	case s := <-settled:
		return s, broker.all()
	case <-time.After(10 * time.Second):
		t.Fatalf("delivery %q never settled", key)
		return idemamqp.Settlement{}, nil
	}
}

// deadRedisStore is a RedisStore whose server is gone.
func deadRedisStore(t *testing.T) idem.Store {
	t.Helper()
	st, err := idem.NewRedisStore(testenv.DeadRedis(t), idem.RedisOptions{AllowEviction: true}) // no I/O: the check is skipped
	if err != nil {
		t.Fatalf("NewRedisStore = %v", err)
	}
	return st
}

// A store that cannot be reached fails closed: the handler never runs, the
// wrappers return an error (never nil, never ErrNotRecorded, which would be
// acked), and the broker adapter requeues the delivery instead of acking
// it.
func TestSecurityConsumerFailClosed(t *testing.T) {
	for name, open := range map[string]func(t *testing.T) idem.Store{
		"redis down": deadRedisStore,
		"postgres closed": func(t *testing.T) idem.Store {
			db := sqltest.Postgres(t)
			st, err := sqlstore.New(db, sqlstore.Options{Dialect: sqlstore.Postgres, Table: "idemsec_consumer"})
			if err != nil {
				t.Fatal(err)
			}
			_ = db.Close()
			return st
		},
		"mysql closed": func(t *testing.T) idem.Store {
			db := sqltest.MySQL(t)
			st, err := sqlstore.New(db, sqlstore.Options{Dialect: sqlstore.MySQL, Table: "idemsec_consumer"})
			if err != nil {
				t.Fatal(err)
			}
			_ = db.Close()
			return st
		},
		"claim errors": func(t *testing.T) idem.Store {
			s := spy(memStore(idem.Options{}))
			s.setFail("claim", func(int) error { return errDown })
			return s
		},
	} {
		t.Run(name, func(t *testing.T) {
			store := open(t)
			var runs atomic.Int64
			h := func(context.Context, msg) error { runs.Add(1); return nil }

			err := consumer.Idempotent(store, msgKey, h)(context.Background(), msg{ID: "m1"})
			if err == nil || errors.Is(err, consumer.ErrNotRecorded) {
				t.Errorf("Idempotent with the store down = %v; want the store's error", err)
			}
			for i, err := range consumer.Batch(store, msgKey, h)(context.Background(), []msg{{ID: "m1"}, {ID: "m2"}}) {
				if err == nil || errors.Is(err, consumer.ErrNotRecorded) {
					t.Errorf("Batch item %d with the store down = %v; want the store's error", i, err)
				}
			}
			s, broker := settleOne(t, store, "m1", func(context.Context, amqp091.Delivery) error { runs.Add(1); return nil })
			if s.Action != idemamqp.Nack || len(broker) != 1 || broker[0] != "nack-requeue" {
				t.Errorf("amqp delivery with the store down settled %v, broker saw %q; want one nack with requeue", s.Action, broker)
			}
			if n := runs.Load(); n != 0 {
				t.Errorf("handler ran %d times with the store down; want never", n)
			}
		})
	}
}

// An oversized key is refused before the real Redis sees a command: the
// wrapper returns ErrInvalidKey without running the handler, and the broker
// adapter rejects the delivery without requeue (no redelivery can fix it).
func TestSecurityConsumerOversizedKey(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.Lookup(t, testenv.RedisAddrVar)})
	t.Cleanup(func() { _ = c.Close() })
	sent := &testenv.IOCounter{}
	c.AddHook(sent)
	store, err := idem.NewRedisStore(c, idem.RedisOptions{Prefix: "idemtest:consumer-sec:"})
	if err != nil {
		t.Fatalf("NewRedisStore = %v", err)
	}
	long := strings.Repeat("m", idem.DefaultMaxKeyBytes+1)
	var runs atomic.Int64
	before := sent.N.Load()

	err = consumer.Idempotent(store, msgKey, func(context.Context, msg) error { runs.Add(1); return nil })(context.Background(), msg{ID: long})
	if !errors.Is(err, idem.ErrInvalidKey) {
		t.Errorf("Idempotent with a %d-byte key = %v; want ErrInvalidKey", len(long), err)
	}
	s, broker := settleOne(t, store, long, func(context.Context, amqp091.Delivery) error { runs.Add(1); return nil })
	if s.Action != idemamqp.Reject || len(broker) != 1 || broker[0] != "reject" {
		t.Errorf("amqp delivery with a %d-byte key settled %v, broker saw %q; want one reject without requeue", len(long), s.Action, broker)
	}
	if n := sent.N.Load() - before; n != 0 {
		t.Errorf("Redis saw %d commands or dials for the oversized key; want none", n)
	}
	if n := runs.Load(); n != 0 {
		t.Errorf("handler ran %d times; want never", n)
	}
}
