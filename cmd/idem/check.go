package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/redisadmin"
	"github.com/idemgo/idem/sqlstore"
	"github.com/idemgo/idem/storetest"
)

const checkAbout = `Certifies a Redis (a single one, a Redis Cluster, or Sentinel's master) for
idem, on keys of a throwaway prefix under --prefix that it deletes when done:

  probe        the checks a store makes on first contact (RedisStore.Check):
               scripts load and run, TIME in a script advances, SET NX PX is
               exclusive with its TTL, maxmemory-policy is noeviction, every
               cluster slot is served
  conformance  every check of the storetest suite, the contract of package
               idem, each reported pass, fail (with the reason) or skip;
               Linearizable runs short porcupine histories of concurrent calls
  latency      PING, and Claim+Confirm one after another (--ops of them)
  Redis CPU    used_cpu_sys+used_cpu_user of INFO cpu over those calls,
               divided by their number (other clients' load included)

TLS: a rediss:// URL. An ACL user needs the store's commands (see the README)
and +ping; without SCAN and UNLINK the throwaway keys are left to expire,
within a minute.

--postgres DSN or --mysql DSN (MySQL 8, MariaDB 10.11+) certify a SQL database
instead, on throwaway tables named after --table that it drops when done: the
probe creates one (sqlstore's DDL) and claims, confirms and reads a key in
it; the conformance suite runs each check on a table of its own; latency
times Claim+Confirm (no server CPU is read).

Exit status: 0 every check passed, 1 a check failed, 2 a usage error or an
unreachable server.`

// checkKinds are the stores idem check certifies: Redis, on its own or as
// a cluster, with --prefix under which its throwaway prefix is made, and
// the SQL servers, with --table after which its throwaway tables are named.
const checkKinds = kindRedis | kindCluster | kindPostgres | kindMySQL | kindNames

// checkRetention is the retention of the records idem check writes
// outside the suite: should the cleanup fail, they go within it.
const checkRetention = time.Minute

func (c *cli) check(args []string) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	var sf storeFlags
	sf.register(fs, c.getenv, checkKinds)
	sentinel := fs.String("sentinel", "", "Redis Sentinels, `ADDRS`: "+clusterForms+" (a URL's user and password are the master's); with --master")
	master := fs.String("master", "", "the `name` of the master the Sentinels watch (with --sentinel)")
	ops := fs.Int("ops", 1000, "how many Claim+Confirm to time and to divide Redis CPU by")
	timeout := fs.Duration("timeout", 5*time.Minute, "stop after this long")
	pos, done, st := c.parse(fs, args, "--redis URL | --cluster ADDRS | --sentinel ADDRS --master NAME | --postgres DSN | --mysql DSN [--prefix P | --table T] [--ops N]", checkAbout+"\n\n"+envHelp(checkKinds))
	if done {
		return st
	}
	if len(pos) > 0 {
		return c.noArgs("check", pos)
	}
	if *ops < 1 {
		return c.usageError("check", fmt.Errorf("--ops %d: want at least 1", *ops))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	var (
		b   *backend
		err error
	)
	if *sentinel != "" || *master != "" {
		b, err = openSentinel(ctx, fs, *sentinel, *master, sf.prefix)
	} else {
		b, err = c.openCheck(ctx, fs, &sf)
	}
	if errors.Is(err, errUsage) {
		return c.usageError("check", err)
	}
	if err != nil {
		return c.fail("check", exitUsage, err)
	}
	defer b.close()
	if b.isSQL() {
		return (&sqlChecker{cli: c, b: b, ops: *ops, base: throwawayTable(b.table)}).run(ctx)
	}
	k := &checker{cli: c, b: b, ops: *ops, prefix: throwawayPrefix(b.prefix)}
	return k.run(ctx)
}

// errUsage marks the errors of openCheck and openSentinel that are the
// user's, before any I/O.
var errUsage = errors.New("usage")

// usage wraps err as errUsage, keeping err's message alone.
type usage struct{ error }

func (u usage) Is(target error) bool { return target == errUsage }

// openCheck opens the Redis or Redis Cluster of the store flags.
func (c *cli) openCheck(ctx context.Context, fs *flag.FlagSet, sf *storeFlags) (*backend, error) {
	if err := c.chooseStore("check", fs, sf); err != nil {
		return nil, usage{err}
	}
	if sf.kind == "" {
		return nil, usage{errors.New("no server given: use --redis, --cluster, --postgres or --mysql (or their environment variables), or --sentinel with --master")}
	}
	if sf.kind == "postgres" || sf.kind == "mysql" {
		if _, err := sqlstore.SchemaDDL(sqlstore.Postgres, throwawayTable(sf.table)+"_0000"); err != nil {
			return nil, usage{fmt.Errorf("--table %q: too long or not a plain identifier for the throwaway tables named after it (%s_check_XXXXXXXX_N)", sf.table, sf.table)}
		}
		return sf.open(ctx, false, false)
	}
	if strings.ContainsAny(sf.prefix, "{}") {
		return nil, usage{fmt.Errorf("--prefix %q must not contain '{' or '}' (the hash tag after it is idem's)", sf.prefix)}
	}
	return sf.open(ctx, false, false)
}

// openSentinel opens the master that the Sentinels at addrs watch under
// the name master. A store flag given with it is a usage error; one from
// the environment yields to it.
func openSentinel(ctx context.Context, fs *flag.FlagSet, addrs, master, prefix string) (*backend, error) {
	given := givenFlags(fs)
	switch {
	case given["redis"] || given["cluster"] || given["postgres"] || given["mysql"]:
		return nil, usage{errors.New("give one of --redis, --cluster, --postgres, --mysql and --sentinel")}
	case addrs == "":
		return nil, usage{errors.New("--master without --sentinel: give the Sentinels' addresses")}
	case master == "":
		return nil, usage{errors.New("--sentinel without --master: give the name of the master the Sentinels watch")}
	case strings.ContainsAny(prefix, "{}"):
		return nil, usage{fmt.Errorf("--prefix %q must not contain '{' or '}' (the hash tag after it is idem's)", prefix)}
	}
	co, err := parseClusterAddrs("--sentinel", addrs)
	if err != nil {
		return nil, usage{err}
	}
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: master, SentinelAddrs: co.Addrs,
		Username: co.Username, Password: co.Password, TLSConfig: co.TLSConfig})
	b := &backend{redis: c, prefix: prefix, desc: fmt.Sprintf("Redis master %q of the Sentinels at %s", master, strings.Join(co.Addrs, ","))}
	b.closers = append(b.closers, func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		b.close()
		return nil, fmt.Errorf("cannot reach %s: %w", b.desc, err)
	}
	return b, nil
}

// throwawayPrefix is a prefix of idem check's own under prefix, so that an
// ACL user allowed prefix's keys may run it.
func throwawayPrefix(prefix string) string {
	var r [4]byte
	_, _ = rand.Read(r[:])
	return prefix + "check-" + hex.EncodeToString(r[:]) + ":"
}

// checker is one run of idem check.
type checker struct {
	*cli
	b      *backend
	ops    int
	prefix string
	failed []string // the names of the checks that failed
}

// verdict prints one line of the report: a check's name, its verdict and
// what it found.
func (k *checker) verdict(name, verdict, detail string) {
	fmt.Fprintf(k.stdout, "%-13s %-5s %s\n", name, verdict, detail)
	if verdict == "FAIL" {
		k.failed = append(k.failed, name)
	}
}

func (k *checker) run(ctx context.Context) int {
	fmt.Fprintf(k.stdout, "idem check: %s (%s), throwaway prefix %s\n\n", k.b.desc, serverVersion(ctx, k.b.redis), k.prefix)
	if k.probe(ctx) {
		k.conformance(ctx)
		k.perf(ctx)
	} else {
		k.verdict("conformance", "skip", "the probe failed: every call would fail with its finding")
	}
	k.cleanup()
	if len(k.failed) > 0 {
		fmt.Fprintf(k.stdout, "\nidem check: FAIL (%s)\n", strings.Join(k.failed, ", "))
		return exitFailed
	}
	fmt.Fprintf(k.stdout, "\nidem check: PASS\n")
	return exitOK
}

// store opens a RedisStore on the throwaway prefix (or under it), whose
// warnings go to log.
func (k *checker) store(prefix string, o idem.Options, log io.Writer) (*idem.RedisStore, error) {
	ro := idem.RedisOptionsFrom(o)
	ro.Prefix = prefix
	if log != nil {
		ro.Logger = slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{
			ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
				if a.Key == slog.TimeKey || a.Key == slog.LevelKey {
					return slog.Attr{}
				}
				return a
			}}))
	}
	return idem.NewRedisStore(k.b.redis, ro)
}

// probe runs the checks of first contact and reports whether they passed.
func (k *checker) probe(ctx context.Context) bool {
	var warnings syncBuffer
	s, err := k.store(k.prefix, idem.Options{}, &warnings)
	if err != nil {
		k.verdict("probe", "FAIL", err.Error())
		return false
	}
	if err := s.Check(ctx); err != nil {
		k.verdict("probe", "FAIL", oneLine(err.Error()))
		return false
	}
	policy := "maxmemory-policy " + or(evictionPolicy(ctx, k.b.redis), "unknown")
	k.verdict("probe", "pass", "scripts loaded, TIME advancing, SET NX PX exclusive with its TTL, "+policy)
	for _, w := range strings.Split(strings.TrimSpace(warnings.String()), "\n") {
		// msg="..." error=...: the message unquoted, its attributes after.
		if rest, ok := strings.CutPrefix(w, "msg="); ok {
			if q, err := strconv.QuotedPrefix(rest); err == nil {
				msg, _ := strconv.Unquote(q)
				w = strings.TrimSpace(msg + " " + rest[len(q):])
			}
		}
		if w != "" {
			k.verdict("", "warn", w)
		}
	}
	return true
}

// evictionPolicy reads maxmemory-policy from INFO memory (of one node of a
// cluster: the probe checked every master), "" when it cannot.
func evictionPolicy(ctx context.Context, c redis.UniversalClient) string {
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return ""
	}
	v, _ := redisadmin.InfoValue(info, "maxmemory_policy")
	return v
}

// serverVersion names the server's product and version, from INFO server.
func serverVersion(ctx context.Context, c redis.UniversalClient) string {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return "version unknown: INFO refused"
	}
	product, v := redisadmin.ServerIdentity(info)
	return product + " " + or(v, "version unknown")
}

// conformance runs the storetest suite, each check under a prefix of its
// own, and reports each check.
func (k *checker) conformance(ctx context.Context) {
	var seq atomic.Int64 // numbers each check's prefix
	start := time.Now()
	results := storetest.Check(ctx, func(string) (storetest.Backend, error) {
		return k.suiteBackend(k.prefix + strconv.FormatInt(seq.Add(1), 10) + ":"), nil
	})
	k.conformanceReport(results, start)
}

// conformanceReport reports the suite's results, begun at start: a line in
// all, then one per check.
func (k *checker) conformanceReport(results []storetest.Result, start time.Time) {
	var pass, fail, skip int
	for _, r := range results {
		switch {
		case r.Failed:
			fail++
		case r.Skipped:
			skip++
		default:
			pass++
		}
	}
	verdict := "pass"
	if fail > 0 {
		verdict = "FAIL"
	}
	k.verdict("conformance", verdict, fmt.Sprintf("%d passed, %d failed, %d skipped of %d storetest checks in %v",
		pass, fail, skip, len(results), time.Since(start).Round(100*time.Millisecond)))
	for _, r := range results {
		line := fmt.Sprintf("  %-38s %6v", r.Name, r.Elapsed.Round(time.Millisecond))
		switch {
		case r.Failed:
			fmt.Fprintf(k.stdout, "  FAIL %s\n", line)
			for _, o := range r.Output {
				fmt.Fprintf(k.stdout, "         %s\n", oneLine(o))
			}
		case r.Skipped:
			fmt.Fprintf(k.stdout, "  skip %s  %s\n", line, oneLine(strings.Join(r.Output, "; ")))
		default:
			last := ""
			if len(r.Output) > 0 {
				// Linearizable's tally, less its advice to go test's
				// flags.
				said, _, _ := strings.Cut(r.Output[len(r.Output)-1], " (seed")
				last = "  " + oneLine(said)
			}
			fmt.Fprintf(k.stdout, "  pass %s%s\n", line, last)
		}
	}
}

// suiteBackend is a storetest backend on the server under prefix.
func (k *checker) suiteBackend(prefix string) storetest.Backend {
	c := k.b.redis
	// Names the records' keys as the stores under prefix do; sends nothing.
	namer, err := idem.NewRedisStore(c, idem.RedisOptions{Prefix: prefix})
	return storetest.Backend{
		Open: func(o idem.Options) (idem.Store, error) { return k.store(prefix, o, nil) },
		// What forget.lua leaves: "1F<token>", for a lease.
		PlantForgotten: func(key string, token int64) error {
			if err != nil {
				return err
			}
			return c.Set(context.Background(), namer.RecordKey(key), "1F"+strconv.FormatInt(token, 10), time.Minute).Err()
		},
	}
}

// perf times PING and k.ops Claim+Confirm, one after another, and divides
// the Redis CPU they took by their number.
func (k *checker) perf(ctx context.Context) {
	s, err := k.store(k.prefix+"perf:", idem.Options{Retention: checkRetention}, nil)
	if err != nil {
		k.verdict("latency", "FAIL", err.Error())
		return
	}
	var pings []time.Duration
	for range 100 {
		t0 := time.Now()
		if err := k.b.redis.Ping(ctx).Err(); err != nil {
			break
		}
		pings = append(pings, time.Since(t0))
	}
	cpu0, cpuErr := serverCPU(ctx, k.b.redis)
	lat := make([]time.Duration, 0, k.ops)
	start := time.Now()
	for i := range k.ops {
		t0 := time.Now()
		key := "k" + strconv.Itoa(i)
		c, err := s.Claim(ctx, key, nil)
		if err == nil && c.Outcome != idem.Claimed {
			err = fmt.Errorf("Claim(%q) = %v; want claimed", key, c.Outcome)
		}
		if err == nil {
			err = s.Confirm(ctx, c.Lease, nil)
		}
		if err != nil {
			k.verdict("latency", "FAIL", fmt.Sprintf("Claim+Confirm %d of %d: %s", i+1, k.ops, oneLine(err.Error())))
			return
		}
		lat = append(lat, time.Since(t0))
	}
	total := time.Since(start)
	cpu1, err := serverCPU(ctx, k.b.redis)
	if cpuErr == nil {
		cpuErr = err
	}
	ping := "PING refused"
	if len(pings) > 0 {
		ping = fmt.Sprintf("PING %s ms (median of %d)", ms(quantile(pings, 0.5)), len(pings))
	}
	k.verdict("latency", "pass", fmt.Sprintf("%s; Claim+Confirm %s ms median, %s ms p99, %s ms mean (%d one after another, 2 round trips each)",
		ping, ms(quantile(lat, 0.5)), ms(quantile(lat, 0.99)), ms(total/time.Duration(k.ops)), k.ops))
	if cpuErr != nil {
		k.verdict("Redis CPU", "skip", "INFO cpu: "+oneLine(cpuErr.Error()))
		return
	}
	per := (cpu1 - cpu0) / time.Duration(k.ops)
	k.verdict("Redis CPU", "pass", fmt.Sprintf("%d µs per Claim+Confirm (used_cpu_sys+used_cpu_user over %d; other clients' load included)",
		per.Microseconds(), k.ops))
}

// ms formats d in milliseconds, to the hundredth.
func ms(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 2, 64) }

// quantile returns the q-quantile of ds (which it sorts).
func quantile(ds []time.Duration, q float64) time.Duration {
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(q*float64(len(ds))))]
}

// serverCPU returns used_cpu_user + used_cpu_sys of INFO cpu, summed over a
// cluster's masters.
func serverCPU(ctx context.Context, c redis.UniversalClient) (time.Duration, error) {
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		return redisCPU(ctx, c)
	}
	var (
		mu  sync.Mutex
		sum time.Duration
	)
	err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		v, err := redisCPU(ctx, m)
		mu.Lock()
		sum += v
		mu.Unlock()
		return err
	})
	return sum, err
}

// redisCPU reads used_cpu_user + used_cpu_sys (seconds, to the
// microsecond) of one server.
func redisCPU(ctx context.Context, c redis.Cmdable) (time.Duration, error) {
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var sum time.Duration
	for _, field := range []string{"used_cpu_user", "used_cpu_sys"} {
		v, ok := redisadmin.InfoValue(info, field)
		f, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil {
			return 0, fmt.Errorf("no number in %s %q", field, v)
		}
		sum += time.Duration(f * float64(time.Second))
	}
	return sum, nil
}

// cleanup deletes the throwaway keys, in a context of its own: an
// interrupted check still cleans up.
func (k *checker) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := redisadmin.Unlink(ctx, k.b.redis, k.prefix+"*")
	if err != nil {
		k.verdict("cleanup", "warn", fmt.Sprintf("deleted %d keys under %s, then: %s; the rest expire within %v",
			n, k.prefix, oneLine(err.Error()), checkRetention))
		return
	}
	k.verdict("cleanup", "pass", fmt.Sprintf("deleted %d keys under %s", n, k.prefix))
}

// syncBuffer is a bytes buffer that a Logger may write from any goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
