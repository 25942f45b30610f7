// Package bench measures idem beside the alternatives a user would weigh it
// against — plain Redis commands, a lock library, a non-atomic
// check-then-set, plain SQL, a bare HTTP handler — on real servers, side by
// side in one run. `idem bench` (cmd/idem) and `make bench` drive it.
//
// # Method
//
// Each contender is one entry of [Contenders]. For every goroutine count,
// Run measures every selected contender once per round, for a fixed
// duration, in an order that rotates from round to round, so that a change
// in the machine's load falls on all of them alike. A contender's
// throughput is the median over rounds; a ratio between two contenders is
// the median of the per-round ratios (both measured in the same round,
// seconds apart), which is steadier than a ratio of medians on a noisy
// machine.
//
// Each round starts from a Redis without the run's records: after every
// round of a contender that talks to Redis, Run unlinks every key the run
// has written (outside the timed window and the CPU reading). Otherwise the
// records of one round would expire during a later round, the retention
// later, and that round would be charged Redis CPU for another contender's
// work. What expiry itself costs is measured apart, by the memory pass.
//
// Apart from the timed rounds, a cost pass runs each contender on one
// goroutine, on clients with a counting hook, and reads what a message
// costs: commands and round trips sent (the hook), commands Redis ran
// (INFO commandstats delta, which also counts the commands a Lua script
// calls), and heap allocations (runtime.MemStats delta: the whole
// process's, which on one busy goroutine is the contender's and its
// client's). A memory pass writes confirmed records and reads Redis's
// used_memory before and after.
//
// The timed rounds of a contender that talks to Redis also read the
// server's CPU time (INFO cpu, used_cpu_user + used_cpu_sys, summed over a
// cluster's masters) before and after, for the Redis CPU each message cost
// at each goroutine count; every timed round also reads this process's
// CPU time (getrusage) for the client's CPU per message: the whole
// process's, so also the runtime's and the kernel's loopback work, part of
// which the sending side pays for the receiving one (see Row.ClientCPU).
// Client and server share the machine, so when contenders are CPU-bound
// these figures, steadier than throughput, say roughly where the time
// goes.
//
// RunConsumer (group consumer, consumer.go; its contenders per broker in
// consumerstream.go and consumeramqp.go, its report in consumerreport.go)
// measures apart, with a loop of its own: a fixed number of messages per
// round read from a real broker, bare and through idem's consumer wrappers.
package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/redisadmin"
)

// Groups of contenders, selectable on their own; each needs the service
// its name says (http runs on the standalone Redis).
const (
	GroupRedis   = "redis"
	GroupCluster = "cluster"
	GroupSQL     = "sql"
	GroupHTTP    = "http"
)

// AllGroups are the groups in the order the report lists them.
var AllGroups = []string{GroupRedis, GroupCluster, GroupSQL, GroupHTTP}

// Env is what the contenders run against. A field a selected group needs
// must be set (see Config.check); the others may be nil.
type Env struct {
	Redis   *redis.Client        // a standalone Redis: groups redis and http
	Cluster *redis.ClusterClient // a Redis Cluster: group cluster
	DB      *sql.DB              // Postgres: group sql

	prefix string // makes this run's keys and tables its own
	seq    *atomic.Uint64
}

// Key returns a key no other operation of this run uses, beginning with
// tag, so that contenders never find each other's records.
func (e *Env) Key(tag string) string {
	return e.prefix + tag + ":" + strconv.FormatUint(e.seq.Add(1), 36)
}

// Name returns a name unique to this run (a table name, a key prefix):
// letters, digits and underscores only.
func (e *Env) Name(tag string) string {
	return "idembench_" + e.prefix[:len(e.prefix)-1] + "_" + tag
}

// clean unlinks every key this run has written on the Redis that group
// talks to, or on both when group is "": each key holds e.prefix, which no
// other program's key does.
func (e *Env) clean(ctx context.Context, group string) error {
	var cs []redis.UniversalClient
	if e.Redis != nil && group != GroupCluster {
		cs = append(cs, e.Redis)
	}
	if e.Cluster != nil && (group == "" || group == GroupCluster) {
		cs = append(cs, e.Cluster)
	}
	for _, c := range cs {
		if _, err := redisadmin.Unlink(ctx, c, "*"+e.prefix+"*"); err != nil {
			return fmt.Errorf("bench: deleting the run's keys: %w", err)
		}
	}
	return nil
}

// Op handles one unit of work: a message, a batch of Contender.Msgs
// messages, or a request. A non-nil error ends the run: a contender that
// fails is not measured.
type Op func(ctx context.Context) error

// Instance is a contender set up against an Env.
type Instance struct {
	// Worker returns the Op of one goroutine; each goroutine of a round
	// (or warm-up, or cost pass) calls it once, before any Op of that
	// round runs and before the round's clocks and CPU readings start,
	// and keeps its own state (a batch's buffers, a replayed key). State in Redis must not outlive the round: the run's keys are
	// unlinked between rounds.
	Worker func() Op
	// Close releases what Open created (tables, connections). Optional.
	Close func() error
}

// Contender is one way of doing the work, measured beside the others.
// Adding one is adding an entry to Contenders.
type Contender struct {
	Name  string // unique: the row of the table, the line of the chart
	Group string // one of the Group constants
	// Msgs is how many messages (or requests) one Op handles; throughput
	// is reported per message. 0 means 1.
	Msgs int
	// Versus names the contenders this one is divided by, each a ratio
	// row of the table. They must be in the same group or run beside it.
	Versus []string
	// Redis reports whether the contender talks to its group's Redis: the
	// cost pass reads Redis's command counts for it, its rounds read
	// Redis's CPU, and after each of its rounds the run's keys there are
	// unlinked.
	Redis bool
	// Open sets the contender up; it is called once for the timed rounds
	// and once, on counting clients, for the cost pass.
	Open func(ctx context.Context, e *Env) (*Instance, error)
}

func (c *Contender) msgs() int { return max(1, c.Msgs) }

// Target is a figure the report says was met or not.
type Target struct {
	What       string // as the report says it
	Contender  string
	Versus     string
	Goroutines int
	Min        float64 // the ratio must be at least this
}

// Config is one run.
type Config struct {
	Groups     []string               // default AllGroups
	Only       func(name string) bool // further selects contenders by name; nil: all
	Goroutines []int                  // default 1, 8, 64, 256
	Rounds     int                    // default 5
	Duration   time.Duration          // per contender per round; default 1s
	Warmup     time.Duration          // once per contender before the rounds; default Duration/4
	CostMsgs   int                    // messages of the cost pass per contender; default 2000
	// MemoryRecords is how many confirmed records the memory pass writes
	// (group redis); 0 means 100,000, negative skips the pass.
	MemoryRecords int
	// ExpireSpread is how long the memory pass's records take to expire,
	// evenly spaced, when it measures what expiry costs; default 2s
	// (100,000 records over 2s is the rate of the busiest contenders).
	ExpireSpread time.Duration
	// Progress, when set, is told of each measurement as it finishes.
	Progress func(format string, args ...any)
}

func (c *Config) withDefaults() Config {
	o := *c
	if len(o.Groups) == 0 {
		o.Groups = AllGroups
	}
	if len(o.Goroutines) == 0 {
		o.Goroutines = []int{1, 8, 64, 256}
	}
	if o.Rounds == 0 {
		o.Rounds = 5
	}
	if o.Duration == 0 {
		o.Duration = time.Second
	}
	if o.Warmup == 0 {
		o.Warmup = o.Duration / 4
	}
	if o.CostMsgs == 0 {
		o.CostMsgs = 2000
	}
	if o.ExpireSpread <= 0 {
		o.ExpireSpread = 2 * time.Second
	}
	if o.MemoryRecords == 0 {
		o.MemoryRecords = 100_000
	}
	if o.Progress == nil {
		o.Progress = func(string, ...any) {}
	}
	return o
}

// check refuses a configuration before any I/O.
func (c *Config) check(e *Env) error {
	if c.Rounds < 1 {
		return fmt.Errorf("bench: rounds must be at least 1, not %d", c.Rounds)
	}
	if c.Duration < 0 || c.Warmup < 0 {
		return errors.New("bench: negative duration")
	}
	for _, g := range c.Goroutines {
		if g < 1 || g > 10_000 {
			return fmt.Errorf("bench: goroutines must be 1 to 10000, not %d", g)
		}
	}
	for _, g := range c.Groups {
		if !slices.Contains(AllGroups, g) {
			return fmt.Errorf("bench: unknown group %q (have %v)", g, AllGroups)
		}
		switch {
		case (g == GroupRedis || g == GroupHTTP) && e.Redis == nil:
			return fmt.Errorf("bench: group %s needs a standalone Redis", g)
		case g == GroupCluster && e.Cluster == nil:
			return fmt.Errorf("bench: group %s needs a Redis Cluster", g)
		case g == GroupSQL && e.DB == nil:
			return fmt.Errorf("bench: group %s needs Postgres", g)
		}
	}
	return nil
}

// selected returns the contenders of cs that c selects, in table order.
func (c *Config) selected(cs []Contender) []Contender {
	var out []Contender
	for _, g := range AllGroups {
		if !slices.Contains(c.Groups, g) {
			continue
		}
		for _, x := range cs {
			if x.Group == g && (c.Only == nil || c.Only(x.Name)) {
				out = append(out, x)
			}
		}
	}
	return out
}

// Run measures the contenders cs (normally Contenders) that cfg selects,
// against e, and returns the report. Redis memory is measured first, on a
// Redis that the timed rounds have not yet filled with expiring keys.
func Run(ctx context.Context, e Env, cs []Contender, cfg Config) (*Report, error) {
	cfg = cfg.withDefaults()
	if err := cfg.check(&e); err != nil {
		return nil, err
	}
	sel := cfg.selected(cs)
	if len(sel) == 0 {
		return nil, errors.New("bench: no contender selected")
	}
	for _, c := range sel {
		if c.Open == nil || c.Name == "" {
			return nil, fmt.Errorf("bench: contender %q has no name or no Open", c.Name)
		}
	}
	e.prefix = fmt.Sprintf("b%010x_", time.Now().UnixNano()&0xffffffffff)
	e.seq = new(atomic.Uint64)
	// A run leaves no key behind, whichever way it ends.
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := e.clean(ctx, ""); err != nil {
			cfg.Progress("%v", err)
		}
	}()
	rep := &Report{Config: cfg, Machine: machine(ctx, &e), Started: time.Now()}

	if slices.Contains(cfg.Groups, GroupRedis) && cfg.MemoryRecords > 0 {
		m, err := measureMemory(ctx, e.Redis, cfg.MemoryRecords, cfg.ExpireSpread)
		if err != nil {
			return nil, fmt.Errorf("bench: memory per record: %w", err)
		}
		rep.Memory = m
		cfg.Progress("memory: %.1f bytes per confirmed record (used_memory), %.1f (MEMORY USAGE)", m.UsedMemory, m.MemoryUsage)
	}

	rows := make([]*Row, len(sel))
	insts := make([]*Instance, len(sel))
	defer func() {
		for _, in := range insts {
			if in != nil && in.Close != nil {
				_ = in.Close()
			}
		}
	}()
	for i, c := range sel {
		rows[i] = &Row{Name: c.Name, Group: c.Group, Msgs: c.msgs(), Rounds: make([][]float64, len(cfg.Goroutines)),
			ServerCPURounds: make([][]float64, len(cfg.Goroutines)), ClientCPURounds: make([][]float64, len(cfg.Goroutines))}
		in, err := c.Open(ctx, &e)
		if err != nil {
			return nil, fmt.Errorf("bench: %s: %w", c.Name, err)
		}
		insts[i] = in
		if _, _, err := throughput(ctx, workers(in, 8), c.msgs(), cfg.Warmup); err != nil {
			return nil, fmt.Errorf("bench: %s (warm-up): %w", c.Name, err)
		}
	}
	if err := e.clean(ctx, ""); err != nil {
		return nil, err
	}
	for gi, g := range cfg.Goroutines {
		for r := range cfg.Rounds {
			for k := range sel {
				i := (k + r) % len(sel) // rotate: nobody always runs first
				var (
					cpu0 time.Duration
					err  error
				)
				// Each goroutine's setup (a key to replay, hot keys) is
				// done before the clocks start: it is not the work measured.
				ws := workers(insts[i], g)
				if sel[i].Redis {
					if cpu0, err = serverCPU(ctx, &e, sel[i].Group); err != nil {
						return nil, fmt.Errorf("bench: %s: %w", sel[i].Name, err)
					}
				}
				own0, ownOK := processCPU()
				tp, n, err := throughput(ctx, ws, sel[i].msgs(), cfg.Duration)
				if err != nil {
					return nil, fmt.Errorf("bench: %s at %d goroutines: %w", sel[i].Name, g, err)
				}
				own1, _ := processCPU()
				rows[i].Rounds[gi] = append(rows[i].Rounds[gi], tp)
				if ownOK && n > 0 {
					rows[i].ClientCPURounds[gi] = append(rows[i].ClientCPURounds[gi], float64(own1-own0)/float64(time.Microsecond)/float64(n))
				}
				if sel[i].Redis {
					cpu1, err := serverCPU(ctx, &e, sel[i].Group)
					if err != nil {
						return nil, fmt.Errorf("bench: %s: %w", sel[i].Name, err)
					}
					if n > 0 {
						rows[i].ServerCPURounds[gi] = append(rows[i].ServerCPURounds[gi], float64(cpu1-cpu0)/float64(time.Microsecond)/float64(n))
					}
					if err := e.clean(ctx, sel[i].Group); err != nil {
						return nil, err
					}
				}
				cfg.Progress("g=%d round %d/%d %-40s %10.0f msgs/s", g, r+1, cfg.Rounds, sel[i].Name, tp)
			}
		}
	}
	for i, c := range sel {
		cost, err := measureCost(ctx, &e, c, cfg.CostMsgs)
		if err != nil {
			return nil, fmt.Errorf("bench: %s (cost pass): %w", c.Name, err)
		}
		rows[i].Cost = cost
	}
	rep.Rows = rows
	rep.summarize(sel)
	return rep, nil
}

// workers returns the Ops of g goroutines of in.
func workers(in *Instance, g int) []Op {
	ws := make([]Op, g)
	for i := range ws {
		ws[i] = in.Worker()
	}
	return ws
}

// throughput runs each of workers on a goroutine of its own for d and
// returns messages per second and the messages handled.
func throughput(ctx context.Context, workers []Op, msgs int, d time.Duration) (float64, int64, error) {
	var (
		stop  atomic.Bool
		ops   atomic.Int64
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	start := time.Now()
	t := time.AfterFunc(d, func() { stop.Store(true) })
	defer t.Stop()
	for _, op := range workers {
		wg.Go(func() {
			n := int64(0)
			for !stop.Load() {
				if err := op(ctx); err != nil {
					once.Do(func() { first = err })
					stop.Store(true)
					break
				}
				n++
			}
			ops.Add(n)
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if first != nil {
		return 0, 0, first
	}
	n := ops.Load() * int64(msgs)
	return float64(n) / elapsed.Seconds(), n, nil
}

// machine describes where the run happens, for the report.
func machine(ctx context.Context, e *Env) string {
	s := fmt.Sprintf("%s/%s, %d CPUs (GOMAXPROCS %d), %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version())
	if e.Redis != nil {
		if info, err := e.Redis.Info(ctx, "server").Result(); err == nil {
			if product, v := redisadmin.ServerIdentity(info); v != "" {
				s += ", " + product + " " + v
			}
		}
	}
	if e.DB != nil {
		var v string
		if err := e.DB.QueryRowContext(ctx, "SHOW server_version").Scan(&v); err == nil {
			s += ", Postgres " + v
		}
	}
	return s
}
