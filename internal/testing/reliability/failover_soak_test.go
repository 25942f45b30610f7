//go:build failover

package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/redisadmin"
	"github.com/idemgo/idem/internal/testing/testenv"
)

// The failover durability experiment (.ci/failover.sh runs it; it takes
// minutes, so it is not part of `make test`). On a Sentinel set of its own
// (a master, a replica, three sentinels that judge a master down after 1 s),
// many goroutines claim and confirm distinct keys through
// redis.NewFailoverClient, while the experiment kills the master with
// SIGKILL, waits for the sentinels to promote the replica, starts the old
// master again as a replica of the new one, and repeats. Afterwards it looks
// up every key whose Confirm returned nil: a key that is gone was confirmed
// and then lost, a write the master acknowledged before its replica had it.
//
// Knobs (environment):
//
//	IDEM_FAILOVER_KILLS          master kills (default 20)
//	IDEM_FAILOVER_DOWN_AFTER_MS  sentinel down-after-milliseconds (default 2000)
//	IDEM_FAILOVER_WORKERS        concurrent claim+confirm loops (default 16)
//	IDEM_FAILOVER_WAIT_REPLICAS  RedisOptions.WaitReplicas (default 0, off)
//
// With WaitReplicas a Confirm that returned an error (ErrNotReplicated
// included) does not count as confirmed, and no confirmed key may be lost.

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a number >= 0", name, v)
	}
	return n
}

// sentinelSet is a Sentinel set of one test's own: two data nodes (one
// master, one replica, roles swapping at each failover) and three sentinels.
type sentinelSet struct {
	t         *testing.T
	bin, dir  string
	nodes     map[string]*exec.Cmd // data node address -> its process (nil while killed)
	sentinels []string
	procs     []*exec.Cmd // the sentinels
}

const masterName = "mymaster"

func startSentinelSet(t *testing.T, downAfter int) *sentinelSet {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server is not on PATH: %v", err)
	}
	s := &sentinelSet{t: t, bin: bin, dir: t.TempDir(), nodes: make(map[string]*exec.Cmd)}
	t.Cleanup(func() {
		s.stop()
		if t.Failed() {
			s.dumpLogs()
		}
	})
	master := "127.0.0.1:" + testenv.FreePort(t)
	replica := "127.0.0.1:" + testenv.FreePort(t)
	s.startNode(master, "")
	s.startNode(replica, master)
	for i := range 3 {
		port := testenv.FreePort(t)
		d := filepath.Join(s.dir, "sentinel-"+port)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		_, mport, _ := net.SplitHostPort(master)
		// A short down-after (the shared set of `make test` waits 10 s):
		// here a failover is what the experiment wants, and soon.
		conf := fmt.Sprintf("port %s\nbind 127.0.0.1\ndir %s\nlogfile %s\n"+
			"sentinel monitor %s 127.0.0.1 %s 2\n"+
			"sentinel down-after-milliseconds %s %d\n"+
			"sentinel failover-timeout %s 5000\n",
			port, d, filepath.Join(d, "log"), masterName, mport, masterName, downAfter, masterName)
		if err := os.WriteFile(filepath.Join(d, "sentinel.conf"), []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, filepath.Join(d, "sentinel.conf"), "--sentinel")
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting sentinel %d: %v", i, err)
		}
		s.procs = append(s.procs, cmd)
		s.sentinels = append(s.sentinels, "127.0.0.1:"+port)
	}
	// The sentinels learn of the replica from the master's INFO.
	s.stable()
	return s
}

// startNode starts a data node at addr, a replica of master unless master
// is empty, without persistence (as the Sentinel set of `make test`), and
// with diskless full syncs that start at once (Redis waits 5 s by default).
func (s *sentinelSet) startNode(addr, master string) {
	s.t.Helper()
	_, port, _ := net.SplitHostPort(addr)
	d := filepath.Join(s.dir, "node-"+port)
	if err := os.MkdirAll(d, 0o755); err != nil {
		s.t.Fatal(err)
	}
	args := []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0",
		"--dir", d, "--logfile", filepath.Join(d, "log")}
	if master != "" {
		h, p, _ := net.SplitHostPort(master)
		args = append(args, "--replicaof", h, p)
	}
	cmd := exec.Command(s.bin, args...)
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("starting redis-server on %s: %v", addr, err)
	}
	s.nodes[addr] = cmd
	s.waitFor(10*time.Second, "redis-server on "+addr+" answers", func(ctx context.Context) bool {
		return s.client(addr).Ping(ctx).Err() == nil
	})
}

// dumpLogs logs the end of every server's log, to tell why a failover
// went wrong.
func (s *sentinelSet) dumpLogs() {
	logs, _ := filepath.Glob(filepath.Join(s.dir, "*", "log"))
	for _, f := range logs {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		s.t.Logf("---- %s (last lines)\n%s", f, strings.Join(lines[max(0, len(lines)-40):], "\n"))
	}
}

func (s *sentinelSet) kill(addr string) {
	if cmd := s.nodes[addr]; cmd != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	s.nodes[addr] = nil
}

func (s *sentinelSet) stop() {
	for addr := range s.nodes {
		s.kill(addr)
	}
	for _, cmd := range s.procs {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	s.procs = nil
}

// client returns the experiment's client of addr, made once and closed
// when the test ends.
func (s *sentinelSet) client(addr string) *redis.Client {
	clientsMu.Lock()
	defer clientsMu.Unlock()
	if c, ok := clients[addr]; ok {
		return c
	}
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 500 * time.Millisecond,
		ReadTimeout: 500 * time.Millisecond})
	clients[addr] = c
	s.t.Cleanup(func() {
		clientsMu.Lock()
		defer clientsMu.Unlock()
		_ = c.Close()
		delete(clients, addr)
	})
	return c
}

var (
	clientsMu sync.Mutex
	clients   = make(map[string]*redis.Client)
)

func (s *sentinelSet) waitFor(limit time.Duration, what string, ok func(ctx context.Context) bool) time.Duration {
	s.t.Helper()
	start := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		done := ok(ctx)
		cancel()
		if done {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			s.t.Fatalf("after %v: still waiting until %s", limit, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *sentinelSet) infoField(ctx context.Context, addr, field string) string {
	v, _ := redisadmin.InfoField(ctx, s.client(addr), "replication", field)
	return v
}

// masters returns the master address each sentinel names.
func (s *sentinelSet) masters(ctx context.Context) []string {
	var out []string
	for _, a := range s.sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: a, DialTimeout: 500 * time.Millisecond,
			ReadTimeout: 500 * time.Millisecond})
		hp, err := sc.GetMasterAddrByName(ctx, masterName).Result()
		_ = sc.Close()
		if err == nil && len(hp) == 2 {
			out = append(out, net.JoinHostPort(hp[0], hp[1]))
		} else {
			out = append(out, "")
		}
	}
	return out
}

// healthyReplica reports whether every sentinel lists replica as a healthy
// replica of master whose link is up: only such a replica is promoted.
func (s *sentinelSet) healthyReplica(ctx context.Context, master, replica string) bool {
	for _, a := range s.sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: a, DialTimeout: 500 * time.Millisecond,
			ReadTimeout: 500 * time.Millisecond})
		reps, err := sc.Replicas(ctx, masterName).Result()
		_ = sc.Close()
		if err != nil {
			return false
		}
		healthy := false
		for _, r := range reps {
			if net.JoinHostPort(r["ip"], r["port"]) == replica && r["flags"] == "slave" &&
				r["master-link-status"] == "ok" && net.JoinHostPort(r["master-host"], r["master-port"]) == master {
				healthy = true
			}
		}
		if !healthy {
			return false
		}
	}
	return true
}

// stable waits until the set can take a kill: the sentinels agree on a
// master that says it is one, and the other node is its replica, in sync
// and seen as healthy by every sentinel. A spurious failover (a loaded
// machine can make a sentinel miss pings) is waited out the same way.
func (s *sentinelSet) stable() (master, replica string) {
	s.t.Helper()
	s.waitFor(90*time.Second, "the Sentinel set is stable (a master, its replica in sync and seen healthy)", func(ctx context.Context) bool {
		ms := s.masters(ctx)
		master = ms[0]
		for _, m := range ms {
			if m != master || m == "" {
				return false
			}
		}
		replica = ""
		for a := range s.nodes {
			if a != master {
				replica = a
			}
		}
		if s.nodes[master] == nil || s.nodes[replica] == nil || s.infoField(ctx, master, "role") != "master" {
			return false
		}
		_, mport, _ := net.SplitHostPort(master)
		return s.infoField(ctx, replica, "master_link_status") == "up" &&
			s.infoField(ctx, replica, "master_port") == mport && s.healthyReplica(ctx, master, replica)
	})
	return master, replica
}

type confirmedKey struct {
	key string
	at  time.Time // when its Confirm returned nil
}

// claimLoad is the experiments' workload: goroutines that claim and
// confirm distinct keys through one store until finish, each retrying a
// claim that failed until its key is claimed or found.
type claimLoad struct {
	claims, claimErrs, confirmErrs, notRepl, inProgress atomic.Int64

	mu        sync.Mutex
	confirmed []confirmedKey // the keys whose Confirm returned nil

	stop context.CancelFunc
	wg   sync.WaitGroup
}

// startClaimLoad starts workers goroutines; worker w's keys are
// prefix+"w:n".
func startClaimLoad(store *idem.RedisStore, workers int, prefix string) *claimLoad {
	l := &claimLoad{}
	ctx, stop := context.WithCancel(context.Background())
	l.stop = stop
	for w := range workers {
		l.wg.Go(func() {
			var mine []confirmedKey
			defer func() {
				l.mu.Lock()
				l.confirmed = append(l.confirmed, mine...)
				l.mu.Unlock()
			}()
			for n := 0; ctx.Err() == nil; n++ {
				key := prefix + strconv.Itoa(w) + ":" + strconv.Itoa(n)
				if l.once(ctx, store, key) {
					mine = append(mine, confirmedKey{key, time.Now()})
				}
			}
		})
	}
	return l
}

// once claims key until it is claimed or found, then confirms it, and
// reports whether Confirm returned nil.
func (l *claimLoad) once(ctx context.Context, store *idem.RedisStore, key string) bool {
	for ctx.Err() == nil {
		l.claims.Add(1)
		cctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		c, err := store.Claim(cctx, key, nil)
		cancel()
		if err != nil {
			l.claimErrs.Add(1)
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if c.Outcome != idem.Claimed {
			// A claim whose reply was lost in the failover: its key is
			// held or done; move on, it proves nothing.
			l.inProgress.Add(1)
			return false
		}
		cctx, cancel = context.WithTimeout(context.Background(), 3*time.Second)
		err = store.Confirm(cctx, c.Lease, nil)
		cancel()
		if err != nil {
			l.confirmErrs.Add(1)
			if errors.Is(err, idem.ErrNotReplicated) {
				l.notRepl.Add(1)
			}
			return false
		}
		return true
	}
	return false
}

// finish stops the workers and returns the keys whose Confirm returned nil.
func (l *claimLoad) finish() []confirmedKey {
	l.stop()
	l.wg.Wait()
	return l.confirmed
}

// lookupLost looks up every confirmed key and returns those gone or not
// confirmed, and how many lookups failed even when retried: such keys are
// counted neither as kept nor as lost.
func lookupLost(store *idem.RedisStore, confirmed []confirmedKey) (lost []confirmedKey, lookupErrs int64) {
	var errs atomic.Int64
	var mu sync.Mutex
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(confirmed) {
					return
				}
				k := confirmed[i]
				var rec *idem.Record
				var err error
				for try := range 5 {
					cctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
					rec, err = store.Lookup(cctx, k.key)
					cancel()
					if err == nil || errors.Is(err, idem.ErrNotFound) {
						break
					}
					time.Sleep(time.Duration(try+1) * 100 * time.Millisecond)
				}
				switch {
				case errors.Is(err, idem.ErrNotFound), err == nil && !rec.Confirmed:
					mu.Lock()
					lost = append(lost, k)
					mu.Unlock()
				case err != nil:
					errs.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return lost, errs.Load()
}

// nearKills logs the first lost keys with how near a kill each one's
// Confirm returned, and sums them up for the summary line. The time is
// taken when the call has returned, so a reply the master sent just before
// it died can be stamped a little after the kill.
func nearKills(t *testing.T, lost []confirmedKey, killTimes []time.Time) string {
	t.Helper()
	var near []time.Duration
	slices.SortFunc(lost, func(a, b confirmedKey) int { return a.at.Compare(b.at) })
	for j, k := range lost {
		i, _ := slices.BinarySearchFunc(killTimes, k.at, func(a, b time.Time) int { return a.Compare(b) })
		var where []string
		d := time.Duration(1<<63 - 1)
		if i > 0 {
			after := k.at.Sub(killTimes[i-1])
			d = min(d, after)
			where = append(where, fmt.Sprintf("%v after kill %d", after.Round(time.Microsecond), i))
		}
		if i < len(killTimes) {
			before := killTimes[i].Sub(k.at)
			d = min(d, before)
			where = append(where, fmt.Sprintf("%v before kill %d", before.Round(time.Microsecond), i+1))
		}
		near = append(near, d)
		if j < 20 {
			t.Logf("lost: %q, Confirm returned at %v: %s", k.key, k.at.Format("15:04:05.000000"), strings.Join(where, ", "))
		}
	}
	if len(near) == 0 {
		return "n/a"
	}
	return fmt.Sprintf("each within %v of a kill", slices.Max(near).Round(time.Microsecond))
}

func TestFailoverDurability(t *testing.T) {
	kills := envInt(t, "IDEM_FAILOVER_KILLS", 20)
	workers := envInt(t, "IDEM_FAILOVER_WORKERS", 16)
	wait := envInt(t, "IDEM_FAILOVER_WAIT_REPLICAS", 0)
	downAfter := envInt(t, "IDEM_FAILOVER_DOWN_AFTER_MS", 2000)
	set := startSentinelSet(t, downAfter)
	// Every failover the sentinels make, the kills' and any spurious one.
	var switches atomic.Int64
	sub := redis.NewSentinelClient(&redis.Options{Addr: set.sentinels[0]})
	t.Cleanup(func() { _ = sub.Close() })
	ps := sub.Subscribe(context.Background(), "+switch-master")
	if _, err := ps.Receive(context.Background()); err != nil {
		t.Fatalf("SUBSCRIBE +switch-master: %v", err)
	}
	go func() {
		for range ps.Channel() {
			switches.Add(1)
		}
	}()

	fc := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: masterName, SentinelAddrs: set.sentinels,
		DialTimeout: 500 * time.Millisecond, ReadTimeout: time.Second, WriteTimeout: time.Second})
	t.Cleanup(func() { _ = fc.Close() })
	o := idem.RedisOptions{LeaseTTL: 5 * time.Second, Retention: time.Hour}
	if wait > 0 {
		o.WaitReplicas, o.WaitTimeout = wait, 200*time.Millisecond
	}
	store, err := idem.NewRedisStore(fc, o)
	if err != nil {
		t.Fatalf("NewRedisStore: %v", err)
	}

	load := startClaimLoad(store, workers, "fo:")
	start := time.Now()
	var killTimes []time.Time
	var failoverTook []time.Duration
	time.Sleep(time.Second)
	for i := range kills {
		old, replica := set.stable()
		killTimes = append(killTimes, time.Now())
		set.kill(old)
		took := set.waitFor(60*time.Second, fmt.Sprintf("kill %d: the sentinels promote %s", i+1, replica), func(ctx context.Context) bool {
			for _, m := range set.masters(ctx) {
				if m != replica {
					return false
				}
			}
			return set.infoField(ctx, replica, "role") == "master"
		})
		failoverTook = append(failoverTook, took)
		set.startNode(old, replica)
		t.Logf("kill %d: master %s killed; %s promoted after %v; %s started again as its replica", i+1, old, replica,
			took.Round(time.Millisecond), old)
		time.Sleep(time.Second)
	}
	set.stable()
	confirmed := load.finish()
	elapsed := time.Since(start)

	// Look up every key whose Confirm returned nil, on the master of now.
	lost, lookupErrs := lookupLost(store, confirmed)
	if lookupErrs > 0 {
		t.Errorf("%d lookups failed: those keys are neither counted as kept nor as lost", lookupErrs)
	}
	window := nearKills(t, lost, killTimes)
	slices.Sort(failoverTook)
	t.Logf("failover: kills %d, failovers %d (down-after %d ms; a kill's failover took %v to %v, median %v), workers %d, wait-replicas %d; claims sent %d "+
		"(errors %d, not claimed %d), confirms returned nil %d, confirm errors %d (not replicated %d); "+
		"confirmed then lost %d (%s); %v",
		kills, switches.Load(), downAfter, failoverTook[0].Round(time.Millisecond), failoverTook[len(failoverTook)-1].Round(time.Millisecond),
		failoverTook[len(failoverTook)/2].Round(time.Millisecond), workers, wait, load.claims.Load(), load.claimErrs.Load(),
		load.inProgress.Load(), len(confirmed), load.confirmErrs.Load(), load.notRepl.Load(), len(lost), window, elapsed.Round(time.Second))
	if len(confirmed) == 0 {
		t.Fatalf("no Confirm returned nil: the workload never ran")
	}
	if wait > 0 && len(lost) > 0 {
		t.Errorf("with WaitReplicas=%d, %d keys whose Confirm returned nil were lost in failovers; want none", wait, len(lost))
	}
}
