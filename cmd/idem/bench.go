package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/cmd/idem/internal/bench"
)

// Files that --out writes.
const (
	benchTableFile = "BENCHMARKS-results.md"
	benchChartFile = "BENCHMARKS-throughput.svg"

	benchConsumerTableFile = "BENCHMARKS-consumer.md"
	benchConsumerChartFile = "BENCHMARKS-consumer.svg"
)

// benchPostgresConns bounds the Postgres pool: the server's default
// max_connections is 100, and at 256 goroutines an unbounded pool would be
// refused connections rather than queue for them.
const benchPostgresConns = 64

const benchAbout = `Measures idem beside what a user would weigh it against, side by side in one
run, on real servers: RedisStore with its defaults first (new keys, replays,
80% duplicates), then each option that changes a figure (NoAutoPipeline, an
idem.Cache, batches of 100), beside plain SET NX PX + SET XX PX, redislock Obtain+Release, a non-atomic GET then SET, the same
on a Redis Cluster; sqlstore lease mode and Run beside plain INSERT ON CONFLICT
+ UPDATE on Postgres; the HTTP middleware's first write and replay beside a
bare handler (ServeHTTP in process, no network). Contenders alternate within
each round; the table gives median messages per second, medians of per-round
ratios, and per message the Redis commands sent and run, allocations and
bytes. It also measures Redis memory per confirmed record and says whether
idem's targets were met. The table goes to stdout, progress to stderr; --out
also writes ` + benchTableFile + ` and ` + benchChartFile + `.

Groups: redis (needs --redis), cluster (--cluster), sql (--postgres),
http (--redis); and, only when named, consumer (--redis, and --amqp for
RabbitMQ's rows): a Redis Streams and a RabbitMQ consumer end to end, each
reading --consumer-msgs messages of which 20% are redeliveries, bare and
through idem's wrapper (per message and batched); --out writes its results to
` + benchConsumerTableFile + ` and ` + benchConsumerChartFile + `. Kafka's is a Go benchmark of
its own module (consumer/kafka: go test -bench Consumer -run '^$').`

func (c *cli) bench(args []string) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	// The stores' flags and variables are the other commands', so that
	// one environment (make services-up's) serves them all.
	var sf storeFlags
	sf.register(fs, c.getenv, benchKinds)
	groups := fs.String("groups", strings.Join(bench.AllGroups, ","), "comma-separated `groups` to run")
	only := fs.String("only", "", "run only the contenders whose name matches this `regexp` (and that --groups selects)")
	rounds := fs.Int("rounds", 5, "rounds per goroutine count")
	duration := fs.Duration("duration", time.Second, "how long each contender runs per round")
	gors := fs.String("goroutines", "1,8,64,256", "comma-separated goroutine `counts`")
	records := fs.Int("records", 100_000, "confirmed records the Redis memory measure writes (0: skip it)")
	costMsgs := fs.Int("cost-msgs", 2000, "messages per contender of the one-goroutine pass that counts commands and allocations")
	out := fs.String("out", "", "also write "+benchTableFile+" and "+benchChartFile+" into this `dir`")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the timed rounds to `file`")
	memprofile := fs.String("memprofile", "", "write an allocation profile of the whole run to `file`")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	amqpURL := fs.String("amqp", c.getenv("IDEM_AMQP_URL"), "RabbitMQ `URL` for the consumer group (default $IDEM_AMQP_URL; none: Redis Streams only)")
	consumerMsgs := fs.Int("consumer-msgs", 20_000, "messages per contender per round of the consumer group")
	brokerPID := fs.Int("broker-pid", 0, "RabbitMQ's `pid` (its beam.smp), whose CPU the consumer group reads (0: the one beam.smp running, if one; -1: none)")
	pos, done, st := c.parse(fs, args, "[flags]", benchAbout+"\n\n"+envHelp(benchKinds))
	if done {
		return st
	}
	if len(pos) > 0 {
		return c.noArgs("bench", pos)
	}

	// Everything that can be wrong with the flags is said before any I/O.
	cfg := bench.Config{Rounds: *rounds, Duration: *duration, CostMsgs: *costMsgs, MemoryRecords: *records}
	if *records == 0 {
		cfg.MemoryRecords = -1
	}
	if *records < 0 || *costMsgs < 1 {
		return c.usageError("bench", errors.New("--records and --cost-msgs must not be negative, --cost-msgs at least 1"))
	}
	if *rounds < 1 || *duration <= 0 {
		return c.usageError("bench", errors.New("--rounds must be at least 1 and --duration positive"))
	}
	for _, s := range strings.Split(*gors, ",") {
		g, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || g < 1 || g > 10_000 {
			return c.usageError("bench", fmt.Errorf("--goroutines: %q is not a count from 1 to 10000", s))
		}
		cfg.Goroutines = append(cfg.Goroutines, g)
	}
	slices.Sort(cfg.Goroutines)
	cfg.Goroutines = slices.Compact(cfg.Goroutines)
	runConsumer := false
	for _, g := range strings.Split(*groups, ",") {
		g = strings.TrimSpace(g)
		if g == bench.GroupConsumer {
			runConsumer = true
			continue
		}
		if !slices.Contains(bench.AllGroups, g) {
			return c.usageError("bench", fmt.Errorf("--groups: unknown group %q (have %s, %s)", g, strings.Join(bench.AllGroups, ", "), bench.GroupConsumer))
		}
		cfg.Groups = append(cfg.Groups, g)
	}
	if *consumerMsgs < 1 {
		return c.usageError("bench", errors.New("--consumer-msgs must be at least 1"))
	}
	ccfg := bench.ConsumerConfig{Msgs: *consumerMsgs, Rounds: *rounds}
	if *only != "" {
		re, err := regexp.Compile(*only)
		if err != nil {
			return c.usageError("bench", fmt.Errorf("--only: %w", err))
		}
		cfg.Only = re.MatchString
		ccfg.Only = re.MatchString
	}
	var tg benchTargets
	needs := cfg.Groups
	if runConsumer {
		needs = append(slices.Clone(needs), bench.GroupRedis)
	}
	for _, g := range needs {
		var (
			name, v string
			err     error
		)
		switch g {
		case bench.GroupRedis, bench.GroupHTTP:
			name, v = "--redis", sf.redisAddr
			if v != "" && tg.redis == nil {
				tg.redis, err = parseRedisAddr(name, v)
				if !givenFlags(fs)["redis"] {
					c.noteOldRedisEnv("bench", &sf)
				}
			}
		case bench.GroupCluster:
			name, v = "--cluster", sf.cluster
			if v != "" {
				tg.cluster, err = parseClusterAddrs(name, v)
			}
		case bench.GroupSQL:
			name, v = "--postgres", sf.postgres
			tg.postgres = v
			if v != "" && postgresDriver == "" {
				err = fmt.Errorf("--postgres: this idem was built with -tags %s, without the Postgres driver; build it without that tag", tagNoPostgres)
			}
		}
		if err != nil {
			return c.usageError("bench", err)
		}
		if v == "" {
			return c.usageError("bench", fmt.Errorf("the groups %s need %s (or its environment variable)", *groups, name))
		}
	}
	if !*quiet {
		cfg.Progress = func(format string, args ...any) { fmt.Fprintf(c.stderr, format+"\n", args...) }
		ccfg.Progress = cfg.Progress
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	env, closeEnv, err := openBenchEnv(ctx, tg)
	if err != nil {
		return c.fail("bench", exitUsage, err)
	}
	defer closeEnv()

	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return c.fail("bench", exitUsage, err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return c.fail("bench", exitUsage, err)
		}
		defer pprof.StopCPUProfile()
	}
	if runConsumer {
		rep, err := bench.RunConsumer(ctx, bench.ConsumerEnv{Redis: env.Redis, AMQP: *amqpURL, BrokerPID: *brokerPID}, ccfg)
		if err != nil {
			return c.fail("bench", exitFailed, err)
		}
		if err := rep.WriteMarkdown(c.stdout); err != nil {
			return c.fail("bench", exitFailed, err)
		}
		if *out != "" {
			if err := writeFiles(*out, benchConsumerTableFile, rep.WriteMarkdown, benchConsumerChartFile, rep.WriteSVG); err != nil {
				return c.fail("bench", exitFailed, err)
			}
			fmt.Fprintf(c.stderr, "wrote %s and %s in %s\n", benchConsumerTableFile, benchConsumerChartFile, *out)
		}
		if len(cfg.Groups) == 0 {
			return exitOK
		}
	}
	rep, err := bench.Run(ctx, env, bench.Contenders, cfg)
	if err != nil {
		return c.fail("bench", exitFailed, err)
	}
	if *memprofile != "" {
		if err := writeHeapProfile(*memprofile); err != nil {
			return c.fail("bench", exitFailed, err)
		}
	}
	if err := rep.WriteMarkdown(c.stdout, bench.DefaultTargets); err != nil {
		return c.fail("bench", exitFailed, err)
	}
	if *out != "" {
		if err := writeBenchFiles(rep, *out); err != nil {
			return c.fail("bench", exitFailed, err)
		}
		fmt.Fprintf(c.stderr, "wrote %s and %s in %s\n", benchTableFile, benchChartFile, *out)
	}
	return exitOK
}

// benchKinds are the stores bench measures.
const benchKinds = kindRedis | kindCluster | kindPostgres

// benchTargets are the servers the selected groups need, parsed from the
// flags; nil or "" for those no group needs.
type benchTargets struct {
	redis    *redis.Options
	cluster  *redis.ClusterOptions
	postgres string
}

// openBenchEnv connects to the servers tg names and checks that they
// answer.
func openBenchEnv(ctx context.Context, tg benchTargets) (bench.Env, func(), error) {
	var (
		env     bench.Env
		closers []func()
	)
	closeAll := func() {
		for _, f := range slices.Backward(closers) {
			f()
		}
	}
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	fail := func(err error) (bench.Env, func(), error) { closeAll(); return bench.Env{}, nil, err }
	if tg.redis != nil {
		env.Redis = redis.NewClient(tg.redis)
		closers = append(closers, func() { _ = env.Redis.Close() })
		if err := env.Redis.Ping(ctx).Err(); err != nil {
			return fail(fmt.Errorf("cannot reach Redis at %s: %w", tg.redis.Addr, err))
		}
	}
	if tg.cluster != nil {
		env.Cluster = redis.NewClusterClient(tg.cluster)
		closers = append(closers, func() { _ = env.Cluster.Close() })
		if err := env.Cluster.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return m.Ping(ctx).Err() }); err != nil {
			return fail(fmt.Errorf("cannot reach the Redis Cluster at %s: %w", strings.Join(tg.cluster.Addrs, ","), err))
		}
	}
	if tg.postgres != "" {
		db, err := sql.Open(postgresDriver, tg.postgres)
		if err != nil {
			return fail(fmt.Errorf("--postgres: %w", err))
		}
		db.SetMaxOpenConns(benchPostgresConns)
		db.SetMaxIdleConns(benchPostgresConns)
		env.DB = db
		closers = append(closers, func() { _ = db.Close() })
		if err := db.PingContext(ctx); err != nil {
			return fail(fmt.Errorf("cannot reach Postgres: %w", err))
		}
	}
	return env, closeAll, nil
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC() // up-to-date statistics
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// writeBenchFiles writes the markdown table and the chart into dir.
func writeBenchFiles(rep *bench.Report, dir string) error {
	return writeFiles(dir, benchTableFile, func(w io.Writer) error { return rep.WriteMarkdown(w, bench.DefaultTargets) },
		benchChartFile, rep.WriteSVG)
}

// writeFiles writes a table and a chart into dir.
func writeFiles(dir, table string, writeTable func(io.Writer) error, chart string, writeChart func(io.Writer) error) error {
	write := func(name string, w func(io.Writer) error) error {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		if err := w(f); err != nil {
			_ = f.Close()
			return err
		}
		return f.Close()
	}
	if err := write(table, writeTable); err != nil {
		return err
	}
	return write(chart, writeChart)
}
