// Command idem-grpc-demo is `idem demo grpc`: the gRPC interceptors under
// faults, with and without the idempotency key, side by side.
//
// It lives in the grpc module, not in cmd/idem, so that grpc-go stays out
// of the root module's dependencies. Run it from a checkout with
//
//	cd grpc && go run ./cmd/idem-grpc-demo [flags]
//
// or anywhere with go run github.com/idemgo/idem/grpc/cmd/idem-grpc-demo@latest.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemgo/idem"
	idemgrpc "github.com/idemgo/idem/grpc"
	"github.com/idemgo/idem/middleware/rpccore/lossy"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const about = `Sends orders from client goroutines, each through its own lossy TCP proxy,
to a gRPC orders service behind the idempotency server interceptor. A share
of the calls lose their response after the handler ran (the proxy resets
the client's connection after the order was created), and a share have
their connection reset before the handler runs. Every client calls through
the client interceptor, which retries what it cannot know the outcome of,
with the order's one key.

The same workload runs twice: with the key, and with the same client
interceptor retrying but its key in metadata the server does not read
(x-idempotency-key), as a server without the interceptor would. The report
checks the keyed run: every order created once, none missing, every client
given its order's one response, none giving up. The second run's double
effects are counted beside it. Exit status 1 when the keyed run breaks a
check, 2 for bad flags or an unreachable store.

With no --redis the interceptor records on an embedded Redis (miniredis, in
this process); --redis ADDR (or IDEM_REDIS_ADDR) names a real one.`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// demo is one run of the command: its settings and its store.
type demo struct {
	orders, clients     int
	dropRate, resetRate float64
	seed                uint64
	timeout             time.Duration
	store               idem.Store
	storeDesc           string
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("idem demo grpc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: idem-grpc-demo [flags]\n\n%s\n\nflags:\n", about)
		fs.PrintDefaults()
	}
	d := &demo{}
	fs.IntVar(&d.orders, "orders", 2000, "how many orders (logical calls)")
	fs.IntVar(&d.clients, "clients", 16, "how many client goroutines send them, each on its own connection")
	fs.Float64Var(&d.dropRate, "drop-rate", 0.10, "probability that a call's response is lost after the handler ran")
	fs.Float64Var(&d.resetRate, "reset-rate", 0.02, "probability that a call's connection is reset before the handler runs")
	fs.Uint64Var(&d.seed, "seed", 1, "seed of the faults")
	fs.DurationVar(&d.timeout, "timeout", 2*time.Minute, "give up (exit 1) when a run takes longer")
	addr := fs.String("redis", os.Getenv("IDEM_REDIS_ADDR"), "Redis address (host:port); default IDEM_REDIS_ADDR, else an embedded miniredis")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "idem demo grpc: unexpected arguments %q\n", fs.Args())
		return 2
	case d.orders < 1 || d.clients < 1:
		fmt.Fprintln(stderr, "idem demo grpc: --orders and --clients must be at least 1")
		return 2
	case d.dropRate < 0 || d.resetRate < 0 || d.dropRate+d.resetRate >= 1:
		fmt.Fprintln(stderr, "idem demo grpc: --drop-rate and --reset-rate must be at least 0, their sum below 1")
		return 2
	case d.timeout <= 0:
		fmt.Fprintln(stderr, "idem demo grpc: --timeout must be positive")
		return 2
	}
	if *addr == "" {
		mr, err := miniredis.Run()
		if err != nil {
			fmt.Fprintf(stderr, "idem demo grpc: %v\n", err)
			return 2
		}
		defer mr.Close()
		*addr, d.storeDesc = mr.Addr(), "embedded Redis (miniredis)"
	} else {
		d.storeDesc = "Redis at " + *addr
	}
	rc := redis.NewClient(&redis.Options{Addr: *addr})
	defer rc.Close()
	if err := rc.Ping(ctx).Err(); err != nil {
		fmt.Fprintf(stderr, "idem demo grpc: %s: %v\n", d.storeDesc, err)
		return 2
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	s, err := idem.NewRedisStore(rc, idem.RedisOptions{Prefix: "idem-demo-grpc-" + hex.EncodeToString(b[:]) + ":", Retention: time.Hour})
	if err != nil {
		fmt.Fprintf(stderr, "idem demo grpc: %v\n", err)
		return 2
	}
	d.store = s
	return d.report(ctx, stdout)
}

// tally is what one run of the workload counted.
type tally struct {
	runs      []atomic.Int32 // handler runs per order
	first     []string       // the response of each order's first run
	got       []string       // the response each order's client was given
	firstMu   sync.Mutex
	gaveUp    atomic.Int64
	attempts  atomic.Int64
	received  atomic.Int64 // calls that reached the server
	replays   atomic.Int64
	dropped   atomic.Int64
	resets    atomic.Int64
	took      time.Duration
	once      int
	twice     int
	missing   int
	ownAnswer int
	err       error
}

// report runs the workload with the key, then without, and prints both.
func (d *demo) report(ctx context.Context, w io.Writer) int {
	fmt.Fprintf(w, "idem demo grpc: %d orders from %d clients through lossy proxies (drop-rate %.2f, reset-rate %.2f, seed %d)\nstore: %s; client interceptor: %d attempts, %v in all, %v an attempt\n",
		d.orders, d.clients, d.dropRate, d.resetRate, d.seed, d.storeDesc, maxAttempts, idemgrpc.DefaultMaxElapsed, attemptTimeout)
	keyed, err := d.workload(ctx, "")
	if err != nil {
		fmt.Fprintf(w, "idem demo grpc: %v\n", err)
		return 1
	}
	unkeyed, err := d.workload(ctx, "x-idempotency-key")
	if err != nil {
		fmt.Fprintf(w, "idem demo grpc: %v\n", err)
		return 1
	}
	row := func(name string, a, b any) { fmt.Fprintf(w, "  %-42s %12v %16v\n", name, a, b) }
	fmt.Fprintf(w, "\n  %-42s %12s %16s\n", "", "with the key", "without the key")
	row("orders (logical calls)", d.orders, d.orders)
	row("attempts (client interceptor)", keyed.attempts.Load(), unkeyed.attempts.Load())
	row("calls that reached the server", keyed.received.Load(), unkeyed.received.Load())
	row("responses lost after the handler ran", keyed.dropped.Load(), unkeyed.dropped.Load())
	row("connections reset before the handler ran", keyed.resets.Load(), unkeyed.resets.Load())
	row("replayed answers", keyed.replays.Load(), unkeyed.replays.Load())
	row("orders created once", keyed.once, unkeyed.once)
	row("orders created twice or more", keyed.twice, unkeyed.twice)
	row("orders missing", keyed.missing, unkeyed.missing)
	row("clients given their order's one response", keyed.ownAnswer, unkeyed.ownAnswer)
	row("clients that gave up", keyed.gaveUp.Load(), unkeyed.gaveUp.Load())
	row("took", keyed.took.Round(time.Millisecond), unkeyed.took.Round(time.Millisecond))
	if keyed.err != nil || keyed.twice != 0 || keyed.missing != 0 || keyed.ownAnswer != d.orders || keyed.gaveUp.Load() != 0 {
		fmt.Fprintf(w, "\nFAILED: with the key, every order must be created once and every client given its response (interrupted: %v)\n", keyed.err)
		return 1
	}
	fmt.Fprintf(w, "\nOK: with the key, %d orders created once each, every client given its order's one response, none gave up;\n"+
		"without it, the same retries created %d orders twice or more.\n", d.orders, unkeyed.twice)
	return 0
}

const methodCreate = "/idemdemo.Orders/Create"

// The client interceptor's bounds: twice the default attempts, so that a
// run at a high --drop-rate still finishes every order (at 0.22 faults a
// call, 5 in a row befall one call in two thousand).
const (
	maxAttempts    = 10
	attemptTimeout = 5 * time.Second
)

// workload serves the orders service behind the server interceptor, one
// lossy proxy per client, and sends every order once through the client
// interceptor, its key in keyMetadata ("" for idempotency-key).
func (d *demo) workload(ctx context.Context, keyMetadata string) (*tally, error) {
	t := &tally{runs: make([]atomic.Int32, d.orders), first: make([]string, d.orders), got: make([]string, d.orders)}
	si, err := idemgrpc.NewServer(idemgrpc.ServerOptions{Store: d.store, SingleTenant: true, Observer: replayCounter{&t.replays}})
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	proxies := make([]*lossy.Proxy, d.clients)
	for i := range proxies {
		if proxies[i], err = lossy.Start(l.Addr().String()); err != nil {
			return nil, err
		}
		defer proxies[i].Close()
	}
	var rngMu sync.Mutex
	rng := mrand.New(mrand.NewPCG(d.seed, 0))
	// fault draws a call's fault: 'd' lose its response after the
	// handler ran, 'r' reset its connection before, 0 none.
	fault := func() byte {
		rngMu.Lock()
		defer rngMu.Unlock()
		switch x := rng.Float64(); {
		case x < d.dropRate:
			return 'd'
		case x < d.dropRate+d.resetRate:
			return 'r'
		}
		return 0
	}
	// faults runs outside the idempotency interceptor: it sees every call
	// that reached the server, and resets the caller's proxy before the
	// handler or after it.
	faults := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		t.received.Add(1)
		md, _ := metadata.FromIncomingContext(ctx)
		c, _ := strconv.Atoi(first(md.Get("demo-client")))
		f := fault()
		if f == 'r' {
			proxies[c].ResetAll()
			t.resets.Add(1)
			return nil, status.Error(codes.Unavailable, "reset")
		}
		resp, err := next(ctx, req)
		if f == 'd' {
			proxies[c].ResetAll()
			t.dropped.Add(1)
		}
		return resp, err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(faults, si.Unary))
	srv.RegisterService(t.service(), nil)
	go func() { _ = srv.Serve(l) }()
	defer srv.Stop()

	ci, err := idemgrpc.NewClient(idemgrpc.ClientOptions{Metadata: keyMetadata, MaxAttempts: maxAttempts, AttemptTimeout: attemptTimeout,
		OnAttempt: func(idemgrpc.Attempt) { t.attempts.Add(1) }})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	next := make(chan int)
	go func() {
		defer close(next)
		for m := range d.orders {
			select {
			case next <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	start := time.Now()
	var wg sync.WaitGroup
	for c := range d.clients {
		cc, err := grpc.NewClient("passthrough:///"+proxies[c].Addr(),
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithChainUnaryInterceptor(ci.Unary),
			grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond}, MinConnectTimeout: 2 * time.Second}))
		if err != nil {
			return nil, err
		}
		defer cc.Close()
		cctx := metadata.AppendToOutgoingContext(ctx, "demo-client", strconv.Itoa(c))
		wg.Go(func() {
			for m := range next {
				out := new(wrapperspb.StringValue)
				if err := cc.Invoke(cctx, methodCreate, wrapperspb.String(strconv.Itoa(m)), out); err != nil {
					t.gaveUp.Add(1)
					continue
				}
				t.got[m] = out.GetValue()
			}
		})
	}
	wg.Wait()
	t.took = time.Since(start)
	t.err = ctx.Err()
	t.count()
	return t, nil
}

// service is the orders service, described by hand (no generated code):
// Create takes the order's number and creates it, answering with a text
// that names the run, so that a client can tell which run its answer came
// from.
func (t *tally) service() *grpc.ServiceDesc {
	create := func(ctx context.Context, req any) (any, error) {
		m, err := strconv.Atoi(req.(*wrapperspb.StringValue).GetValue())
		if err != nil || m < 0 || m >= len(t.runs) {
			return nil, status.Error(codes.InvalidArgument, "no such order")
		}
		n := t.runs[m].Add(1)
		out := fmt.Sprintf("order %d created by run %d at %s", m, n, time.Now().Format(time.StampMicro))
		if n == 1 {
			t.firstMu.Lock()
			t.first[m] = out
			t.firstMu.Unlock()
		}
		return wrapperspb.String(out), nil
	}
	return &grpc.ServiceDesc{
		ServiceName: "idemdemo.Orders",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Create",
			Handler: func(_ any, ctx context.Context, dec func(any) error, icp grpc.UnaryServerInterceptor) (any, error) {
				in := new(wrapperspb.StringValue)
				if err := dec(in); err != nil {
					return nil, err
				}
				return icp(ctx, in, &grpc.UnaryServerInfo{FullMethod: methodCreate}, create)
			}}},
	}
}

// count sorts the orders by how many times they were created.
func (t *tally) count() {
	t.firstMu.Lock()
	defer t.firstMu.Unlock()
	for m := range t.runs {
		switch n := t.runs[m].Load(); {
		case n == 0:
			t.missing++
		case n == 1:
			t.once++
			if t.got[m] == t.first[m] {
				t.ownAnswer++
			}
		default:
			t.twice++
		}
	}
}

// replayCounter counts the interceptor's replays.
type replayCounter struct{ n *atomic.Int64 }

func (r replayCounter) Observe(_ context.Context, e idem.Event) {
	if e.Outcome == idem.Duplicate && e.Err == nil {
		r.n.Add(1)
	}
}

func first(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[0]
}
