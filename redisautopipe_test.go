package idem

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/testing/testenv"
)

// --- 7. Automatic pipelining ------------------------------------------------
//
// What every store must do with AutoPipeline on is checked by the
// conformance suite (conformance_test.go); here: that calls coalesce, that a
// lone call is not held back, that each call keeps its own reply, error and
// context, and that a lost script cache is survived.

// gate is a go-redis hook that can hold round trips back: while closed,
// every command or pipeline that reaches it waits, so that the calls
// arriving meanwhile queue up behind it, deterministically.
type gate struct {
	mu      sync.Mutex
	closed  bool
	open    chan struct{}
	entered chan int // the number of commands of each round trip held
}

func newGate() *gate { return &gate{entered: make(chan int, 100)} }

func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed, g.open = true, make(chan struct{})
}

func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		g.closed = false
		close(g.open)
	}
}

// pass lets the round trips held so far go, and holds the next ones.
func (g *gate) pass() {
	g.mu.Lock()
	defer g.mu.Unlock()
	close(g.open)
	g.open = make(chan struct{})
}

func (g *gate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		g.hold([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		g.hold(cmds)
		return next(ctx, cmds)
	}
}

// hold waits while the gate is closed, if cmds run a script: a new
// connection's set-up (HELLO, CLIENT SETINFO) passes, or it would be held
// in place of the calls a test means to hold.
func (g *gate) hold(cmds []redis.Cmder) {
	n := len(cmds)
	if !slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return c.Name() == "evalsha" || c.Name() == "eval" }) {
		return
	}
	g.mu.Lock()
	closed, open := g.closed, g.open
	g.mu.Unlock()
	if closed {
		g.entered <- n
		<-open
	}
}

// waitEntered waits for n round trips to be held at the gate.
func (g *gate) waitEntered(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-g.entered:
		case <-time.After(10 * time.Second):
			t.Fatalf("no pipeline reached the gate within 10s")
		}
	}
}

// waitQueued waits until n calls are queued behind the senders.
func waitQueued(t *testing.T, s *RedisStore, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.auto.mu.Lock()
		q := len(s.auto.queue)
		s.auto.mu.Unlock()
		if q >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued after 10s; want %d", q, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// occupySenders starts one Claim per sender and waits for their round
// trips to be held at g, so that every later call queues. The returned function
// waits for those claims.
func occupySenders(t *testing.T, s *RedisStore, g *gate) func() {
	t.Helper()
	g.close()
	var wg sync.WaitGroup
	for range autoPipeSenders {
		wg.Go(func() {
			if _, err := s.Claim(context.Background(), uuid.NewString(), nil); err != nil {
				t.Errorf("Claim while the senders are held: %v", err)
			}
		})
	}
	g.waitEntered(t, autoPipeSenders)
	return wg.Wait
}

// loadScripts loads every script (on every master of a cluster), so
// that no NOSCRIPT retry adds a round trip to what a test counts.
func loadScripts(t *testing.T, c redis.UniversalClient) {
	t.Helper()
	for _, sc := range scripts {
		sha, err := c.ScriptLoad(context.Background(), sc.src).Result()
		if err != nil {
			t.Fatalf("SCRIPT LOAD: %v", err)
		}
		sc.sha.Store(any(sha))
	}
}

// autoBackends are where the automatic pipelining tests run: miniredis for
// the logic, the real Redis and the real Cluster for what only they show.
var autoBackends = []struct {
	name   string
	client func(t *testing.T) redis.UniversalClient
}{
	{"miniredis", func(t *testing.T) redis.UniversalClient { _, c := newMiniredisClient(t); return c }},
	{"redis", func(t *testing.T) redis.UniversalClient { return testenv.Redis(t) }},
	{"cluster", func(t *testing.T) redis.UniversalClient { return testenv.Cluster(t) }},
}

// quorum is a go-redis hook that sends one round trip at a time, in the
// order they reach it, each once the calls of every live worker of a test are in a pipeline or in
// the automatic pipeline's queue: the calls then overlap by construction,
// however fast the server answers and however slowly a loaded machine runs
// the workers (which otherwise decide how many calls find the pipelines
// busy and queue, and how many small round trips go while a large one is
// in flight).
type quorum struct {
	p        *autoPipe
	mu       sync.Mutex
	turn     sync.Cond // on mu: one round trip at a time, in order of arrival
	next     int       // the ticket of the next round trip to arrive
	serving  int       // the ticket of the round trip that may go
	live     int       // workers yet to make their last call
	inFlight int       // calls in the round trips that reached the hook
	stalls   int       // round trips sent without a quorum after a second
}

// done says a worker made its last call.
func (q *quorum) done() {
	q.mu.Lock()
	q.live--
	q.mu.Unlock()
}

// stallAfter is how long a round trip waits for its quorum before it is
// sent without one (a miscount, see send).
const stallAfter = 30 * time.Second

// send sends cmds once the round trips that reached the hook before it
// are done and the quorum is met (it polls: the queue grows
// without telling), counting the calls they carry (an EVALSHA's keys: one
// per call); what carries no call passes at once. A miscount must not hang
// the test: after stallAfter it sends anyway, and says so. The wait is for
// the workers' goroutines to make their next call, which a busy machine
// can delay; the bound it proves holds however long that takes, so only a
// wait no scheduler explains counts.
func (q *quorum) send(cmds []redis.Cmder, next func() error) error {
	keys := 0
	for _, c := range cmds {
		if a := c.Args(); len(a) > 2 && a[0] == "evalsha" {
			n, _ := a[2].(int)
			keys += n
		}
	}
	if keys == 0 {
		// Not a call of the workers' (the store's read of the server's
		// identity, once a second, on the path of a worker's Claim): held
		// here, it would hold that worker, whose call the quorum then
		// waits for in vain (seen: a second's stall each time, 150 in a
		// run on a busy machine).
		return next()
	}
	q.mu.Lock()
	q.inFlight += keys
	ticket := q.next
	q.next++
	for q.serving != ticket {
		q.turn.Wait()
	}
	q.mu.Unlock()
	defer func() {
		q.mu.Lock()
		q.serving++
		q.mu.Unlock()
		q.turn.Broadcast()
	}()
	for start := time.Now(); ; time.Sleep(100 * time.Microsecond) {
		q.p.mu.Lock()
		queued := len(q.p.queue)
		q.p.mu.Unlock()
		q.mu.Lock()
		met := q.inFlight+queued >= q.live
		if !met && time.Since(start) > stallAfter {
			q.stalls++
			met = true
		}
		q.mu.Unlock()
		if met {
			break
		}
	}
	err := next()
	q.mu.Lock()
	q.inFlight -= keys
	q.mu.Unlock()
	return err
}

func (q *quorum) DialHook(next redis.DialHook) redis.DialHook { return next }

func (q *quorum) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return q.send([]redis.Cmder{cmd}, func() error { return next(ctx, cmd) })
	}
}

func (q *quorum) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		return q.send(cmds, func() error { return next(ctx, cmds) })
	}
}

// TestRedisAutoPipelineCoalesces: 64 goroutines claiming and confirming at
// once share far fewer round trips than they make calls, and every one of
// them still gets its own lease and confirmation.
func TestRedisAutoPipelineCoalesces(t *testing.T) {
	for _, backend := range autoBackends {
		t.Run(backend.name, func(t *testing.T) {
			t.Parallel()
			c := backend.client(t)
			s := newTestRedisStore(t, c, RedisOptions{})
			ctx := context.Background()
			const goroutines, rounds = 64, 20
			h, q := &tripCounter{}, &quorum{p: s.auto, live: goroutines}
			q.turn.L = &q.mu
			// First contact (the server's checks, SCRIPT LOAD) before the
			// quorum counts calls.
			if _, err := s.Lookup(ctx, "warm-up"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Lookup = %v; want ErrNotFound", err)
			}
			c.AddHook(h)
			c.AddHook(q)
			var wg sync.WaitGroup
			for range goroutines {
				wg.Go(func() {
					defer q.done()
					for _, k := range uuidKeys(rounds) {
						cl, err := s.Claim(ctx, k, []byte("fp"))
						if err != nil || cl.Outcome != Claimed {
							t.Errorf("Claim(%q) = %v, %v; want claimed", k, cl.Outcome, err)
							return
						}
						if err := s.Confirm(ctx, cl.Lease, []byte(k)); err != nil {
							t.Errorf("Confirm(%q): %v", k, err)
							return
						}
						rec, err := s.Lookup(ctx, k)
						if err != nil || !rec.Confirmed || string(rec.Result) != k {
							t.Errorf("Lookup(%q) = %+v, %v; want its own confirmation", k, rec, err)
							return
						}
					}
				})
			}
			wg.Wait()
			calls := goroutines * rounds * 3
			trips, sent := h.take()
			t.Logf("%d calls in %d round trips", calls, trips)
			// One call per round trip would be 3840. With the quorum, when
			// round trip n leaves, every live worker's call is in it, in
			// the other sender's pipeline (autoPipeSenders) or in the queue,
			// which a pipeline takes whole; with no third sender, those two
			// are round trips n+1 and n+2. So every three round trips in a
			// row carry a call of every live worker, and 3840 calls by 64
			// workers take at most 3 * 3840/64 = 180 round trips (a
			// cluster's hook sees a pipeline before it is split per node),
			// whatever the speed of the machine or the server. Twice that
			// allows for the last rounds, when fewer workers are left, and
			// for new connections' handshakes.
			want := 2 * 3 * calls / goroutines
			if trips > want || q.stalls > 0 {
				t.Errorf("%d calls by %d goroutines cost %d round trips, %d sent without a quorum (first: %v); want at most %d, none",
					calls, goroutines, trips, q.stalls, sent[:min(5, len(sent))], want)
			}
		})
	}
}

// TestRedisAutoPipelineOnePipeline holds the senders back while 64 calls of
// every kind queue, one of them on a damaged record: they then go in one
// round trip (one per master on a cluster), and each gets its own answer —
// the damaged key fails alone.
func TestRedisAutoPipelineOnePipeline(t *testing.T) {
	for _, backend := range autoBackends {
		t.Run(backend.name, func(t *testing.T) {
			t.Parallel()
			c := backend.client(t)
			s := newTestRedisStore(t, c, RedisOptions{})
			ctx := context.Background()
			g := newGate()
			c.AddHook(g)
			loadScripts(t, c)

			// Leases to renew, forget and confirm, and a damaged record.
			keys := uuidKeys(64)
			var leases []*Lease
			for _, k := range keys[:40] {
				cl, err := s.Claim(ctx, k, nil)
				if err != nil || cl.Outcome != Claimed {
					t.Fatalf("Claim(%q) = %v, %v; want claimed", k, cl.Outcome, err)
				}
				leases = append(leases, cl.Lease)
			}
			damaged := keys[63]
			if err := c.Set(ctx, s.redisKey(damaged), "garbage", time.Minute).Err(); err != nil {
				t.Fatalf("SET: %v", err)
			}

			var trips *nodeTrips
			masters := 1
			if cc, ok := c.(*redis.ClusterClient); ok {
				trips, masters = hookMasters(t, cc)
			} else {
				trips = &nodeTrips{byNode: map[string]int{}}
				c.AddHook(nodeHook{addr: "redis", n: trips})
			}
			done := occupySenders(t, s, g)
			trips.take()

			type call struct {
				name string
				key  string
				run  func() error
			}
			var calls []call
			for i, l := range leases {
				switch i % 4 {
				case 0:
					calls = append(calls, call{"Confirm", l.Key, func() error { return s.Confirm(ctx, l, []byte("r")) }})
				case 1:
					calls = append(calls, call{"Renew", l.Key, func() error { return s.Renew(ctx, l) }})
				case 2:
					calls = append(calls, call{"Forget", l.Key, func() error { return s.Forget(ctx, l) }})
				case 3:
					calls = append(calls, call{"Lookup", l.Key, func() error {
						rec, err := s.Lookup(ctx, l.Key)
						if err == nil && (rec.Confirmed || rec.Token != l.Token) {
							err = fmt.Errorf("record %+v; want the live claim of token %d", rec, l.Token)
						}
						return err
					}})
				}
			}
			for _, k := range keys[40:] {
				calls = append(calls, call{"Claim", k, func() error {
					cl, err := s.Claim(ctx, k, nil)
					if err == nil && cl.Outcome != Claimed {
						err = fmt.Errorf("outcome %v; want claimed", cl.Outcome)
					}
					return err
				}})
			}
			errs := make([]error, len(calls))
			var wg sync.WaitGroup
			for i, cl := range calls {
				wg.Go(func() { errs[i] = cl.run() })
			}
			waitQueued(t, s, len(calls))
			g.release()
			wg.Wait()
			done()

			got := trips.take()
			// The held claims' pipelines passed the node hooks after the
			// gate opened: at most one each, on top of the queue's.
			for node, n := range got {
				if n > 1+autoPipeSenders {
					t.Errorf("%d queued calls cost %d round trips to %s (%v); want 1 (plus the %d held)",
						len(calls), n, node, got, autoPipeSenders)
				}
			}
			total := 0
			for _, n := range got {
				total += n
			}
			if total > masters+autoPipeSenders {
				t.Errorf("%d queued calls cost %d round trips (%v); want one per master (%d) plus the %d held",
					len(calls), total, got, masters, autoPipeSenders)
			}
			for i, cl := range calls {
				if cl.key == damaged {
					if !errors.Is(errs[i], ErrDamaged) {
						t.Errorf("%s(%q) on a damaged record = %v; want %v", cl.name, cl.key, errs[i], ErrDamaged)
					}
					continue
				}
				if errs[i] != nil {
					t.Errorf("%s(%q) beside a damaged record: %v; want nil", cl.name, cl.key, errs[i])
				}
			}
			if r, err := s.Lookup(ctx, leases[0].Key); err != nil || !r.Confirmed {
				t.Errorf("Lookup(%q) after Confirm = %+v, %v; want confirmed", leases[0].Key, r, err)
			}
			if _, err := s.Lookup(ctx, leases[2].Key); !errors.Is(err, ErrNotFound) {
				t.Errorf("Lookup(%q) after Forget = %v; want %v", leases[2].Key, err, ErrNotFound)
			}
		})
	}
}

// TestRedisAutoPipelineLoneCall: a call on an idle store is sent at once,
// alone, as without AutoPipeline. A store that waited for company, even for a
// millisecond, would show it in the fifth-quickest lone call next to a
// store without AutoPipeline (calls alternate, so that the machine's load
// weighs on both alike).
func TestRedisAutoPipelineLoneCall(t *testing.T) {
	for _, backend := range autoBackends[:2] {
		t.Run(backend.name, func(t *testing.T) {
			c := backend.client(t)
			plain := newTestRedisStore(t, c, RedisOptions{NoAutoPipeline: true})
			auto := newTestRedisStore(t, c, RedisOptions{})
			loadScripts(t, c)
			h := &tripCounter{}
			c.AddHook(h)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			claim := func(s *RedisStore, ctx context.Context, k string) time.Duration {
				start := time.Now()
				if _, err := s.Claim(ctx, k, nil); err != nil {
					t.Fatalf("Claim(%q): %v", k, err)
				}
				return time.Since(start)
			}
			// Both kinds of caller: with a context that can be cancelled and
			// one that cannot.
			for _, cctx := range []context.Context{context.Background(), ctx} {
				const n = 201
				claim(plain, cctx, uuid.NewString()) // open the connections
				claim(auto, cctx, uuid.NewString())
				h.take()
				var p, a []time.Duration
				for range n {
					p = append(p, claim(plain, cctx, uuid.NewString()))
					a = append(a, claim(auto, cctx, uuid.NewString()))
				}
				trips, sent := h.take()
				if trips != 2*n {
					t.Errorf("%d calls one after another cost %d round trips (first: %v); want %d", 2*n, trips, sent[:min(3, len(sent))], 2*n)
				}
				for _, what := range sent {
					if what != "evalsha" {
						t.Errorf("a lone call went as %q; want one evalsha, as without AutoPipeline", what)
						break
					}
				}
				slices.Sort(p)
				slices.Sort(a)
				// A wait for company would delay every lone call, the
				// fastest too; a loaded machine delays some calls by
				// milliseconds (one median came out 3.6ms against 1.6ms,
				// both stores alike), so the faster calls are compared:
				// the fifth of each that were quickest.
				q := n / 5
				t.Logf("cancellable context %v: lone Claim with AutoPipeline %v (median %v), without %v (median %v), at the fifth quickest",
					cctx.Done() != nil, a[q], a[n/2], p[q], p[n/2])
				if a[q] > 2*p[q]+200*time.Microsecond {
					t.Errorf("the fifth quickest lone Claim took %v with AutoPipeline, %v without; want no wait for company", a[q], p[q])
				}
			}
		})
	}
}

// TestRedisAutoPipelineCancel: a caller whose context ends returns at once,
// whether its call is queued (then it is never sent) or already in a
// pipeline (then it may still run); the calls beside it are unaffected.
func TestRedisAutoPipelineCancel(t *testing.T) {
	_, c := newMiniredisClient(t)
	s := newTestRedisStore(t, c, RedisOptions{})
	ctx := context.Background()
	loadScripts(t, c) // no NOSCRIPT retry among the round trips held
	g := newGate()
	c.AddHook(g)

	// Sent in a pipeline with another caller's call, then cancelled while
	// that pipeline is held.
	done := occupySenders(t, s, g)
	sentKey, other := uuid.NewString(), uuid.NewString()
	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { _, err := s.Claim(cctx, sentKey, nil); errc <- err }()
	oerr := make(chan error, 1)
	go func() { _, err := s.Claim(ctx, other, nil); oerr <- err }()
	waitQueued(t, s, 2)
	g.pass()            // the held calls go; the next round trip is held
	g.waitEntered(t, 1) // the pipeline of the two queued calls
	cancel()
	waitCancelled(t, errc, fmt.Sprintf("Claim(%q) cancelled in flight", sentKey), "its pipeline was held")
	g.release()
	done()
	if err := <-oerr; err != nil {
		t.Errorf("Claim(%q) in a pipeline with a cancelled call: %v; want claimed", other, err)
	}

	// Queued behind held senders, then cancelled.
	done = occupySenders(t, s, g)
	queuedKey, neighbour := uuid.NewString(), uuid.NewString()
	qctx, qcancel := context.WithCancel(ctx)
	go func() { _, err := s.Claim(qctx, queuedKey, nil); errc <- err }()
	nerr := make(chan error, 1)
	go func() {
		cl, err := s.Claim(ctx, neighbour, nil)
		if err == nil && cl.Outcome != Claimed {
			err = fmt.Errorf("outcome %v", cl.Outcome)
		}
		nerr <- err
	}()
	waitQueued(t, s, 2)
	qcancel()
	waitCancelled(t, errc, fmt.Sprintf("Claim(%q) cancelled in the queue", queuedKey), "the senders were held")
	g.release()
	done()
	if err := <-nerr; err != nil {
		t.Errorf("Claim(%q) queued beside a cancelled call: %v; want claimed", neighbour, err)
	}

	// The call that was sent ran, and its lease, which nobody took, is
	// forgotten once its reply arrives: the key is not held for a lease
	// (a client's retry would be told "in flight" all along). The one
	// cancelled in the queue never went.
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := s.Lookup(ctx, sentKey)
		if errors.Is(err, ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Lookup(%q) 5s after a cancelled, sent Claim = %v; want %v: its lease forgotten", sentKey, err, ErrNotFound)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if cl, err := s.Claim(ctx, sentKey, nil); err != nil || cl.Outcome != Claimed || cl.TakeOver {
		t.Errorf("Claim(%q) after the orphan's Forget = %v, take-over %v, %v; want a fresh claim", sentKey, cl.Outcome, cl.TakeOver, err)
	}
	if _, err := s.Lookup(ctx, queuedKey); !errors.Is(err, ErrNotFound) {
		t.Errorf("Lookup(%q) after a Claim cancelled in the queue = %v; want %v", queuedKey, err, ErrNotFound)
	}
	// Cancelled before the call: nothing is sent.
	if _, err := s.Claim(qctx, queuedKey, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("Claim with a cancelled context = %v; want %v", err, context.Canceled)
	}
	if _, err := s.Lookup(ctx, queuedKey); !errors.Is(err, ErrNotFound) {
		t.Errorf("Lookup(%q) after a Claim with a cancelled context = %v; want %v", queuedKey, err, ErrNotFound)
	}
}

// TestRedisAutoPipelineNoScript: concurrent calls after SCRIPT FLUSH all
// succeed (the pipeline loads what it lost with SCRIPT LOAD and resends
// the NOSCRIPT commands by EVALSHA).
func TestRedisAutoPipelineNoScript(t *testing.T) {
	for _, backend := range autoBackends[1:] {
		t.Run(backend.name, func(t *testing.T) {
			c := backend.client(t)
			s := newTestRedisStore(t, c, RedisOptions{})
			ctx := context.Background()
			flush := func() {
				t.Helper()
				var err error
				if cc, ok := c.(*redis.ClusterClient); ok {
					err = cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
						return m.ScriptFlush(ctx).Err()
					})
				} else {
					err = c.ScriptFlush(ctx).Err()
				}
				if err != nil {
					t.Fatalf("SCRIPT FLUSH: %v", err)
				}
			}
			keys := uuidKeys(64)
			leases := make([]*Lease, len(keys))
			var wg sync.WaitGroup
			flush()
			for i, k := range keys {
				wg.Go(func() {
					cl, err := s.Claim(ctx, k, nil)
					if err != nil || cl.Outcome != Claimed {
						t.Errorf("Claim(%q) after SCRIPT FLUSH = %v, %v; want claimed", k, cl.Outcome, err)
					}
					leases[i] = cl.Lease
				})
			}
			wg.Wait()
			if t.Failed() {
				return
			}
			flush()
			for _, l := range leases {
				wg.Go(func() {
					if err := s.Confirm(ctx, l, nil); err != nil {
						t.Errorf("Confirm(%q) after SCRIPT FLUSH: %v", l.Key, err)
					}
				})
			}
			wg.Wait()
			checkAllDuplicate(t, s, keys)
		})
	}
}

// waitCancelled waits for the error of the call what, whose context was
// cancelled while held: it must be context.Canceled, and come within 5 s.
func waitCancelled(t *testing.T, errc <-chan error, what, while string) {
	t.Helper()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s = %v; want %v", what, err, context.Canceled)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s did not return while %s", what, while)
	}
}

// The pipeline engine under batches and automatic pipelining
// (redispipeline.go).

// askTally is a go-redis hook on a ClusterClient, above its redirect
// handling: it counts the commands go-redis handed back answered ASK, in a
// pipeline (which the store must send again) and alone.
type askTally struct{ pipelined, single atomic.Int64 }

func isAsk(err error) bool { return err != nil && redis.HasErrorPrefix(err, "ASK") }

func (h *askTally) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *askTally) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if isAsk(cmd.Err()) {
			h.single.Add(1)
		}
		return err
	}
}

func (h *askTally) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if isAsk(c.Err()) {
				h.pipelined.Add(1)
			}
		}
		return err
	}
}

// keyInSlot returns the first key base+"0", base+"1", ... whose record is in
// slot. base must need no escaping (letters, digits, ':'): the store key is
// then its record's hash tag, and its slot that of its CRC16.
func keyInSlot(base string, slot int) string {
	for n := 0; ; n++ {
		if k := base + strconv.Itoa(n); int(crc16(k)%16384) == slot {
			return k
		}
	}
}

// askCase is what one part of TestRedisClusterPipelineASK does while its
// slot is open: confirmed and claimed are its records made before the
// moves (the leases of the claimed ones), fresh its keys never used; s
// is the store on the lagging client, g the gate on that client.
type askCase struct {
	name               string
	auto               bool // RedisOptions.AutoPipeline
	confirmed, claimed int  // records made before the moves
	fresh              int  // keys never used
	// run makes the part's calls, and returns the claims (by key) and the
	// confirmations they made, to be looked up after the move.
	run func(t *testing.T, s *RedisStore, g *gate, k askKeys) (claims map[string]*Lease, confirms []*Lease)
}

// askKeys are one part's keys, all in its slot.
type askKeys struct {
	confirmed []string
	leases    []*Lease // of the claimed records
	fresh     []string
	other     []string // in another slot of the same master, which does not move
}

// TestRedisClusterPipelineASK pins that a pipeline's ASK never reaches a
// caller: ClaimBatch, ConfirmBatch and AutoPipeline calls on keys of a slot
// in the middle of a move (MIGRATING on one master, IMPORTING on another,
// half its keys moved) are all answered. Each part makes it happen on
// purpose, on a cluster of the test's own, rather than waiting for a
// resharding's timing to bring it about: the store's client loaded its
// slot map while the slot was on master C; the slot then moved to A, and
// is now moving from A to B; the client may follow one redirect
// (MaxRedirects 1: with go-redis's default of 3 the pipeline would follow
// this chain itself, and a longer one needs a map that lags by more than
// a test can arrange). A command of a pipeline goes to C, which answers
// MOVED A; A answers ASK B for a key it no longer holds (or never held),
// and go-redis, its redirects spent, hands the ASK back: the store must
// send the command again (resendRedirected), or the caller gets "ASK ...".
// The MOVED has made go-redis reload its map, so the command sent again
// goes to A and follows the ASK.
func TestRedisClusterPipelineASK(t *testing.T) {
	t.Parallel()
	cl := testenv.StartCluster(t, 3, 0)
	ctx := context.Background()
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { _ = admin.Close() })
	prefix := testenv.UniquePrefix()
	opts := RedisOptions{Prefix: prefix, LeaseTTL: time.Minute}
	adminStore, err := NewRedisStore(admin, opts)
	if err != nil {
		t.Fatalf("NewRedisStore: %v", err)
	}
	// The first slot of each master's range: part i moves that of master i.
	shards, err := admin.ClusterShards(ctx).Result()
	if err != nil {
		t.Fatalf("CLUSTER SHARDS: %v", err)
	}
	first := map[string]int{}
	for _, sh := range shards {
		for _, n := range sh.Nodes {
			addr := net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
			for _, r := range sh.Slots {
				if f, ok := first[addr]; n.Role == "master" && (!ok || int(r.Start) < f) {
					first[addr] = int(r.Start)
				}
			}
		}
	}

	cases := []askCase{
		{name: "ClaimBatch", confirmed: 8, claimed: 8, fresh: 16,
			run: func(t *testing.T, s *RedisStore, _ *gate, k askKeys) (map[string]*Lease, []*Lease) {
				keys := append(append(append([]string{}, k.confirmed...), leaseKeys(k.leases)...), k.fresh...)
				cs, err := s.ClaimBatch(ctx, keys, nil)
				if err != nil {
					t.Fatalf("ClaimBatch of %d keys of the open slot: %v; want every item answered", len(keys), err)
				}
				claims := map[string]*Lease{}
				for i, c := range cs {
					want := Claimed
					switch {
					case i < len(k.confirmed):
						want = Duplicate
					case i < len(k.confirmed)+len(k.leases):
						want = InProgress
					default:
						claims[keys[i]] = c.Lease
					}
					if c.Outcome != want {
						t.Errorf("ClaimBatch item %q = %v; want %v", keys[i], c.Outcome, want)
					}
				}
				return claims, nil
			}},
		// Only claims before the moves, so that some of the leases confirmed
		// are on the keys already moved.
		{name: "ConfirmBatch", claimed: 16,
			run: func(t *testing.T, s *RedisStore, _ *gate, k askKeys) (map[string]*Lease, []*Lease) {
				if err := s.ConfirmBatch(ctx, k.leases, resultsOf(k.leases)); err != nil {
					t.Fatalf("ConfirmBatch of %d leases of the open slot: %v; want every item answered", len(k.leases), err)
				}
				return nil, k.leases
			}},
		// Only claims before the moves, as for ConfirmBatch: some of the
		// Confirms are on keys already moved, and the Claims of fresh keys
		// meet ASK wherever they are.
		{name: "AutoPipeline", auto: true, claimed: 16, fresh: 16,
			run: func(t *testing.T, s *RedisStore, g *gate, k askKeys) (map[string]*Lease, []*Lease) {
				// Both senders held on keys of a slot that does not move,
				// so that the calls on the open slot queue and go in one
				// pipeline, not alone.
				g.close()
				var held sync.WaitGroup
				for _, key := range k.other {
					held.Go(func() {
						if _, err := s.Claim(ctx, key, nil); err != nil {
							t.Errorf("Claim(%q) holding a sender: %v", key, err)
						}
					})
				}
				g.waitEntered(t, len(k.other))
				var mu sync.Mutex
				claims := map[string]*Lease{}
				var wg sync.WaitGroup
				for _, key := range k.fresh {
					wg.Go(func() {
						c, err := s.Claim(ctx, key, nil)
						if err != nil || c.Outcome != Claimed {
							t.Errorf("Claim(%q) in a pipeline on the open slot = %v, %v; want %v", key, c.Outcome, err, Claimed)
							return
						}
						mu.Lock()
						claims[key] = c.Lease
						mu.Unlock()
					})
				}
				for _, l := range k.leases {
					wg.Go(func() {
						if err := s.Confirm(ctx, l, resultsOf([]*Lease{l})[0]); err != nil {
							t.Errorf("Confirm(%q) in a pipeline on the open slot = %v; want nil", l.Key, err)
						}
					})
				}
				waitQueued(t, s, len(k.fresh)+len(k.leases))
				g.release()
				wg.Wait()
				held.Wait()
				return claims, k.leases
			}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// C (from) → A (via), then A → B (to), held open while the
			// part runs.
			from, via, to := cl.Nodes[i], cl.Nodes[(i+1)%3], cl.Nodes[(i+2)%3]
			slot, ok := first[from.Addr]
			if !ok {
				t.Fatalf("CLUSTER SHARDS names no slot of master %s (first slots %v)", from.Addr, first)
			}
			base := fmt.Sprintf("ask:%d:", i)
			var k askKeys
			for j := range tc.confirmed {
				k.confirmed = append(k.confirmed, keyInSlot(base+"confirmed:"+strconv.Itoa(j)+":", slot))
			}
			var claimed []string
			for j := range tc.claimed {
				claimed = append(claimed, keyInSlot(base+"claimed:"+strconv.Itoa(j)+":", slot))
			}
			for j := range tc.fresh {
				k.fresh = append(k.fresh, keyInSlot(base+"fresh:"+strconv.Itoa(j)+":", slot))
			}
			for j := range autoPipeSenders {
				k.other = append(k.other, keyInSlot(base+"other:"+strconv.Itoa(j)+":", slot+1))
			}
			for _, key := range append(append(append([]string{}, k.confirmed...), claimed...), k.fresh...) {
				if got := keySlot(adminStore.redisKey(key)); got != slot {
					t.Fatalf("key %q: record %q in slot %d; want %d", key, adminStore.redisKey(key), got, slot)
				}
			}
			if got, err := admin.ClusterKeySlot(ctx, adminStore.redisKey(claimed[0])).Result(); err != nil || int(got) != slot {
				t.Fatalf("CLUSTER KEYSLOT %q = %d, %v; want %d", adminStore.redisKey(claimed[0]), got, err, slot)
			}

			// The records made before the moves, on C.
			leases := claimAllOK(t, adminStore, append(append([]string{}, k.confirmed...), claimed...), nil)
			if len(k.confirmed) > 0 {
				if err := adminStore.ConfirmBatch(ctx, leases[:len(k.confirmed)], nil); err != nil {
					t.Fatalf("ConfirmBatch before the moves: %v", err)
				}
			}
			k.leases = leases[len(k.confirmed):]

			// The store's client loads its slot map now, with the slot on C.
			tally := &askTally{}
			g := newGate()
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaxRedirects: 1})
			t.Cleanup(func() { _ = c.Close() })
			c.AddHook(tally)
			c.AddHook(g)
			o := opts
			o.NoAutoPipeline = !tc.auto
			s, err := NewRedisStore(c, o)
			if err != nil {
				t.Fatalf("NewRedisStore: %v", err)
			}
			// First contact now, before the gate holds pipelines and the
			// slot moves: what follows is the steady state.
			if err := s.Check(ctx); err != nil {
				t.Fatalf("Check: %v", err)
			}
			owner := func() string {
				m, err := c.MasterForKey(ctx, s.redisKey(claimed[0]))
				if err != nil {
					t.Fatalf("MasterForKey: %v", err)
				}
				return m.Options().Addr
			}
			if got := owner(); got != from.Addr {
				t.Fatalf("the client's map puts slot %d on %s; want %s", slot, got, from.Addr)
			}
			if err := cl.MoveSlot(ctx, slot, from, via, nil); err != nil {
				t.Fatalf("moving slot %d %s → %s: %v", slot, from.Addr, via.Addr, err)
			}
			if got := owner(); got != from.Addr {
				t.Fatalf("after the move the client's map puts slot %d on %s; want %s still (a map that lags)", slot, got, from.Addr)
			}

			var claims map[string]*Lease
			var confirms []*Lease
			err = cl.MoveSlot(ctx, slot, via, to, func(moved, left int64) error {
				if moved == 0 || left == 0 {
					return fmt.Errorf("%d keys moved, %d left; want some of each", moved, left)
				}
				claims, confirms = tc.run(t, s, g, k)
				return nil
			})
			if err != nil {
				t.Fatalf("moving slot %d %s → %s: %v", slot, via.Addr, to.Addr, err)
			}
			if tally.pipelined.Load() == 0 {
				t.Errorf("go-redis handed back no pipelined command answered ASK (%d alone); want some: "+
					"the part did not put the store's resending of ASK to the test", tally.single.Load())
			}
			t.Logf("go-redis handed back %d pipelined and %d single commands answered ASK",
				tally.pipelined.Load(), tally.single.Load())

			// What the calls did is where it should be, on B.
			for key, l := range claims {
				rec, err := adminStore.Lookup(ctx, key)
				if err != nil || rec.Confirmed || rec.Token != l.Token {
					t.Errorf("Lookup(%q) after the move = %+v, %v; want the claim of token %d", key, rec, err, l.Token)
				}
			}
			for _, l := range confirms {
				rec, err := adminStore.Lookup(ctx, l.Key)
				if want := resultsOf([]*Lease{l})[0]; err != nil || !rec.Confirmed || string(rec.Result) != string(want) {
					t.Errorf("Lookup(%q) after the move = %+v, %v; want confirmed with %q", l.Key, rec, err, want)
				}
			}
		})
	}
}

func leaseKeys(ls []*Lease) []string {
	keys := make([]string, len(ls))
	for i, l := range ls {
		keys[i] = l.Key
	}
	return keys
}

// resultsOf returns the result each lease is confirmed with.
func resultsOf(ls []*Lease) [][]byte {
	rs := make([][]byte, len(ls))
	for i, l := range ls {
		rs[i] = []byte("done:" + l.Key)
	}
	return rs
}

// TestRedisAutoPipelineCancelTakeOver: a Claim whose caller gave up after
// it was sent, and which took over a lapsed claim, is left to lapse, not
// forgotten: forgetting it would erase the crash, and the next holder must
// be told of it (Claim.TakeOver, the attempts before, the count).
func TestRedisAutoPipelineCancelTakeOver(t *testing.T) {
	m, c := newMiniredisClient(t)
	s := newTestRedisStore(t, c, RedisOptions{LeaseTTL: time.Second})
	ctx := context.Background()
	loadScripts(t, c)
	g := newGate()
	c.AddHook(g)

	key := uuid.NewString()
	first, err := s.Claim(ctx, key, nil)
	if err != nil || first.Outcome != Claimed {
		t.Fatalf("Claim(%q) = %v, %v; want Claimed", key, first.Outcome, err)
	}
	crashed := first.Lease
	m.FastForward(2 * time.Second) // the first holder crashed: its lease lapsed

	done := occupySenders(t, s, g)
	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { _, err := s.Claim(cctx, key, nil); errc <- err }()
	oerr := make(chan error, 1)
	go func() { _, err := s.Claim(ctx, uuid.NewString(), nil); oerr <- err }()
	waitQueued(t, s, 2)
	g.pass()
	g.waitEntered(t, 1)
	cancel()
	waitCancelled(t, errc, fmt.Sprintf("Claim(%q) cancelled in flight", key), "its pipeline was held")
	g.release()
	done()
	if err := <-oerr; err != nil {
		t.Fatalf("Claim beside the cancelled one: %v", err)
	}
	// The cancelled take-over ran: its claim holds the key. It must still
	// hold it once the orphan's reply was handled (in the background).
	var orphan *Record
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		rec, err := s.Lookup(ctx, key)
		if err == nil && !rec.Confirmed && rec.Token > crashed.Token {
			orphan = rec
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Lookup(%q) after the cancelled take-over = %+v, %v; want its live claim", key, rec, err)
		}
	}
	time.Sleep(300 * time.Millisecond) // what a Forget of the orphan would take, many times over
	if rec, err := s.Lookup(ctx, key); err != nil || rec.Token != orphan.Token {
		t.Fatalf("Lookup(%q) after the orphan's reply = %+v, %v; want its claim (token %d) left to lapse", key, rec, err, orphan.Token)
	}
	m.FastForward(2 * time.Second)
	next, err := s.Claim(ctx, key, nil)
	if err != nil || next.Outcome != Claimed || !next.TakeOver || next.TakeOvers != 2 ||
		next.Prior == nil || next.Prior.Token != orphan.Token {
		t.Errorf("Claim(%q) after the orphan lapsed = %v, take-over %v (%d), prior %+v, %v; want the take-over of the orphan's attempt, the second",
			key, next.Outcome, next.TakeOver, next.TakeOvers, next.Prior, err)
	}
}
