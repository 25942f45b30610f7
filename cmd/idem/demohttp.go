package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/client"
	"github.com/idemgo/idem/internal/faultproxy"
	"github.com/idemgo/idem/middleware"
)

const demoHTTPAbout = `Sends orders from client goroutines through a lossy TCP proxy to an orders
API behind the Idempotency-Key middleware. The proxy loses the response of a
share of the requests after the handler ran (the client sees its connection
close without an answer) and resets a share of the connections right after
forwarding the request (the handler may or may not have run). Every client
sends through client.Transport, which retries what it cannot know the
outcome of, with the order's one key.

The same workload runs twice: with the key, and with the same transport
retrying but its key in a header the server does not read, as a server that
ignores Idempotency-Key would. The report checks the keyed run: every order
created once, none missing, every client given the body of its order's one
creation, none giving up within the transport's budget. The second run's
double effects are counted beside it. Exit status 1 when the keyed run
breaks a check.

With no store flag the middleware records on an embedded Redis (miniredis,
in this process); --redis, --cluster, --postgres, --mysql or --sqlite name a
real store (a SQL table is created if missing).`

// demoHTTP is one run of idem demo http: its settings and its server.
type demoHTTP struct {
	orders, clients     int
	dropRate, resetRate float64
	seed                uint64
	timeout             time.Duration
	store               string
	mw                  func(http.Handler) http.Handler
}

func (c *cli) demoHTTP(args []string) int {
	fs := flag.NewFlagSet("demo http", flag.ContinueOnError)
	var sf storeFlags
	sf.register(fs, c.getenv, kindsAll)
	d := &demoHTTP{}
	fs.IntVar(&d.orders, "orders", 2000, "how many orders (logical POSTs)")
	fs.IntVar(&d.clients, "clients", 16, "how many client goroutines send them")
	fs.Float64Var(&d.dropRate, "drop-rate", 0.10, "probability that a request's response is lost after the handler ran")
	fs.Float64Var(&d.resetRate, "reset-rate", 0.02, "probability that a request's connection is reset after it was forwarded")
	fs.Uint64Var(&d.seed, "seed", 1, "seed of the proxy's faults")
	fs.DurationVar(&d.timeout, "timeout", 2*time.Minute, "give up (exit 1) when a run takes longer")
	pos, done, st := c.parse(fs, args, "[flags]", demoHTTPAbout+"\n\n"+envHelp(kindsAll))
	if done {
		return st
	}
	if len(pos) > 0 {
		return c.noArgs("demo http", pos)
	}
	if err := c.chooseStore("demo http", fs, &sf); err != nil {
		return c.usageError("demo http", err)
	}
	switch {
	case d.orders < 1 || d.clients < 1:
		return c.usageError("demo http", errors.New("--orders and --clients must be at least 1"))
	case d.dropRate < 0 || d.resetRate < 0 || d.dropRate+d.resetRate >= 1:
		return c.usageError("demo http", errors.New("--drop-rate and --reset-rate must be at least 0, their sum below 1"))
	case d.timeout <= 0:
		return c.usageError("demo http", errors.New("--timeout must be positive"))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	b, err := sf.open(ctx, true, false)
	if err != nil {
		return c.fail("demo http", exitUsage, err)
	}
	defer b.close()
	opts := idem.Options{Retention: time.Hour}
	if b.isSQL() {
		s, err := b.sqlStore(opts)
		if err == nil {
			err = s.CreateSchema(ctx)
		}
		if err != nil {
			return c.fail("demo http", exitUsage, err)
		}
	}
	s, err := b.store(opts)
	if err != nil {
		return c.fail("demo http", exitUsage, err)
	}
	if d.mw, err = middleware.New(middleware.Options{Store: s, SingleTenant: true}); err != nil {
		return c.fail("demo http", exitUsage, err)
	}
	d.store = b.desc
	return d.run(ctx, c.stdout)
}

// httpRun is what one run of the workload counted.
type httpRun struct {
	runs        []atomic.Int32 // handler runs per order
	first       []string       // the body of each order's first run
	got         []string       // the body each order's client was given
	gaveUp      atomic.Int64   // orders whose client got an error
	attempts    atomic.Int64   // as OnAttempt saw them
	received    atomic.Int64   // POSTs that reached the server: net/http's own resends too
	replays     atomic.Int64
	dropped     int
	resets      int
	took        time.Duration
	once, twice int // orders created once, more than once
	missing     int // orders never created
	ownBody     int // clients given the body of their order's one creation
	interrupted error
	firstMu     sync.Mutex
}

// run runs the workload with the key, then without, and reports both.
func (d *demoHTTP) run(ctx context.Context, w io.Writer) int {
	fmt.Fprintf(w, "idem demo http: %d orders from %d clients through a lossy proxy (drop-rate %.2f, reset-rate %.2f, seed %d)\nstore: %s; client.Transport defaults: %d attempts, %v in all\n",
		d.orders, d.clients, d.dropRate, d.resetRate, d.seed, d.store, client.DefaultMaxAttempts, client.DefaultMaxElapsed)
	keyed, err := d.workload(ctx, "")
	if err != nil {
		fmt.Fprintf(w, "idem demo http: %v\n", err)
		return exitFailed
	}
	// The same transport, its key in a header the middleware does not
	// read: a server that ignores Idempotency-Key. net/http resends a
	// request carrying X-Idempotency-Key as it does one carrying
	// Idempotency-Key (once, when a reused connection closes before any
	// response), so both runs retry alike.
	unkeyed, err := d.workload(ctx, "X-Idempotency-Key")
	if err != nil {
		fmt.Fprintf(w, "idem demo http: %v\n", err)
		return exitFailed
	}
	row := func(name string, a, b any) { fmt.Fprintf(w, "  %-38s %12v %16v\n", name, a, b) }
	fmt.Fprintf(w, "\n  %-38s %12s %16s\n", "", "with the key", "without the key")
	row("orders (logical POSTs)", d.orders, d.orders)
	row("attempts (client.Transport)", keyed.attempts.Load(), unkeyed.attempts.Load())
	row("requests that reached the server", keyed.received.Load(), unkeyed.received.Load())
	row("responses lost after the handler ran", keyed.dropped, unkeyed.dropped)
	row("connections reset", keyed.resets, unkeyed.resets)
	row("replayed responses", keyed.replays.Load(), unkeyed.replays.Load())
	row("orders created once", keyed.once, unkeyed.once)
	row("orders created twice or more", keyed.twice, unkeyed.twice)
	row("orders missing", keyed.missing, unkeyed.missing)
	row("clients given their order's one body", keyed.ownBody, unkeyed.ownBody)
	row("clients that gave up", keyed.gaveUp.Load(), unkeyed.gaveUp.Load())
	row("took", keyed.took.Round(time.Millisecond), unkeyed.took.Round(time.Millisecond))
	ok := keyed.interrupted == nil && keyed.twice == 0 && keyed.missing == 0 &&
		keyed.ownBody == d.orders && keyed.gaveUp.Load() == 0
	if !ok {
		fmt.Fprintf(w, "\nFAILED: with the key, every order must be created once and every client given its body (interrupted: %v)\n", keyed.interrupted)
		return exitFailed
	}
	fmt.Fprintf(w, "\nOK: with the key, %d orders created once each, every client given its order's one body, none gave up;\n"+
		"without it, the same retries created %d orders twice or more.\n", d.orders, unkeyed.twice)
	return exitOK
}

// workload serves the orders API behind the middleware and the lossy
// proxy, and sends every order once through client.Transport, its key in
// keyHeader ("" for Idempotency-Key).
func (d *demoHTTP) workload(ctx context.Context, keyHeader string) (*httpRun, error) {
	r := &httpRun{runs: make([]atomic.Int32, d.orders), first: make([]string, d.orders), got: make([]string, d.orders)}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	mw := d.mw(r.orders())
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.received.Add(1)
		mw.ServeHTTP(w, req)
	})}
	go func() { _ = srv.Serve(l) }()
	defer func() { _ = srv.Close() }()
	p, err := faultproxy.Start(l.Addr().String())
	if err != nil {
		return nil, err
	}
	defer func() { _ = p.Close() }()
	d.lossy(p)

	base := &http.Transport{MaxIdleConnsPerHost: d.clients, ResponseHeaderTimeout: 10 * time.Second}
	defer base.CloseIdleConnections()
	tr, err := client.New(client.Options{Base: base, Header: keyHeader, OnAttempt: func(a client.Attempt) {
		r.attempts.Add(1)
		if a.Response != nil && a.Response.Header.Get(middleware.HeaderReplayed) == "true" {
			r.replays.Add(1)
		}
	}})
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Transport: tr}
	url := "http://" + p.Addr() + "/orders"

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
	for range d.clients {
		wg.Go(func() {
			for m := range next {
				r.send(ctx, hc, url, m)
			}
		})
	}
	wg.Wait()
	r.took = time.Since(start)
	r.interrupted = ctx.Err()
	st := p.Stats()
	r.dropped, r.resets = st.DroppedReplies, st.Resets
	r.tally()
	return r, nil
}

// orders is the API's handler: it creates order m (counts a run) and
// answers with a body naming the run, so that a client can tell which
// run its body came from.
func (r *httpRun) orders() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		m, err := strconv.Atoi(string(bytes.TrimPrefix(body, []byte("order="))))
		if err != nil || m < 0 || m >= len(r.runs) {
			http.Error(w, "no such order", http.StatusBadRequest)
			return
		}
		n := r.runs[m].Add(1)
		out := fmt.Sprintf("order %d created by run %d at %s\n", m, n, time.Now().Format(time.StampMicro))
		if n == 1 {
			r.firstMu.Lock()
			r.first[m] = out
			r.firstMu.Unlock()
		}
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, out)
	})
	return mux
}

// send is one client's logical POST of order m.
func (r *httpRun) send(ctx context.Context, hc *http.Client, url string, m int) {
	req, _ := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader([]byte("order="+strconv.Itoa(m))))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := hc.Do(req)
	if err != nil {
		r.gaveUp.Add(1)
		return
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusCreated {
		r.gaveUp.Add(1)
		return
	}
	r.got[m] = string(b)
}

// tally counts the orders by how many times they were created.
func (r *httpRun) tally() {
	r.firstMu.Lock()
	defer r.firstMu.Unlock()
	for m := range r.runs {
		switch n := r.runs[m].Load(); {
		case n == 0:
			r.missing++
		case n == 1:
			r.once++
			if r.got[m] == r.first[m] {
				r.ownBody++
			}
		default:
			r.twice++
		}
	}
}

// lossy arms the proxy's faults: each POST forwarded loses its response
// with probability dropRate and is reset with probability resetRate. One
// fault of each kind is pending at a time; one that fires arms the next,
// on a goroutine since the proxy calls match under its lock.
func (d *demoHTTP) lossy(p *faultproxy.Proxy) {
	rng := rand.New(rand.NewPCG(d.seed, 0)) // match runs under the proxy's lock: no other guard
	var drop, reset func([]byte) bool
	drop = func(b []byte) bool {
		if !bytes.HasPrefix(b, []byte("POST ")) || rng.Float64() >= d.dropRate {
			return false
		}
		go p.DropNextReply(drop)
		return true
	}
	reset = func(b []byte) bool {
		if !bytes.HasPrefix(b, []byte("POST ")) || rng.Float64() >= d.resetRate/(1-d.dropRate) {
			return false
		}
		go p.ResetNext(reset, true)
		return true
	}
	if d.dropRate > 0 {
		p.DropNextReply(drop)
	}
	if d.resetRate > 0 {
		p.ResetNext(reset, true)
	}
}
