package jetstream_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	idemjs "github.com/idemgo/idem/consumer/jetstream"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
)

var quiet = slog.New(slog.DiscardHandler)

// startServer runs a real nats-server, with JetStream, in the test process
// (the server's own Go module; no broker is installed), on a free port and
// a temporary store directory, shut down when the test ends.
func startServer(t testing.TB) *server.Server {
	t.Helper()
	s, err := server.NewServer(&server.Options{JetStream: true, StoreDir: t.TempDir(), Port: -1, Host: "127.0.0.1", NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		t.Fatal("nats-server not ready within 10s")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// connect returns a JetStream client of s, closed when the test ends.
func connect(t testing.TB, s *server.Server) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// newConsumer creates the stream "S" on subjects "s.>" and its durable
// pull consumer "c" with explicit acks and the given AckWait.
func newConsumer(t testing.TB, js jetstream.JetStream, ackWait time.Duration) jetstream.Consumer {
	t.Helper()
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	c, err := js.CreateOrUpdateConsumer(ctx, "S", jetstream.ConsumerConfig{Durable: "c",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxDeliver: -1})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// publish publishes one message per key, with the key in header hdr ("":
// no header), and waits for the stream's acks.
func publish(t testing.TB, js jetstream.JetStream, hdr string, keys ...string) {
	t.Helper()
	for _, k := range keys {
		m := nats.NewMsg("s.orders")
		m.Data = []byte("payload of " + k)
		if hdr != "" && k != "" {
			m.Header.Set(hdr, k)
		}
		if _, err := js.PublishMsg(context.Background(), m); err != nil {
			t.Fatalf("publish %q: %v", k, err)
		}
	}
}

func prefix(t testing.TB) string {
	return fmt.Sprintf("idemtest:jetstream:%s:%d:", t.Name(), time.Now().UnixNano())
}

func newStore(t testing.TB, c redis.UniversalClient, prefix, worker string, ttl time.Duration) *idem.RedisStore {
	t.Helper()
	// MaxTakeOvers: the fleet tests crash and stop consumers on purpose, and
	// on a busy machine a stalled renewal adds take-overs of its own; they
	// check once-ness, storetest that a crash loop stops.
	s, err := idem.NewRedisStore(c, idem.RedisOptions{Prefix: prefix, Worker: worker, LeaseTTL: ttl,
		Retention: time.Minute, MaxTakeOvers: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// settlements collects a handler's settlements.
type settlements struct {
	mu   sync.Mutex
	all  []idemjs.Settlement
	keys []string
}

func (s *settlements) on(hdr string) func(jetstream.Msg, idemjs.Settlement) {
	return func(m jetstream.Msg, st idemjs.Settlement) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.all = append(s.all, st)
		s.keys = append(s.keys, m.Headers().Get(hdr))
	}
}

// snapshot returns the settlements so far.
func (s *settlements) snapshot() []idemjs.Settlement {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]idemjs.Settlement(nil), s.all...)
}

func (s *settlements) count(a idemjs.Action) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, st := range s.all {
		if st.Action == a {
			n++
		}
	}
	return n
}

// consume runs cons.Consume with h until cond holds (checked every 10ms) or
// 10s pass, then stops it.
func consume(t testing.TB, cons jetstream.Consumer, h *idemjs.Handler, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cc, err := cons.Consume(h.MessageHandler(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	waitFor(t, cond)
}

func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// settledOnBroker reports whether the consumer has delivered everything
// and nothing awaits an ack.
func settledOnBroker(t testing.TB, cons jetstream.Consumer) bool {
	t.Helper()
	info, err := cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.NumPending == 0 && info.NumAckPending == 0
}
