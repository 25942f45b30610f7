package idem

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/testing/testenv"
)

// A service starts before its Redis: NewRedisStore sends nothing, calls
// fail while the server is down, and work once it is up, with no restart
// of the store.
func TestRedisStartsBeforeItsServer(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServer(t)
	srv.Kill()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	io := &testenv.IOCounter{}
	c.AddHook(io)
	s, err := NewRedisStore(c, RedisOptions{Prefix: testenv.UniquePrefix()})
	if err != nil {
		t.Fatalf("NewRedisStore with its server down = %v; want a store (no I/O at construction)", err)
	}
	if n := io.N.Load(); n != 0 {
		t.Errorf("NewRedisStore sent %d commands; want none", n)
	}
	ctx := context.Background()
	if _, err := s.Claim(ctx, "k", nil); err == nil {
		t.Fatalf("Claim with the server down = nil error; want one")
	}
	if err := s.Check(ctx); err == nil {
		t.Errorf("Check with the server down = nil; want an error")
	}
	if !srv.Start() {
		t.FailNow()
	}
	if err := s.Check(ctx); err != nil {
		t.Errorf("Check once the server is up = %v; want nil", err)
	}
	if c, err := s.Claim(ctx, "k", nil); err != nil || c.Outcome != Claimed {
		t.Errorf("Claim once the server is up = %v, %v; want claimed", c.Outcome, err)
	}
}

// A Redis that persists nothing loses every record on a restart: accepted,
// with one warning however many checks run.
func TestRedisWarnsOnceWithoutPersistence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tt := range []struct {
		name string
		args []string
		warn bool
	}{
		{"nothing", []string{"--appendonly", "no"}, true},
		{"aof", []string{"--appendonly", "yes"}, false},
		{"rdb", []string{"--appendonly", "no", "--save", "3600 1"}, false},
	} {
		srv := testenv.StartRedisServer(t, tt.args...)
		c := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { _ = c.Close() })
		var logs bytes.Buffer
		s, err := NewRedisStore(c, RedisOptions{Prefix: testenv.UniquePrefix(), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if err := s.Check(ctx); err != nil {
				t.Fatalf("%s: Check = %v; want nil (persistence off is a warning)", tt.name, err)
			}
		}
		if _, err := s.Claim(ctx, "k", nil); err != nil {
			t.Fatalf("%s: Claim = %v", tt.name, err)
		}
		n := strings.Count(logs.String(), "persists nothing")
		if want := map[bool]int{true: 1, false: 0}[tt.warn]; n != want {
			t.Errorf("%s: %d persistence warnings in %q; want %d", tt.name, n, logs.String(), want)
		}
	}
}

// A finding stands: every call answers it, without a probe per call,
// until the server is fixed; then the calls go through with no restart.
func TestRedisFindingStandsUntilFixed(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServer(t, "--maxmemory-policy", "allkeys-lru")
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	io := &testenv.IOCounter{}
	c.AddHook(io)
	ctx := context.Background()
	s := newTestRedisStore(t, c, RedisOptions{})
	if _, err := s.Claim(ctx, "k", nil); !errors.Is(err, ErrEviction) {
		t.Fatalf("first Claim = %v; want ErrEviction", err)
	}
	before := io.N.Load()
	for range 50 {
		if _, err := s.Lookup(ctx, "k"); !errors.Is(err, ErrEviction) {
			t.Fatalf("Lookup = %v; want ErrEviction", err)
		}
	}
	if n := io.N.Load() - before; n > 5 {
		t.Errorf("50 calls against a standing finding sent %d commands; want the finding answered locally", n)
	}
	if err := c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(probeRetry + 50*time.Millisecond) // the finding's stand runs out
	if _, err := s.Claim(ctx, "k", nil); err != nil {
		t.Errorf("Claim after the server was fixed = %v; want nil", err)
	}
	// Passed: no command beyond the call itself (once its script is
	// loaded).
	if _, err := s.Lookup(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	before = io.N.Load()
	if _, err := s.Lookup(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if n := io.N.Load() - before; n != 1 {
		t.Errorf("a Lookup after the check passed sent %d commands; want 1", n)
	}
}

func TestRedisCheckZeroValue(t *testing.T) {
	if err := new(RedisStore).Check(context.Background()); err == nil || !strings.Contains(err.Error(), "NewRedisStore") {
		t.Errorf("Check on a zero RedisStore = %v; want an error naming NewRedisStore", err)
	}
}

// badServer is a go-redis hook that answers as a server unfit for idem
// would: it rewrites the reply of the commands that answer matches.
type badServer struct {
	answer func(cmd redis.Cmder) bool // sets cmd's reply; false: the server's own
}

func (b badServer) DialHook(next redis.DialHook) redis.DialHook { return next }

func (b badServer) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := next(ctx, cmd); err != nil {
			return err
		}
		b.answer(cmd)
		return cmd.Err()
	}
}

func (b badServer) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			b.answer(cmd)
		}
		return err
	}
}

// probeReply rewrites probe.lua's reply {seconds, µs, first, second, pttl}.
func probeReply(rewrite func(r []any)) func(redis.Cmder) bool {
	return func(cmd redis.Cmder) bool {
		c, ok := cmd.(*redis.Cmd)
		if !ok || strings.ToLower(c.Name()) != "evalsha" {
			return false
		}
		if sha, _ := c.Args()[1].(string); sha != probeScript.Hash() {
			return false
		}
		r, ok := c.Val().([]any)
		if !ok || len(r) != 5 {
			return false
		}
		r = append([]any(nil), r...)
		rewrite(r)
		c.SetVal(r)
		return true
	}
}

// Each server unfit for idem is refused on first contact with its named
// error, and the calls fail with it: no claim is granted on a server that
// could grant two.
func TestRedisCapabilityProbe(t *testing.T) {
	t.Parallel()
	frozen := []any{}
	for _, tt := range []struct {
		name   string
		answer func(redis.Cmder) bool
		want   error
		says   string
	}{
		{"TIME answers zeros (as Dragonfly did)", probeReply(func(r []any) { r[0], r[1] = "0", "0" }), ErrScriptTime, "TIME answered 0 s"},
		{"TIME does not advance", probeReply(func(r []any) {
			if len(frozen) == 0 {
				frozen = append(frozen, r[0], r[1])
			}
			r[0], r[1] = frozen[0], frozen[1]
		}), ErrScriptTime, "a millisecond later"},
		{"SET NX not exclusive", probeReply(func(r []any) { r[3] = int64(1) }), ErrSetNX, "a second on the same key wrote true"},
		{"SET NX sets no TTL", probeReply(func(r []any) { r[4] = int64(-1) }), ErrSetNX, "PTTL of -1"},
		{"SET NX does not write", probeReply(func(r []any) { r[2] = int64(0) }), ErrSetNX, "a first SET NX PX wrote false"},
		{"scripts refused", func(cmd redis.Cmder) bool {
			if c, ok := cmd.(*redis.StringCmd); ok && strings.EqualFold(c.Name(), "script") {
				c.SetErr(replyErr("NOPERM User idem has no permissions to run the 'script|load' command"))
				return true
			}
			return false
		}, ErrScriptsRefused, "'script|load'"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			frozen = frozen[:0]
			_, c := newMiniredisClient(t)
			c.AddHook(badServer{answer: tt.answer})
			s, err := NewRedisStore(c, RedisOptions{Prefix: testenv.UniquePrefix()})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			cl, err := s.Claim(ctx, "k", nil)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.says) || cl.Lease != nil {
				t.Errorf("Claim = %v, %v; want %v saying %q, and no lease", cl.Outcome, err, tt.want, tt.says)
			}
			if err := s.Check(ctx); !errors.Is(err, tt.want) {
				t.Errorf("Check = %v; want %v", err, tt.want)
			}
		})
	}
}

// A cluster with slots that no master serves is refused on first contact.
func TestRedisCapabilityProbeSlots(t *testing.T) {
	t.Parallel()
	c := testenv.Cluster(t)
	ctx := context.Background()
	c.AddHook(badServer{answer: func(cmd redis.Cmder) bool {
		sc, ok := cmd.(*redis.StringCmd)
		if !ok || !strings.EqualFold(sc.Name(), "cluster") || len(sc.Args()) < 2 || sc.Args()[1] != "info" {
			return false
		}
		sc.SetVal(strings.Replace(sc.Val(), "cluster_slots_ok:16384", "cluster_slots_ok:10923", 1))
		return true
	}})
	s, err := NewRedisStore(c, RedisOptions{Prefix: testenv.UniquePrefix()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); !errors.Is(err, ErrSlotsUncovered) || !strings.Contains(err.Error(), "10923 of 16384") {
		t.Errorf("Check on a cluster serving 10923 slots = %v; want ErrSlotsUncovered naming the count", err)
	}
}

// Scripts loaded with SCRIPT LOAD stay loaded however many scripts another
// client sends by EVAL: Redis 8 keeps EVAL's scripts in a 500-entry LRU,
// which evicted idem's when it loaded them by EVAL. Claim and Confirm
// stay one round trip each, and the server answers no NOSCRIPT.
func TestRedisScriptsStayLoaded(t *testing.T) {
	testenv.EachServer(t, func(t *testing.T, srv testenv.Server) {
		sv := srv.Start(t) // a server of its own: INFO errorstats counts every client's errors
		c := redis.NewClient(&redis.Options{Addr: sv.Addr})
		t.Cleanup(func() { _ = c.Close() })
		other := redis.NewClient(&redis.Options{Addr: sv.Addr})
		t.Cleanup(func() { _ = other.Close() })
		ctx := context.Background()
		s := newTestRedisStore(t, c, RedisOptions{}) // first contact: SCRIPT LOAD
		if err := c.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		h := &tripCounter{}
		c.AddHook(h)

		const foreign = 2000
		done := make(chan error, 1)
		go func() {
			for i := range foreign {
				if err := other.Eval(ctx, fmt.Sprintf("return %d", i), nil).Err(); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		ops := 0
		for running := true; running; {
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("another client's EVAL: %v", err)
				}
				running = false
			default:
			}
			cl, err := s.Claim(ctx, uuid.NewString(), nil)
			if err != nil || cl.Outcome != Claimed {
				t.Fatalf("Claim = %v, %v", cl.Outcome, err)
			}
			if err := s.Confirm(ctx, cl.Lease, []byte("r")); err != nil {
				t.Fatalf("Confirm = %v", err)
			}
			ops++
			if trips, sent := h.take(); trips != 2 {
				t.Fatalf("Claim+Confirm %d cost %d round trips (%v); want 2", ops, trips, sent)
			}
		}
		stats, err := c.Info(ctx, "errorstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		if v, ok := infoField(stats, "errorstat_NOSCRIPT"); ok {
			t.Errorf("after %d foreign scripts and %d Claim+Confirm, INFO errorstats has NOSCRIPT %s; want none", foreign, ops, v)
		}
		info, _ := c.Info(ctx, "stats").Result()
		evicted, _ := infoField(info, "evicted_scripts")
		t.Logf("%s: %d foreign EVAL scripts (evicted_scripts %q), %d Claim+Confirm at 2 round trips each, 0 NOSCRIPT",
			srv.Name, foreign, evicted, ops)
	})
}

// pipelineCounter counts the pipelines a client sends: one per probe of a
// single Redis.
type pipelineCounter struct{ n atomic.Int64 }

func (p *pipelineCounter) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (p *pipelineCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (p *pipelineCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		p.n.Add(1)
		return next(ctx, cmds)
	}
}

// While Redis accepts connections but never answers (a service starting
// before its server, a host half up), the callers queued at first contact
// share the failure of the probe they waited for: each running a probe of
// its own, the last of 8 failed after 8 read timeouts.
func TestRedisProbeFailureShared(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = conn.Close() }) // held open, never answered
		}
	}()
	c := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), MaxRetries: -1, ReadTimeout: 300 * time.Millisecond,
		WriteTimeout: 300 * time.Millisecond, PoolSize: 16})
	t.Cleanup(func() { _ = c.Close() })
	pipelines := &pipelineCounter{}
	c.AddHook(pipelines)
	s, err := NewRedisStore(c, RedisOptions{Prefix: testenv.UniquePrefix()})
	if err != nil {
		t.Fatal(err)
	}
	const callers = 8
	var wg sync.WaitGroup
	errs := make([]error, callers)
	for i := range callers {
		wg.Go(func() { _, errs[i] = s.Claim(context.Background(), "k", nil) })
	}
	wg.Wait()
	for i, err := range errs {
		if err == nil {
			t.Errorf("Claim %d against a server that never answers = nil error; want one", i)
		}
	}
	// One probe for all; a caller arriving after it ended may run one more.
	if n := pipelines.n.Load(); n > callers/2 {
		t.Errorf("%d callers at first contact ran %d probes; want them to share one", callers, n)
	}
}

// A finding of Check after first contact refuses new claims, never the
// record of work done: a Confirm refused would have the work done again.
func TestRedisCheckFindingSparesLeases(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	s := newTestRedisStore(t, c, RedisOptions{})
	cl, err := s.Claim(ctx, "k", nil)
	if err != nil || cl.Outcome != Claimed {
		t.Fatalf("Claim = %v, %v; want claimed", cl.Outcome, err)
	}
	if err := c.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); !errors.Is(err, ErrEviction) {
		t.Fatalf("Check on an evicting server = %v; want ErrEviction", err)
	}
	if _, err := s.Claim(ctx, "k2", nil); !errors.Is(err, ErrEviction) {
		t.Errorf("Claim after Check's finding = %v; want ErrEviction", err)
	}
	if err := s.Renew(ctx, cl.Lease); err != nil {
		t.Errorf("Renew of work under way after Check's finding = %v; want nil", err)
	}
	if err := s.Confirm(ctx, cl.Lease, []byte("done")); err != nil {
		t.Errorf("Confirm of work done after Check's finding = %v; want nil (recorded)", err)
	}
	if rec, err := s.Lookup(ctx, "k"); !errors.Is(err, ErrEviction) {
		t.Errorf("Lookup after Check's finding = %v, %v; want ErrEviction", rec, err)
	}
	if err := c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check once fixed = %v; want nil", err)
	}
	if rec, err := s.Lookup(ctx, "k"); err != nil || !rec.Confirmed || string(rec.Result) != "done" {
		t.Errorf("Lookup once fixed = %+v, %v; want the confirmation made meanwhile", rec, err)
	}
}

// logBuffer is a log's text, written by several goroutines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// count counts the lines of level that say what.
func (l *logBuffer) count(level, what string) int {
	n := 0
	for line := range strings.SplitSeq(l.String(), "\n") {
		if strings.Contains(line, "level="+level) && strings.Contains(line, what) {
			n++
		}
	}
	return n
}

// A server that restarts is checked again: one restarted with an
// eviction policy is refused within a second or so, and one that came
// back without the records it held is an error in the log, as is the
// persistence warning of the new process. Before, a store that passed its
// first contact never looked again.
func TestRedisRestartIsCheckedAgain(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServer(t) // persists nothing
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	logs := &logBuffer{}
	s := newTestRedisStore(t, c, RedisOptions{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	ctx := context.Background()
	cl, err := s.Claim(ctx, "paid", nil)
	if err != nil || cl.Outcome != Claimed {
		t.Fatalf("Claim = %v, %v; want claimed", cl.Outcome, err)
	}
	if err := s.Confirm(ctx, cl.Lease, []byte("charged")); err != nil {
		t.Fatalf("Confirm = %v", err)
	}

	srv.Kill()
	if !srv.Start() {
		t.FailNow()
	}
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = admin.Close() })
	if err := admin.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := s.Claim(ctx, "next", nil)
		if errors.Is(err, ErrEviction) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Claim 5s after a restart with allkeys-lru = %v; want ErrEviction", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := logs.count("ERROR", "came back empty: the records it held are lost"); n != 1 {
		t.Errorf("%d error lines on the restart that lost the records; want 1. Log:\n%s", n, logs)
	}
	if n := logs.count("WARN", "persists nothing"); n != 2 {
		t.Errorf("%d persistence warnings; want 2, one per server process. Log:\n%s", n, logs)
	}
}

// A restart that kept the records (AOF, fsync always) is a warning, not
// the error of records lost, and the records still answer.
func TestRedisRestartWithRecordsIsAWarning(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServer(t, "--appendonly", "yes", "--appendfsync", "always")
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	logs := &logBuffer{}
	s := newTestRedisStore(t, c, RedisOptions{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	ctx := context.Background()
	cl, err := s.Claim(ctx, "paid", nil)
	if err != nil || cl.Outcome != Claimed {
		t.Fatalf("Claim = %v, %v; want claimed", cl.Outcome, err)
	}
	if err := s.Confirm(ctx, cl.Lease, []byte("charged")); err != nil {
		t.Fatalf("Confirm = %v", err)
	}
	srv.Kill()
	if !srv.Start() {
		t.FailNow()
	}
	deadline := time.Now().Add(5 * time.Second)
	for logs.count("WARN", "Redis restarted; its checks run again") == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no warning of the restart 5s after it. Log:\n%s", logs)
		}
		if cl, err := s.Claim(ctx, "paid", nil); err != nil || cl.Outcome != Duplicate {
			t.Fatalf("Claim(paid) after a restart that kept it = %v, %v; want duplicate", cl.Outcome, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := logs.count("ERROR", ""); n != 0 {
		t.Errorf("%d error lines; want none. Log:\n%s", n, logs)
	}
}

// Stores of one process on one server that persists nothing warn once
// between them, not once each.
func TestRedisWarnsOncePerServerProcess(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	logs := &logBuffer{}
	for range 2 {
		s := newTestRedisStore(t, c, RedisOptions{Logger: slog.New(slog.NewTextHandler(logs, nil))})
		if _, err := s.Claim(context.Background(), "k", nil); err != nil {
			t.Fatalf("Claim = %v", err)
		}
	}
	if n := logs.count("WARN", "persists nothing"); n != 1 {
		t.Errorf("two stores on one server gave %d persistence warnings; want 1. Log:\n%s", n, logs)
	}
}

// A server that does not answer is reported as such, with its address,
// not as the name of the first check that could not run ("checking Redis
// maxmemory-policy: ...").
func TestRedisUnreachableSaysSo(t *testing.T) {
	t.Parallel()
	c := testenv.DeadRedis(t)
	s, err := NewRedisStore(c, RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, call := range []func() error{
		func() error { _, err := s.Claim(context.Background(), "k", nil); return err },
		func() error { return s.Check(context.Background()) },
	} {
		err := call()
		if err == nil || !strings.Contains(err.Error(), "cannot reach Redis at "+c.Options().Addr) || strings.Contains(err.Error(), "maxmemory") ||
			strings.Count(err.Error(), "idem: ") != 1 {
			t.Errorf("a call with the server down = %v; want \"cannot reach Redis at %s\", naming no check, prefixed \"idem: \" once", err, c.Options().Addr)
		}
	}
}

// A CLUSTER NODES reply of a cluster that lost a master (7001, promoted
// away: failed, no slot), a replica (7005, not answering yet) and holds an
// empty master (7006), as Redis 7.0 writes it.
const lostNodes = `a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 5461-10922
a2 127.0.0.1:7001@17001 master,fail - 1700000000000 1700000000000 2 disconnected
a3 127.0.0.1:7002@17002 master - 0 1700000000000 3 connected 10923-16383
a4 127.0.0.1:7003@17003 master - 0 1700000000000 7 connected 0-5460
a5 127.0.0.1:7005@17005 slave,fail? a3 1700000000000 0 3 connected
a6 127.0.0.1:7006@17006,host6 master - 0 1700000000000 8 connected
a7 127.0.0.1:7007@17007 slave a1 0 1700000000000 1 connected
`

func TestRedisClusterNodesRead(t *testing.T) {
	got := degradedNodes(lostNodes)
	want := []string{"127.0.0.1:7001 (master): failed", "127.0.0.1:7005 (replica): not answering (fail?)",
		"127.0.0.1:7006 (master): a master serving no slot"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("degradedNodes = %q; want %q", got, want)
	}
	for addr, want := range map[string]bool{"127.0.0.1:7000": true, "127.0.0.1:7001": false, "127.0.0.1:7003": true,
		"127.0.0.1:7005": false, "127.0.0.1:7006": false, "127.0.0.1:7007": false, "127.0.0.1:9999": true} {
		if got := servesSlots(lostNodes, addr); got != want {
			t.Errorf("servesSlots(%s) = %t; want %t", addr, got, want)
		}
	}
}
