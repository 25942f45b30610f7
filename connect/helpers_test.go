package idemconnect

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemgo/idem"
)

// The test service, Orders, is served by connect's generic handlers (no
// generated code): its messages are protobuf's well-known wrappers.
const (
	procCreate = "/idemtest.Orders/Create" // StringValue -> StringValue
	procCount  = "/idemtest.Orders/Count"  // Int64Value -> StringValue
	procGet    = "/idemtest.Orders/Get"    // StringValue -> StringValue, NO_SIDE_EFFECTS
	procWatch  = "/idemtest.Orders/Watch"  // StringValue -> stream of StringValue
)

// protocol is one way a client speaks to a Connect server.
type protocol struct {
	name string
	opt  []connect.ClientOption
}

// protocols are the three a Connect server speaks, each a client option;
// the Connect protocol also with the JSON codec.
var protocols = []protocol{
	{"connect", nil},
	{"connect+json", []connect.ClientOption{connect.WithProtoJSON()}},
	{"grpc", []connect.ClientOption{connect.WithGRPC()}},
	{"grpcweb", []connect.ClientOption{connect.WithGRPCWeb()}},
}

// eachProtocol runs f once per protocol.
func eachProtocol(t *testing.T, f func(t *testing.T, proto []connect.ClientOption)) {
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) { f(t, p.opt) })
	}
}

// handlerFunc is what a test's Orders service does with a unary call.
type handlerFunc func(ctx context.Context, procedure string, req *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error)

// ordersMux serves h (Create, Get; Count answers the count of its
// argument; Watch streams one message) with the handler options given.
func ordersMux(h handlerFunc, opts ...connect.HandlerOption) *http.ServeMux {
	mux := http.NewServeMux()
	for _, proc := range []string{procCreate, procGet} {
		o := opts
		if proc == procGet {
			o = append(append([]connect.HandlerOption(nil), opts...), connect.WithIdempotency(connect.IdempotencyNoSideEffects))
		}
		mux.Handle(proc, connect.NewUnaryHandler(proc, func(ctx context.Context, r *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
			return h(ctx, proc, r)
		}, o...))
	}
	mux.Handle(procCount, connect.NewUnaryHandler(procCount, func(ctx context.Context, r *connect.Request[wrapperspb.Int64Value]) (*connect.Response[wrapperspb.StringValue], error) {
		return h(ctx, procCount, connect.NewRequest(wrapperspb.String("count")))
	}, opts...))
	mux.Handle(procWatch, connect.NewServerStreamHandler(procWatch, func(ctx context.Context, r *connect.Request[wrapperspb.StringValue], s *connect.ServerStream[wrapperspb.StringValue]) error {
		return s.Send(wrapperspb.String("watching " + r.Msg.GetValue()))
	}, opts...))
	return mux
}

// startServer serves mux over TLS with HTTP/2 (the gRPC protocol needs
// it; the others use it too) and returns it.
func startServer(t testing.TB, mux http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the chaos test's resets are expected
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// orders is a client of the Orders service over one protocol.
type orders struct {
	create, get *connect.Client[wrapperspb.StringValue, wrapperspb.StringValue]
	count       *connect.Client[wrapperspb.Int64Value, wrapperspb.StringValue]
	watch       *connect.Client[wrapperspb.StringValue, wrapperspb.StringValue]
}

func newOrders(hc *http.Client, base string, opts ...connect.ClientOption) *orders {
	return &orders{
		create: connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](hc, base+procCreate, opts...),
		get:    connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](hc, base+procGet, append(append([]connect.ClientOption(nil), opts...), connect.WithIdempotency(connect.IdempotencyNoSideEffects))...),
		count:  connect.NewClient[wrapperspb.Int64Value, wrapperspb.StringValue](hc, base+procCount, opts...),
		watch:  connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](hc, base+procWatch, opts...),
	}
}

// serve serves h behind a server interceptor of o and returns a client
// over the protocol given, with the client interceptor of co when co is
// not nil.
func serve(t *testing.T, o ServerOptions, h handlerFunc, proto []connect.ClientOption, co *ClientOptions) *orders {
	t.Helper()
	s, err := NewServer(o)
	if err != nil {
		t.Fatalf("NewServer = %v", err)
	}
	srv := startServer(t, ordersMux(h, connect.WithInterceptors(s)))
	opts := append([]connect.ClientOption(nil), proto...)
	if co != nil {
		c, err := NewClient(*co)
		if err != nil {
			t.Fatalf("NewClient = %v", err)
		}
		opts = append(opts, connect.WithInterceptors(c))
	}
	return newOrders(srv.Client(), srv.URL, opts...)
}

// keyed is a request of v with the idempotency key k ("" for none).
func keyed[T any](m *T, k string) *connect.Request[T] {
	r := connect.NewRequest(m)
	if k != "" {
		r.Header().Set(DefaultHeader, k)
	}
	return r
}

// counter is a handler that counts its runs per request value and answers
// with the run's number.
type counter struct {
	mu   sync.Mutex
	runs map[string]int
}

func newCounter() *counter { return &counter{runs: map[string]int{}} }

func (c *counter) of(v string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs[v]
}

func (c *counter) count(v string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.runs[v]++
	return c.runs[v]
}

func memStore(t testing.TB) *idem.MemoryStore {
	t.Helper()
	s, err := idem.NewMemoryStore(idem.Options{})
	if err != nil {
		t.Fatalf("NewMemoryStore = %v", err)
	}
	return s
}

// failingStore is a Store whose Claim fails: the store is down.
type failingStore struct{ idem.Store }

var errStoreDown = errors.New("dial tcp 10.0.0.7:6379: connect: connection refused (secret internals)")

func (failingStore) Claim(context.Context, string, []byte) (idem.Claim, error) {
	return idem.Claim{}, errStoreDown
}

// redisClient returns a client of IDEM_REDIS_ADDR, skipping the test when
// it is not set, and failing it under CI=true: a green CI run means the
// real server was exercised.
func redisClient(t testing.TB) *redis.Client {
	t.Helper()
	addr := os.Getenv("IDEM_REDIS_ADDR")
	if addr == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("IDEM_REDIS_ADDR is not set, and CI=true: the Redis tests must run in CI")
		}
		t.Skip("IDEM_REDIS_ADDR is not set: skipping a test that needs a real Redis")
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("Redis at IDEM_REDIS_ADDR=%s: %v", addr, err)
	}
	return c
}

// errorInfo returns the ErrorInfo reason and RetryInfo delay of err's
// details ("" and -1 when absent).
func errorInfo(err error) (reason string, delay time.Duration) {
	delay = -1
	ce := new(connect.Error)
	if !errors.As(err, &ce) {
		return "", delay
	}
	for _, d := range ce.Details() {
		v, err := d.Value()
		if err != nil {
			continue
		}
		switch v := v.(type) {
		case *errdetails.ErrorInfo:
			reason = v.GetReason()
		case *errdetails.RetryInfo:
			delay = v.GetRetryDelay().AsDuration()
		}
	}
	return reason, delay
}
