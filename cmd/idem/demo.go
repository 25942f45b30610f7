package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/idem/internal/metrics"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/sqlstore"
)

const demoAbout = `Runs a fleet of workers on an in-process at-least-once queue that duplicates
messages, redelivers them, and crashes workers mid-handler (a crashed worker
abandons its lease: no Forget, the lease runs out and another worker takes
the message over). Every handler runs through consumer.Idempotent and applies
the message's effect to a ledger. A handler told of a take-over
(idem.TakeOverFrom) first asks the ledger whether the effect landed before
the crash, and if so confirms without applying it again. The report checks
the ledger against idem's guarantees: every message takes effect once, and
every take-over is reported to its handler. Exit status 1 when the ledger
disagrees.

--no-reconcile turns the ledger question off, to show what it prevents: an
effect is then applied twice after each crash between the effect and its
confirm (the store never learned the work was done), and only then.
--poison N adds N messages whose handler crashes its worker every time:
the store quarantines each after MaxTakeOvers (3) take-overs, the worker
dead-letters it, and every other message still takes effect once.

With no store flag the demo runs on an embedded Redis (miniredis, in this
process) through the real RedisStore and its Lua scripts. --redis, --cluster,
--postgres, --mysql or --sqlite run it on a real store (a SQL table is created
if missing). Keys are demo:RUN:NNNNNN, RUN random per run, kept for --retention.

The same --seed gives the same plan: the same copies of each message at the
same places in the queue, and the same handler runs crash. The goroutines'
interleaving is not part of the plan, so counts such as duplicates skipped and
in-progress redeliveries vary a little between runs of one seed.

idem demo http runs the HTTP half instead: clients sending orders through
client.Transport and a lossy proxy to the middleware (idem demo http --help);
idem demo grpc says how to run the gRPC one, a program of the grpc module.`

// demoRun is one demo: its settings, plan, stores and ledger.
type demoRun struct {
	messages, workers  int
	poison             int  // poison messages, after the ordinary ones
	reconcile          bool // a take-over asks the ledger before applying
	maxTakeOvers       int  // the stores' MaxTakeOvers
	dupRate, crashRate float64
	seed               uint64
	lease, retryDelay  time.Duration
	retention, timeout time.Duration
	store, runID       string
	embedded           bool // the store is the demo's own miniredis, gone when it exits
	plan               *plan
	ledger             *ledger
	queue              *queue
	fault              func(*ledger) // tests only: breaks the ledger before the check
	progressEvery      time.Duration
	terminal           bool
	stores             []idem.Store      // [0] checks the records; [1:] one per worker
	metrics            *metrics.Registry // counts the stores' and the wrappers' events
	interrupted        error             // why the run stopped before the queue drained
}

// key returns message m's idempotency key; a poison message's is marked.
func (d *demoRun) key(m int) string {
	if m >= d.messages {
		return "demo:" + d.runID + ":poison-" + fmt.Sprintf("%03d", m-d.messages)
	}
	return "demo:" + d.runID + ":" + fmt.Sprintf("%06d", m)
}

func (c *cli) demo(args []string) int {
	if len(args) > 0 && args[0] == "http" {
		return c.demoHTTP(args[1:])
	}
	if len(args) > 0 && args[0] == "grpc" {
		// A program of the grpc module: importing it here would bring
		// grpc-go into this module's dependencies.
		fmt.Fprintln(c.stderr, "idem demo grpc: the gRPC demo is the grpc module's program; in a clone of idem, run it with\n"+
			"  cd grpc && go run ./cmd/idem-grpc-demo [flags]\n"+
			"(once the grpc module is published: go run github.com/idemgo/idem/grpc/cmd/idem-grpc-demo@latest)")
		return exitUsage
	}
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	var sf storeFlags
	sf.register(fs, c.getenv, kindsAll)
	d := &demoRun{}
	fs.IntVar(&d.messages, "messages", 2000, "how many distinct messages")
	fs.IntVar(&d.workers, "workers", 8, "how many workers consume the queue")
	fs.Float64Var(&d.dupRate, "dup-rate", 0.3, "probability of each further copy of a message in the queue (up to 4 copies)")
	fs.Float64Var(&d.crashRate, "crash-rate", 0.02, "probability that a handler run crashes (half before, half after the effect; up to 3 per message)")
	fs.Uint64Var(&d.seed, "seed", 1, "seed of the plan: copies, queue order and crashes")
	fs.IntVar(&d.poison, "poison", 0, "add `N` poison messages, whose handler crashes its worker every time: each is quarantined")
	noReconcile := fs.Bool("no-reconcile", false, "a take-over applies the effect again without asking the ledger: shows the double effects reconciling prevents")
	fs.DurationVar(&d.lease, "lease", 0, "the lease TTL: how long a crashed worker's message waits for a take-over (default idem.MinLeaseTTL, 500ms; 1s on SQLite)")
	fs.DurationVar(&d.retention, "retention", time.Hour, "how long the store remembers a confirmed key")
	fs.DurationVar(&d.timeout, "timeout", 2*time.Minute, "give up (exit 1) when the run takes longer")
	pos, done, st := c.parse(fs, args, "[flags]", demoAbout+"\n\n"+envHelp(kindsAll))
	if done {
		return st
	}
	if len(pos) > 0 {
		return c.noArgs("demo", pos)
	}
	if err := c.chooseStore("demo", fs, &sf); err != nil {
		return c.usageError("demo", err)
	}
	switch {
	case d.messages < 1 || d.workers < 1:
		return c.usageError("demo", errors.New("--messages and --workers must be at least 1"))
	case d.poison < 0 || d.poison > 1000:
		return c.usageError("demo", fmt.Errorf("--poison %d: want 0 to 1000", d.poison))
	case d.dupRate < 0 || d.dupRate >= 1 || d.crashRate < 0 || d.crashRate >= 1:
		return c.usageError("demo", errors.New("--dup-rate and --crash-rate must be in [0, 1)"))
	case d.lease != 0 && d.lease < idem.MinLeaseTTL || d.retention < time.Second || d.timeout <= 0:
		return c.usageError("demo", fmt.Errorf("--lease must be at least %v (idem.MinLeaseTTL), --retention at least 1s, --timeout positive", idem.MinLeaseTTL))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	b, err := sf.open(ctx, true, false)
	if err != nil {
		return c.fail("demo", exitUsage, err)
	}
	defer b.close()
	if d.lease == 0 {
		// Short, so that take-overs happen within a run of a few seconds;
		// longer on SQLite, which serializes every write (claims, renewals,
		// confirms) behind one lock: a confirm that cannot get the lock
		// within the lease is work done but not recorded.
		d.lease = idem.MinLeaseTTL
		if b.dialect == sqlstore.SQLite {
			d.lease = time.Second
		}
	}
	d.reconcile = !*noReconcile
	d.maxTakeOvers = idem.DefaultMaxTakeOvers
	d.metrics = &metrics.Registry{}
	opts := idem.Options{LeaseTTL: d.lease, Retention: d.retention, Observer: d.metrics, MaxTakeOvers: d.maxTakeOvers}
	if b.isSQL() {
		s, err := b.sqlStore(opts)
		if err == nil {
			err = s.CreateSchema(ctx)
		}
		if err != nil {
			return c.fail("demo", exitUsage, err)
		}
	}
	d.store, d.embedded = b.desc, sf.kind == ""
	if b.isSQL() {
		// database/sql keeps 2 idle connections by default: the workers'
		// claims, confirms and renewals, more at once than that, would
		// close a connection after each statement and open one for the
		// next, a TCP and login handshake that a loaded machine stretches
		// past the lease (a confirm that waited for one missed its
		// budget: work done but not recorded).
		b.db.SetMaxIdleConns(2*d.workers + 2)
	}
	// One store per worker, each naming its leases, as separate processes
	// would: inspect shows which worker holds a key.
	for i := range d.workers + 1 {
		o := opts
		o.Worker = "worker-" + strconv.Itoa(i)
		if i == 0 {
			o.Worker = "demo-check"
		}
		s, err := b.store(o)
		if err != nil {
			return c.fail("demo", exitUsage, err)
		}
		d.stores = append(d.stores, s)
	}
	d.fault = c.demoFault
	d.terminal = isTerminal(c.stdout)
	d.progressEvery = time.Second
	if d.terminal {
		d.progressEvery = 100 * time.Millisecond
	}
	return d.run(ctx, c.stdout)
}

// isTerminal reports whether w is a terminal, where the progress line is
// redrawn in place; elsewhere (a pipe, a file, a test) it is printed as
// plain lines.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// run runs the demo and writes progress and the report to w. It returns
// exitOK when the ledger agrees with the guarantees, exitFailed otherwise.
func (d *demoRun) run(ctx context.Context, w io.Writer) int {
	var id [4]byte
	_, _ = rand.Read(id[:])
	d.runID = hex.EncodeToString(id[:])
	d.plan = newPlan(d.messages, d.poison, d.dupRate, d.crashRate, d.seed)
	d.ledger = newLedger(d.messages + d.poison)
	d.queue = newQueue(d.plan.order)
	// A message another worker holds is tried again after a sixth of the
	// lease: a crashed holder's lease is taken over within a few retries.
	d.retryDelay = d.lease / 6

	handlers := make([]func(context.Context, int) error, d.workers)
	tokens := make([]int64, d.workers) // each worker's last run's token, for the ledger
	opts := consumer.Options[int]{
		Hook: func(_ context.Context, e consumer.Event) {
			switch e.Kind {
			case consumer.DuplicateSkipped:
				d.ledger.count(func(c *counts) { c.duplicates++ })
			case consumer.LeaseLost:
				d.ledger.count(func(c *counts) { c.leaseLost++ })
			}
		},
		Observer: d.metrics,
	}
	for i := range handlers {
		handlers[i] = consumer.Idempotent(d.stores[i+1], d.key, func(ctx context.Context, m int) error {
			if l, ok := idem.LeaseFrom(ctx); ok {
				tokens[i] = l.Token
			}
			return d.handle(ctx, m)
		}, opts)
	}
	fmt.Fprintf(w, "idem demo: %d messages (%d deliveries planned), %d workers, dup-rate %.2f, crash-rate %.2f, seed %d, lease %v\nstore: %s\n",
		d.messages, len(d.plan.order), d.workers, d.dupRate, d.crashRate, d.seed, d.lease, d.store)
	if d.poison > 0 {
		fmt.Fprintf(w, "poison: %d messages that crash every worker that takes them\n", d.poison)
	}
	if !d.reconcile {
		fmt.Fprintf(w, "reconciling off (--no-reconcile): a take-over applies the effect again without asking the ledger\n")
	}

	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	stopWatch := context.AfterFunc(ctx, d.queue.close)
	defer stopWatch()
	start := time.Now()
	stopProgress := d.progress(w, start)
	var wg sync.WaitGroup
	for i, h := range handlers {
		wg.Go(func() { d.work(ctx, h, &tokens[i]) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	stopProgress()
	d.interrupted = ctx.Err()

	v := d.ledger.check(d.plan, d.reconcile, d.maxTakeOvers+1)
	d.checkRecords(context.WithoutCancel(ctx), v)
	if d.fault != nil {
		d.fault(d.ledger)
		v = d.ledger.check(d.plan, d.reconcile, d.maxTakeOvers+1)
		d.checkRecords(context.WithoutCancel(ctx), v)
	}
	c := d.ledger.snapshot()
	report(w, d, c, v, elapsed)
	fmt.Fprintf(w, "\nmetrics (idem serve shows the same at GET /metrics, in Prometheus format):\n")
	d.metrics.WriteTable(w)
	if d.interrupted != nil || !v.ok(c) {
		return exitFailed
	}
	return exitOK
}

// work is one worker: it takes deliveries until the queue is drained and
// settles each as a broker would (see consumer.Idempotent). *token is the
// token of the lease its handler last ran under, 0 when it did not run.
func (d *demoRun) work(ctx context.Context, h func(context.Context, int) error, token *int64) {
	for {
		m, ok := d.queue.next()
		if !ok {
			return
		}
		d.ledger.count(func(c *counts) { c.deliveries++ })
		*token = 0
		crashed, err := deliver(ctx, h, m)
		if ran := *token; ran != 0 && !crashed {
			how := settledFailed // forgotten, or taken over
			switch {
			case err == nil:
				how = settledDone
			case errors.Is(err, consumer.ErrNotRecorded):
				how = settledUnrecorded
			}
			d.ledger.settled(m, how)
		}
		switch {
		case crashed:
			// The worker died holding the delivery: the broker notices the
			// lost connection and redelivers at once; the key stays claimed
			// by the dead worker until its lease runs out.
			d.queue.redeliver(m, 0)
		case err == nil:
			d.ledger.count(func(c *counts) { c.acked++ })
			d.queue.ack()
		case errors.Is(err, consumer.ErrNotRecorded):
			d.ledger.count(func(c *counts) { c.notRecorded++ })
			d.queue.ack()
		case consumer.ActionFor(err) == consumer.DeadLetter:
			// Quarantined: out of the queue, where an operator finds it
			// (idem resolve, then replay it).
			d.ledger.deadLetter(m)
			d.queue.ack()
		case errors.Is(err, idem.ErrInProgress):
			d.ledger.count(func(c *counts) { c.inProgress++ })
			d.queue.redeliver(m, d.retryDelay)
		default:
			// A store error, or a handler that stopped because its lease
			// was lost: nothing was recorded, so the message goes back.
			d.ledger.count(func(c *counts) { c.storeErrors++ })
			d.queue.redeliver(m, d.retryDelay)
		}
	}
}

// deliver runs h on its own goroutine, so that a crash (runtime.Goexit in
// the handler) ends that goroutine as a dead process would: deferred calls
// run, nothing returns, the lease is neither confirmed nor forgotten.
func deliver(ctx context.Context, h func(context.Context, int) error, m int) (crashed bool, err error) {
	done := make(chan struct{})
	crashed = true
	go func() {
		defer close(done)
		err = h(ctx, m)
		crashed = false
	}()
	<-done
	return crashed, err
}

// handle is the demo's handler, run under the key's lease by
// consumer.Idempotent: it applies message m's effect to the ledger, fenced
// by the lease's token, and crashes where the plan says. Told that its
// claim took the key over from a crashed run, it asks the ledger first
// whether that run's effect landed, and if so leaves it at that: the
// wrapper confirms, and the effect is not applied twice.
func (d *demoRun) handle(ctx context.Context, m int) error {
	l, _ := idem.LeaseFrom(ctx)
	t, tookOver := idem.TakeOverFrom(ctx)
	var prior int64
	if tookOver {
		prior = t.Prior.Token
	}
	n := d.ledger.begin(m, l.Token, tookOver, prior)
	k := d.plan.crashAt(m, n)
	if k == crashBefore {
		d.ledger.crashed(m, l.Token, k)
		runtime.Goexit()
	}
	// A lease lost while the handler ran (a stall) cancels ctx: do not apply
	// an effect that a successor may be applying.
	if err := context.Cause(ctx); err != nil {
		return err
	}
	if tookOver && d.reconcile {
		// The question and the effect are one step, as a conditional write
		// downstream would make them: a worker that stalled past its lease
		// (not crashed) may still apply its effect, and asking first, then
		// applying, would let that land in between and the effect twice.
		d.ledger.applyUnlessLanded(m, l.Token)
	} else {
		d.ledger.apply(m, l.Token)
	}
	if k == crashAfter {
		d.ledger.crashed(m, l.Token, k)
		runtime.Goexit()
	}
	return nil
}

// checkRecords looks up every message's key: after the run each ordinary
// one must hold a confirmed record, each poison one a quarantined record
// with MaxTakeOvers take-overs.
func (d *demoRun) checkRecords(ctx context.Context, v *verdict) {
	v.unconfirmed, v.alerted, v.lookupErrors = 0, 0, 0
	for m := range d.messages + d.poison {
		r, err := d.stores[0].Lookup(ctx, d.key(m))
		if d.plan.poison(m) {
			if err != nil || !r.Quarantined || r.TakeOvers != d.maxTakeOvers {
				if i := slices.Index(v.quarantined, m); i >= 0 {
					v.quarantined = slices.Delete(v.quarantined, i, i+1)
					v.poisonWrong = append(v.poisonWrong, m)
				}
			}
			continue
		}
		switch {
		case err != nil && !errors.Is(err, idem.ErrNotFound):
			v.lookupErrors++
		case err == nil && r.Confirmed:
		case d.ledger.unrecorded(m):
			// Acked as done but not recorded: its work was done once, and
			// the consumer alerted (AckAndAlert); no delivery came after
			// to record it.
			v.alerted++
		default:
			v.unconfirmed++
		}
	}
}

// progress prints a progress line every d.progressEvery until the returned
// stop is called: redrawn in place on a terminal, plain lines elsewhere.
func (d *demoRun) progress(w io.Writer, start time.Time) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	line := func() string {
		c := d.ledger.snapshot()
		return fmt.Sprintf("%d/%d messages done, %d deliveries, %d duplicates skipped, %d crashes, %.1fs",
			c.messagesDone, d.messages, c.deliveries, c.duplicates, c.crashBefore+c.crashAfter, time.Since(start).Seconds())
	}
	wg.Go(func() {
		t := time.NewTicker(d.progressEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				if d.terminal {
					fmt.Fprintf(w, "\r%s\033[K\n", line())
				}
				return
			case <-t.C:
				if d.terminal {
					fmt.Fprintf(w, "\r%s\033[K", line())
				} else {
					fmt.Fprintln(w, line())
				}
			}
		}
	})
	return func() { close(done); wg.Wait() }
}
