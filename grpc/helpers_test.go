package idemgrpc

import (
	"context"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The test service, Orders, is described by hand (no generated code): its
// messages are protobuf's well-known wrappers.
const (
	methodCreate = "/idemtest.Orders/Create" // StringValue -> StringValue
	methodCount  = "/idemtest.Orders/Count"  // Int64Value -> StringValue
	methodWatch  = "/idemtest.Orders/Watch"  // a server stream
)

// handlerFunc is what a test's Orders service does with a call.
type handlerFunc func(ctx context.Context, method string, req proto.Message) (proto.Message, error)

func ordersDesc() *grpc.ServiceDesc {
	unary := func(method string, newReq func() proto.Message) grpc.MethodDesc {
		return grpc.MethodDesc{
			MethodName: method[len("/idemtest.Orders/"):],
			Handler: func(srv any, ctx context.Context, dec func(any) error, icp grpc.UnaryServerInterceptor) (any, error) {
				in := newReq()
				if err := dec(in); err != nil {
					return nil, err
				}
				h := func(ctx context.Context, req any) (any, error) {
					return srv.(handlerFunc)(ctx, method, req.(proto.Message))
				}
				if icp == nil {
					return h(ctx, in)
				}
				return icp(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: method}, h)
			},
		}
	}
	return &grpc.ServiceDesc{
		ServiceName: "idemtest.Orders",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{
			unary(methodCreate, func() proto.Message { return new(wrapperspb.StringValue) }),
			unary(methodCount, func() proto.Message { return new(wrapperspb.Int64Value) }),
		},
		Streams: []grpc.StreamDesc{{
			StreamName:    "Watch",
			ServerStreams: true,
			Handler: func(srv any, ss grpc.ServerStream) error {
				in := new(wrapperspb.StringValue)
				if err := ss.RecvMsg(in); err != nil {
					return err
				}
				return ss.SendMsg(wrapperspb.String("watching " + in.GetValue()))
			},
		}},
	}
}

// serve serves h behind the interceptors of o on a bufconn listener and
// returns a connection to it, with the client interceptor of co when co is
// not nil.
func serve(t *testing.T, o ServerOptions, h handlerFunc, co *ClientOptions) *grpc.ClientConn {
	t.Helper()
	s, err := NewServer(o)
	if err != nil {
		t.Fatalf("NewServer = %v", err)
	}
	l := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(s.Unary), grpc.ChainStreamInterceptor(s.Stream))
	srv.RegisterService(ordersDesc(), h)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	opts := []grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return l.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}
	if co != nil {
		c, err := NewClient(*co)
		if err != nil {
			t.Fatalf("NewClient = %v", err)
		}
		opts = append(opts, grpc.WithChainUnaryInterceptor(c.Unary))
	}
	cc, err := grpc.NewClient("passthrough:///bufnet", opts...)
	if err != nil {
		t.Fatalf("grpc.NewClient = %v", err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
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
// status ("" and -1 when absent).
func errorInfo(err error) (reason string, delay time.Duration) {
	delay = -1
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			reason = d.GetReason()
		case *errdetails.RetryInfo:
			delay = d.GetRetryDelay().AsDuration()
		}
	}
	return reason, delay
}
