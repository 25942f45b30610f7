package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/badopt"
)

// What a server may be found to lack on first contact (see
// RedisStore.Check). Each is returned, wrapped with what was found, by
// every call until the server is fixed.
var (
	// ErrEviction: Redis's maxmemory-policy may evict keys, and an evicted
	// record is work done twice. Set it to noeviction, or accept the risk
	// with RedisOptions.AllowEviction.
	ErrEviction = errors.New("idem: Redis may evict records")
	// ErrTooFewReplicas: a master has fewer replicas than
	// RedisOptions.WaitReplicas, so every Confirm would wait WaitTimeout
	// and fail with ErrNotReplicated.
	ErrTooFewReplicas = errors.New("idem: Redis has fewer replicas than WaitReplicas")
	// ErrScriptsRefused: the server refuses SCRIPT LOAD or EVALSHA (scripts
	// disabled, or an ACL user without them): every operation is a script.
	ErrScriptsRefused = errors.New("idem: Redis refuses idem's scripts")
	// ErrScriptTime: TIME inside a script answers zero or does not advance,
	// so fencing tokens, taken from it, would not increase (a server that
	// only imitates Redis may do this).
	ErrScriptTime = errors.New("idem: Redis scripts see no advancing TIME")
	// ErrSetNX: SET NX PX inside a script is not exclusive or sets no TTL,
	// so two claims could both win, or a claim never expire.
	ErrSetNX = errors.New("idem: Redis SET NX PX is not exclusive with a TTL")
	// ErrSlotsUncovered: the Redis Cluster does not serve every hash slot,
	// so the keys of the missing slots cannot be claimed.
	ErrSlotsUncovered = errors.New("idem: Redis Cluster does not serve every slot")
)

// findings are the errors the check answers locally for probeRetry: the
// server's, not the network's.
var findings = [...]error{ErrEviction, ErrTooFewReplicas, ErrScriptsRefused, ErrScriptTime, ErrSetNX, ErrSlotsUncovered, ErrFieldHashes}

// isFinding reports whether err is a finding about the server.
func isFinding(err error) bool {
	for _, f := range findings {
		if errors.Is(err, f) {
			return true
		}
	}
	return false
}

// Bounds of what one Redis string holds: the server refuses a bulk string
// over proto-max-bulk-len, 512 MiB by default. A record holds the result
// with the token, owner and fingerprint around it.
const (
	maxRedisString = 512 << 20
	maxRedisResult = maxRedisString - 4096
)

// probeRetry is how long a finding about the server stands before a call
// checks the server again: long enough that a misconfigured server does
// not get a probe per call, short enough that fixing it takes effect
// at once for a person watching.
const probeRetry = time.Second

// persistenceWarned holds the run ids of the servers found persisting
// nothing, so that each is logged once per process, whichever store found
// it, and again after a restart (a new run id).
var persistenceWarned sync.Map

// probe is a RedisStore's check of its server: run once, on first
// contact, then again when the server restarted (one atomic load per call,
// and a read of the server's identity once per recheckEvery).
type probe struct {
	passed atomic.Bool
	// once is set when the server first passed: a later finding (of
	// Check) refuses new claims, never the record of work done or the
	// renewal of work under way (see leaseReady).
	once  atomic.Bool
	gate  chan struct{} // one probe at a time; the others wait for its verdict
	found error         // the last finding (guarded by gate)
	at    time.Time     // when it was found (guarded by gate)

	next   atomic.Int64  // when contact next reads the servers' identity (UnixNano)
	blind  atomic.Bool   // the server refuses INFO: no identity to read
	losses atomic.Uint64 // scriptLosses when it last read them
	mu     sync.Mutex
	seen   map[string]identity // by master address ("" for the one server); guarded by mu
	// masters are a cluster's masters as the last check found them
	// (guarded by mu): read again without ForEachMaster, which reloads
	// the client's slot map each time.
	masters []*redis.Client
	// degraded is when the store last reported a degraded cluster
	// (UnixNano; see reportNodes).
	degraded atomic.Int64
}

// leaseReady is the first step of the calls that give a lease back (Renew,
// Confirm, Forget, ConfirmBatch): the server check, until the server passed
// it once, then free. A finding of a later Check does not stop them: work
// already done must still be recorded (or it would be done again), and
// work under way renewed.
func (s *RedisStore) leaseReady(ctx context.Context) error {
	if s.probe.once.Load() {
		return nil
	}
	return s.check(ctx, false)
}

// contact is the first step of the calls that start something (Claim,
// ClaimBatch, Lookup): the server check unless it has passed, free after
// the first contact. It returns the time to reckon expiries from: start
// or, when the check ran, its end, so that a first contact's probe does
// not shorten the estimates.
func (s *RedisStore) contact(ctx context.Context, start time.Time) (time.Time, error) {
	if s.probe.passed.Load() {
		if err := s.rereadForm(ctx, start); err != nil {
			return start, err
		}
		if !s.probe.due(start) {
			return start, nil
		}
		if !s.recheck(ctx) {
			return start, nil
		}
	}
	if err := s.check(ctx, false); err != nil {
		return start, err
	}
	return time.Now(), nil
}

// Check runs the checks of first contact now, whether or not they passed
// before, and returns what they found: nil when the server is fit, an error
// wrapping one of the findings (ErrEviction, ErrTooFewReplicas,
// ErrScriptsRefused, ErrScriptTime, ErrSetNX, ErrSlotsUncovered) for a
// server that is not, or the error of a server that cannot be reached. Made
// for readiness probes; a store checks its server by itself on first
// contact, so calling Check is never required. A finding refuses the
// store's Claim, ClaimBatch and Lookup until a check passes again; calls
// that give a lease back go on.
//
// The checks: maxmemory-policy is noeviction (unless AllowEviction), read
// with CONFIG GET or, where CONFIG is refused as on managed services, INFO
// memory, and accepted with a warning to the Logger when neither answers;
// each master has at least WaitReplicas connected replicas; on a cluster,
// every slot is served; the scripts load (SCRIPT LOAD, on every node);
// probe.lua finds TIME advancing inside a script and SET NX PX exclusive,
// writing, with its TTL. A server without persistence (no AOF, no RDB
// snapshots) loses every record on a restart: it is logged once as a
// warning, not refused, once per server and process.
//
// A store whose server passed reads the server's identity (INFO server's
// run_id and uptime, DBSIZE) again once a second, and at once after a
// NOSCRIPT reply, on the path of a Claim, ClaimBatch or Lookup: when a
// master restarted (or another server answers in its place), the checks
// run again, and it is logged, as an error when the server came back
// empty having held keys (the records are lost: their work may be done
// again), else as a warning. A restart that lost only the records written
// since the last snapshot is not told apart.
func (s *RedisStore) Check(ctx context.Context) error {
	if s.probe.gate == nil {
		return errZeroStore // no constructor made it
	}
	return s.check(ctx, true)
}

// check runs the probe; again is set by Check, to run it even after it
// passed. A finding stands for probeRetry; an error reaching the server
// stands only for the callers that were already waiting for that probe's
// verdict (the next call tries again): while Redis does not answer, the
// callers queued at first contact share one probe's failure instead of
// each waiting out a probe of its own.
func (s *RedisStore) check(ctx context.Context, again bool) error {
	asked := time.Now()
	select {
	case s.probe.gate <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-s.probe.gate }()
	if !again {
		if s.probe.passed.Load() {
			return nil
		}
		if f := s.probe.found; f != nil && (s.probe.at.After(asked) || isFinding(f) && time.Since(s.probe.at) < probeRetry) {
			return f
		}
	}
	err := s.runProbe(ctx)
	switch {
	case err == nil:
		s.probe.found = nil
		s.probe.next.Store(time.Now().Add(recheckEvery).UnixNano())
		s.probe.passed.Store(true)
		s.probe.once.Store(true)
	case isFinding(err):
		s.probe.found, s.probe.at = err, time.Now()
		s.probe.passed.Store(false)
	default:
		if ctx.Err() == nil {
			// The server's failure, not this caller's context ending:
			// the callers waiting meanwhile share it.
			s.probe.found, s.probe.at = err, time.Now()
		}
		// A node that does not answer may be gone from the cluster: the
		// probe's failure asks for a new slot map, as a call's does.
		s.reloadSlots(err)
	}
	return err
}

// runProbe checks every master (one Redis, the Sentinel's master, or each
// master of a cluster), loading the scripts on each in the same round
// trip, and asks the server what the scripts rely on.
//
// On a cluster it needs the masters that serve slots, and only them: a
// script runs where its key's slot is served, and a replica promoted
// later (or a dead node that comes back) gets them at its first NOSCRIPT,
// which every call retries. A node that is down, failing or serving no
// slot is reported (reportNodes), never a reason to refuse calls: the
// node table keeps a dead node until it returns or an operator removes
// it, and a store made meanwhile must serve.
func (s *RedisStore) runProbe(ctx context.Context) error {
	if cc := s.cluster; cc != nil {
		var mu sync.Mutex
		var masters []*redis.Client
		failed := map[string]error{}
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			err := s.probeNode(ctx, c, c.Options().Addr, true)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && !isFinding(err) && ctx.Err() == nil {
				// Perhaps a node the client's slot map still names
				// but the cluster no longer serves slots from: the
				// node table tells (servesSlots), once every master
				// was tried.
				failed[c.Options().Addr] = err
				return nil
			}
			masters = append(masters, c)
			return err
		})
		if err != nil {
			return err
		}
		if len(masters) == 0 {
			for _, err := range failed {
				return err
			}
			return errors.New("idem: Redis Cluster has no master")
		}
		// The node table, read where it is needed: to pass over a
		// master that serves no slot, and to report what is degraded.
		// A user without CLUSTER NODES (an ACL line older than the
		// README's) loses the report, not a call.
		var nodes string
		nerr := errNoNodeTable
		if len(failed) > 0 || s.core.o.Logger != nil || s.core.o.Observer != nil {
			nodes, nerr = masters[0].ClusterNodes(ctx).Result()
		}
		for addr, err := range failed {
			if nerr != nil || servesSlots(nodes, addr) {
				return err
			}
		}
		s.probe.mu.Lock()
		s.probe.masters = masters
		s.probe.mu.Unlock()
		if err := slotsServed(ctx, cc); err != nil {
			return err
		}
		if nerr == nil {
			s.reportNodes(ctx, nodes)
		}
	} else if err := s.probeNode(ctx, s.c, "", true); err != nil {
		return err
	}
	if err := s.probeScripts(ctx); err != nil {
		return err
	}
	// After the scripts: a user without GET is told so by their probe.
	if err := s.readForm(ctx); err != nil {
		return err
	}
	s.formRead.Store(time.Now().UnixNano())
	return nil
}

// queueScriptLoads queues a SCRIPT LOAD of every script on p.
func queueScriptLoads(ctx context.Context, p redis.Pipeliner) []*redis.StringCmd {
	loads := make([]*redis.StringCmd, len(scripts))
	for i, sc := range scripts {
		loads[i] = p.ScriptLoad(ctx, sc.src)
	}
	return loads
}

// scriptsLoaded keeps the digests of the SCRIPT LOADs queueScriptLoads
// queued, or returns why a script was not loaded.
func scriptsLoaded(loads []*redis.StringCmd, on string) error {
	for i, cmd := range loads {
		sha, err := cmd.Result()
		if err != nil {
			return fmt.Errorf("idem: SCRIPT LOAD of %s.lua%s: %w", scripts[i].name, on, scriptsRefused(err))
		}
		scripts[i].sha.Store(any(sha))
	}
	return nil
}

// probeTTL is the TTL of the probe's key, which it deletes at once.
const probeTTL = 10_000

// probeScripts runs probe.lua twice, a moment apart, on a key of the
// store's own: TIME must be non-zero and advance between the two, and
// SET NX PX be exclusive and set the TTL.
func (s *RedisStore) probeScripts(ctx context.Context) error {
	key := s.redisKey("\x00idem-probe\x00" + s.attemptPrefix)
	var last [2]int64
	for i := range 2 {
		if i > 0 {
			time.Sleep(time.Millisecond) // TIME counts microseconds
		}
		v, err := s.eval(ctx, probeScript, key, "", []any{probeTTL})
		if err != nil {
			return fmt.Errorf("idem: running probe.lua: %w", scriptsRefused(err))
		}
		a, ok := v.([]any)
		var n [5]int64
		for j := range n {
			if ok && len(a) == len(n) {
				n[j], ok = probeInt(a[j])
			}
		}
		if !ok {
			return fmt.Errorf("%w: probe.lua answered %v", ErrScriptsRefused, v)
		}
		now := [2]int64{n[0], n[1]}
		switch {
		case now[0] <= 0:
			return fmt.Errorf("%w: TIME answered %d s %d µs", ErrScriptTime, now[0], now[1])
		case i > 0 && (now[0] < last[0] || now[0] == last[0] && now[1] <= last[1]):
			return fmt.Errorf("%w: TIME answered %d.%06d, then %d.%06d a millisecond later",
				ErrScriptTime, last[0], last[1], now[0], now[1])
		case n[2] != 1 || n[3] != 0:
			return fmt.Errorf("%w: a first SET NX PX wrote %t, a second on the same key wrote %t",
				ErrSetNX, n[2] == 1, n[3] == 1)
		case n[4] <= 0 || n[4] > probeTTL:
			return fmt.Errorf("%w: SET NX PX %d left a PTTL of %d", ErrSetNX, probeTTL, n[4])
		}
		last = now
	}
	return nil
}

// probeNode checks one master, asking everything in one round trip (and
// loading the scripts in it when load is set); addr names the master in
// findings on a cluster.
func (s *RedisStore) probeNode(ctx context.Context, c redis.Cmdable, addr string, load bool) error {
	on := ""
	if addr != "" {
		on = " on " + addr
	}
	var (
		policy, appendonly, save  *redis.MapStringStringCmd
		memory, replication, info *redis.StringCmd
		wait                      *redis.IntCmd
		loads                     []*redis.StringCmd
	)
	_, perr := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		info = p.Info(ctx, "server", "keyspace")
		if !s.allowEviction {
			policy, memory = p.ConfigGet(ctx, "maxmemory-policy"), p.Info(ctx, "memory")
		}
		if s.waitReplicas > 0 {
			replication = p.Info(ctx, "replication")
			// WAIT for none: answered at once, and refused at first contact
			// for an ACL user without it, not as ErrNotReplicated on every
			// Confirm.
			wait = redis.NewIntCmd(ctx, "wait", 0, 1)
			_ = p.Process(ctx, wait)
		}
		appendonly, save = p.ConfigGet(ctx, "appendonly"), p.ConfigGet(ctx, "save")
		if load {
			loads = queueScriptLoads(ctx, p)
		}
		return nil
	})
	// A server that does not answer is said to be so, not named by the
	// first check that could not run.
	var reply redis.Error
	if perr != nil && !errors.As(perr, &reply) && ctx.Err() == nil {
		return unreachable(c, addr, perr)
	}
	db := 0
	if c, ok := c.(*redis.Client); ok {
		db = c.Options().DB
	}
	id, err := identityOf(info, db)
	if err != nil {
		return fmt.Errorf("idem: reading Redis INFO server%s: %w", on, err)
	}
	// Told before any finding, which would end the check: a restarted
	// server refused for its eviction policy has lost its records all
	// the same.
	persists := persistent(appendonly, save)
	s.notice(ctx, addr, id, persists)
	if !persists {
		if _, warned := persistenceWarned.LoadOrStore(addr+" "+id.runID, true); !warned {
			var attrs []slog.Attr
			if addr != "" {
				attrs = append(attrs, slog.String("node", addr))
			}
			s.warn(ctx, "idem: Redis persists nothing (appendonly no, no save points): a restart loses every record, and the work of each may be done again", attrs...)
		}
	}
	if !s.allowEviction {
		policy, err := evictionPolicy(policy, memory)
		switch {
		case errors.Is(err, errPolicyUnknown):
			s.warn(ctx, "idem: cannot read Redis maxmemory-policy; make sure it is noeviction, or records may be evicted and work done twice",
				slog.String("error", err.Error()))
		case err != nil:
			return fmt.Errorf("idem: checking Redis maxmemory-policy%s: %w", on, err)
		case policy != "noeviction":
			return fmt.Errorf("%w: maxmemory-policy is %q%s; set it to noeviction, or set RedisOptions.AllowEviction to accept the risk",
				ErrEviction, policy, on)
		}
	}
	if s.waitReplicas > 0 {
		if err := wait.Err(); err != nil {
			return fmt.Errorf("idem: WAIT, which WaitReplicas sends after each Confirm%s: %w", on, err)
		}
		n, err := connectedReplicas(replication)
		if err != nil {
			return fmt.Errorf("idem: checking Redis replicas%s: %w", on, err)
		}
		if n < s.waitReplicas {
			return fmt.Errorf("%w: WaitReplicas %d, and the master%s has %d connected replicas",
				ErrTooFewReplicas, s.waitReplicas, on, n)
		}
	}
	if load {
		return scriptsLoaded(loads, on)
	}
	return nil
}

// unreachable is the error of a first contact that got no answer from the
// server at addr ("" : c's).
func unreachable(c redis.Cmdable, addr string, err error) error {
	if rc, ok := c.(*redis.Client); ok && addr == "" {
		addr = rc.Options().Addr
	}
	if addr == "" {
		return fmt.Errorf("idem: cannot reach Redis: %w", err)
	}
	return fmt.Errorf("idem: cannot reach Redis at %s: %w", addr, err)
}

// checkAddrs refuses a client whose address is a URL: go-redis takes it
// for a host and port, and every call would fail after its dial retries
// with "too many colons". redis.ParseURL reads URLs.
func checkAddrs(c redis.UniversalClient) error {
	var field string
	var addrs []string
	switch c := c.(type) {
	case *redis.Client:
		field, addrs = "redis.Options.Addr", []string{c.Options().Addr}
	case *redis.ClusterClient:
		field, addrs = "redis.ClusterOptions.Addrs", c.Options().Addrs
	}
	for _, a := range addrs {
		if strings.Contains(a, "://") {
			return badopt.Error("idem", field, a, "is a URL, not host:port: build the client's options with redis.ParseURL (redis.ParseClusterURL for a cluster)")
		}
	}
	return nil
}

// warn logs a warning about the server to the Logger, if any.
func (s *RedisStore) warn(ctx context.Context, msg string, attrs ...slog.Attr) {
	s.log(ctx, slog.LevelWarn, msg, attrs...)
}

// log logs what the store found of its server to the Logger, if any.
func (s *RedisStore) log(ctx context.Context, level slog.Level, msg string, attrs ...slog.Attr) {
	if s.core.o.Logger != nil {
		s.core.o.Logger.LogAttrs(ctx, level, msg, attrs...)
	}
}
