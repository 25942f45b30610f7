package idemconnect

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/middleware/rpccore/lossy"
)

// TestChaos sends 300 orders per protocol through the client interceptor
// and a lossy proxy to a real Connect server (TLS, HTTP/2) with the server
// interceptor on the real Redis store: the response of 3 orders in 10 is
// lost after the handler ran (the handler resets every connection the
// proxy holds after its effect), connections are reset at random moments,
// and a blackhole heals. Every order's effect must happen exactly once,
// and every caller must be given that run's response.
func TestChaos(t *testing.T) {
	rc := redisClient(t)
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			var b [6]byte
			_, _ = rand.Read(b[:])
			store, err := idem.NewRedisStore(rc, idem.RedisOptions{Prefix: "idem-connect-chaos-" + hex.EncodeToString(b[:]) + ":", LeaseTTL: 2 * time.Second, Retention: 10 * time.Minute})
			if err != nil {
				t.Fatalf("NewRedisStore = %v", err)
			}
			chaos(t, store, p.opt)
		})
	}
}

func chaos(t *testing.T, store idem.Store, proto []connect.ClientOption) {
	const orders, clients = 300, 8
	var (
		px          *lossy.Proxy
		mu          sync.Mutex
		runs        = make([]int, orders)
		results     = make([]string, orders) // the response of each order's (first) run
		lost        atomic.Int32
		chaosResets atomic.Int32
	)
	h := func(ctx context.Context, proc string, r *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
		m, err := strconv.Atoi(r.Msg.GetValue())
		if err != nil || m < 0 || m >= orders {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("no such order %q", r.Msg.GetValue()))
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
		if first && m%10 < 3 {
			// The effect happened; the response is lost with every
			// connection the proxy holds.
			px.ResetAll()
			lost.Add(1)
		}
		return connect.NewResponse(wrapperspb.String(out)), nil
	}
	s, err := NewServer(ServerOptions{Store: store, SingleTenant: true, LockTimeout: time.Second, RetryDelay: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, ordersMux(h, connect.WithInterceptors(s)))
	if px, err = lossy.Start(srv.Listener.Addr().String()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })

	var attempts, retries atomic.Int64
	c, err := NewClient(ClientOptions{MaxAttempts: 50, MaxElapsed: time.Minute, AttemptTimeout: time.Second,
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
	o := newOrders(srv.Client(), "https://"+px.Addr(), append(append([]connect.ClientOption(nil), proto...), connect.WithInterceptors(c))...)

	// Faults besides the handler's: resets at random moments, and one
	// blackhole that heals.
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	chaosDone := make(chan struct{})
	go func() {
		defer close(chaosDone)
		for i := 0; ctx.Err() == nil; i++ {
			if !sleep(ctx, 40*time.Millisecond) {
				return
			}
			if i == 10 {
				px.Blackhole(700 * time.Millisecond)
				continue
			}
			if i%3 == 0 {
				chaosResets.Add(int32(px.ResetAll()))
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
				r, err := o.create.CallUnary(ctx, connect.NewRequest(wrapperspb.String(strconv.Itoa(m))))
				errs[m] = err
				if err == nil {
					got[m] = r.Msg.GetValue()
				}
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
			t.Errorf("order %d: CallUnary = %v; want its response", m, errs[m])
		case runs[m] == 0:
			missing++
		case runs[m] > 1:
			twice++
		case got[m] != results[m]:
			wrong++
			t.Errorf("order %d: given %q; want its run's response %q", m, got[m], results[m])
		}
	}
	t.Logf("%d orders, %d attempts (%d retried), %d responses lost after the handler ran (%.0f%%), %d connections reset by the proxy (%d at random moments)",
		orders, attempts.Load(), retries.Load(), lost.Load(), 100*float64(lost.Load())/orders, px.Resets(), chaosResets.Load())
	if twice != 0 || missing != 0 || wrong != 0 {
		t.Errorf("orders done twice or more = %d, missing = %d, callers given another response = %d; want 0, 0, 0", twice, missing, wrong)
	}
	if lost.Load() < orders/4 || retries.Load() == 0 || chaosResets.Load() == 0 {
		t.Errorf("responses lost = %d, retries = %d, random resets = %d; want ~30%% lost and the others above 0: the faults did not fire", lost.Load(), retries.Load(), chaosResets.Load())
	}
}
