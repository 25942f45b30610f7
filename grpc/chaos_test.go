package idemgrpc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/middleware/rpccore/lossy"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestChaos sends orders through the client interceptor and a lossy proxy
// to the server interceptor on the real Redis store: responses lost after
// the handler ran (the handler resets every connection after its effect,
// for one order in five), connections reset at random moments, and a
// blackhole that heals. Every order's effect must happen exactly once, and
// every caller must be given that run's response.
func TestChaos(t *testing.T) {
	rc := redisClient(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	store, err := idem.NewRedisStore(rc, idem.RedisOptions{Prefix: "idem-grpc-chaos-" + hex.EncodeToString(b[:]) + ":", LeaseTTL: 2 * time.Second, Retention: 10 * time.Minute})
	if err != nil {
		t.Fatalf("NewRedisStore = %v", err)
	}
	const orders, clients = 300, 8
	var (
		p           *lossy.Proxy
		mu          sync.Mutex
		runs        = make([]int, orders)
		results     = make([]string, orders) // the response of each order's (first) run
		lost        atomic.Int32
		chaosResets atomic.Int32
	)
	h := func(ctx context.Context, method string, req proto.Message) (proto.Message, error) {
		m, err := strconv.Atoi(req.(*wrapperspb.StringValue).GetValue())
		if err != nil || m < 0 || m >= orders {
			return nil, status.Error(codes.InvalidArgument, "no such order")
		}
		var nonce [8]byte
		_, _ = rand.Read(nonce[:])
		out := fmt.Sprintf("order %d, run %s", m, hex.EncodeToString(nonce[:]))
		mu.Lock()
		runs[m]++
		first := runs[m] == 1
		if first {
			results[m] = out
		}
		mu.Unlock()
		if first && m%5 == 0 {
			// The effect happened; the response is lost with every
			// connection the proxy holds.
			p.ResetAll()
			lost.Add(1)
		}
		return wrapperspb.String(out), nil
	}
	s, err := NewServer(ServerOptions{Store: store, SingleTenant: true, LockTimeout: time.Second, RetryDelay: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(s.Unary))
	srv.RegisterService(ordersDesc(), handlerFunc(h))
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	if p, err = lossy.Start(l.Addr().String()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })

	var attempts, retries atomic.Int64
	c, err := NewClient(ClientOptions{MaxAttempts: 50, MaxElapsed: time.Minute, AttemptTimeout: 300 * time.Millisecond,
		InitialWait: 10 * time.Millisecond, MaxWait: 300 * time.Millisecond,
		OnAttempt: func(a Attempt) {
			attempts.Add(1)
			if a.Retry {
				retries.Add(1)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("passthrough:///"+p.Addr(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(c.Unary),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 200 * time.Millisecond}, MinConnectTimeout: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })

	// Faults besides the handler's: resets at random moments, and one
	// blackhole that heals.
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	chaosDone := make(chan struct{})
	go func() {
		defer close(chaosDone)
		for i := 0; ctx.Err() == nil; i++ {
			if !sleep(ctx, 40*time.Millisecond) {
				return
			}
			if i == 10 {
				p.Blackhole(700 * time.Millisecond)
				continue
			}
			if i%3 == 0 {
				chaosResets.Add(int32(p.ResetAll()))
			}
		}
	}()

	got := make([]string, orders)
	errs := make([]error, orders)
	next := make(chan int)
	go func() {
		defer close(next)
		for m := range orders {
			next <- m
		}
	}()
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for m := range next {
				out := new(wrapperspb.StringValue)
				errs[m] = cc.Invoke(ctx, methodCreate, wrapperspb.String(strconv.Itoa(m)), out)
				got[m] = out.GetValue()
			}
		})
	}
	wg.Wait()
	cancel()
	<-chaosDone

	mu.Lock()
	defer mu.Unlock()
	var twice, missing, wrong int
	for m := range orders {
		switch {
		case errs[m] != nil:
			t.Errorf("order %d: Invoke = %v; want its response", m, errs[m])
		case runs[m] == 0:
			missing++
		case runs[m] > 1:
			twice++
		case got[m] != results[m]:
			wrong++
			t.Errorf("order %d: given %q; want its run's response %q", m, got[m], results[m])
		}
	}
	t.Logf("%d orders, %d attempts (%d retried), %d responses lost after the handler ran, %d connections reset by the proxy (%d at random moments)",
		orders, attempts.Load(), retries.Load(), lost.Load(), p.Resets(), chaosResets.Load())
	if twice != 0 || missing != 0 || wrong != 0 {
		t.Errorf("orders done twice or more = %d, missing = %d, callers given another response = %d; want 0, 0, 0", twice, missing, wrong)
	}
	if lost.Load() == 0 || retries.Load() == 0 || chaosResets.Load() == 0 {
		t.Errorf("responses lost = %d, retries = %d, random resets = %d; want all above 0: the faults did not fire", lost.Load(), retries.Load(), chaosResets.Load())
	}
}
