package idem

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem/internal/badopt"
	"github.com/redis/go-redis/v9"
)

var (
	//go:embed scripts/record.lua
	recordLua string
	//go:embed scripts/claim.lua
	claimLua string
	//go:embed scripts/renew.lua
	renewLua string
	//go:embed scripts/confirm.lua
	confirmLua string
	//go:embed scripts/forget.lua
	forgetLua string
	//go:embed scripts/lookup.lua
	lookupLua string
	//go:embed scripts/claim_batch.lua
	claimBatchLua string
	//go:embed scripts/confirm_batch.lua
	confirmBatchLua string
	//go:embed scripts/probe.lua
	probeLua string

	// Each script is one operation with the record format's functions
	// included where it asks for them.
	claimScript        = script("claim", claimLua)
	renewScript        = script("renew", renewLua)
	confirmScript      = script("confirm", confirmLua)
	forgetScript       = script("forget", forgetLua)
	lookupScript       = script("lookup", lookupLua)
	claimBatchScript   = script("claim_batch", claimBatchLua)
	confirmBatchScript = script("confirm_batch", confirmBatchLua)

	// probeScript asks the server, on first contact, for what the others
	// rely on (see RedisStore.Check).
	probeScript = &luaScript{name: "probe", src: probeLua}

	// scripts are all of them, as SCRIPT LOAD loads them on first contact.
	scripts = [...]*luaScript{claimScript, renewScript, confirmScript, forgetScript,
		lookupScript, claimBatchScript, confirmBatchScript, probeScript}
)

// luaScript is one of the store's scripts: its source, and the digest
// SCRIPT LOAD answered for it. Scripts are loaded with SCRIPT LOAD and run
// with EVALSHA, never loaded by EVAL: Redis 8 keeps EVAL's scripts in a
// 500-entry cache that another application's scripts evict, and SCRIPT
// LOAD's never. The digest is the server's (the SHA-1 of the source, the
// same on every server): nothing here hashes, so a program in FIPS-only
// mode can use the store.
type luaScript struct {
	name string
	src  string
	sha  atomic.Value // the digest as a boxed string, once a server answered it
}

// script includes record.lua into an operation's source at its
// "-- #include record.lua" line.
func script(name, src string) *luaScript {
	const include = "-- #include record.lua\n"
	if strings.Count(src, include) != 1 {
		panic("idem: a script must include record.lua exactly once")
	}
	return &luaScript{name: name, src: strings.Replace(src, include, recordLua, 1)}
}

// digest returns the script's digest as a boxed string (so that a call
// costs no allocation for it), or nil before any server answered it.
func (sc *luaScript) digest() any { return sc.sha.Load() }

// DefaultPrefix begins the name of every Redis key a RedisStore writes.
const DefaultPrefix = "idem:"

// RedisOptions configure a RedisStore in one flat literal. The first fields
// are those of Options, with the same meaning and defaults. The zero value
// is valid.
type RedisOptions struct {
	// Retention is how long a confirmed key is remembered. At least
	// LeaseTTL. Default 24h.
	Retention time.Duration
	// LeaseTTL is how long a claim binds unless renewed. At least 1ms.
	// Default 30s.
	LeaseTTL time.Duration
	// Worker names this store's leases (Lease.Owner); no two stores may
	// share one. At most 255 bytes, no NUL. Default: a random UUID.
	Worker string
	// MaxKeyBytes bounds keys. Default 1024.
	MaxKeyBytes int
	// MaxResultBytes bounds Confirm's result. Default 1 MiB.
	MaxResultBytes int
	// Logger receives what an operator must see (a late confirm, a lost
	// lease, a store failure at most once a second, a damaged record, and
	// on Redis what first contact found unsafe but allowed). Default: none.
	Logger *slog.Logger
	// Observer is called once per operation. Default: none.
	Observer Observer
	// KeyHasher hashes keys for errors, the Logger and the Observer.
	// Default: a random secret per process.
	KeyHasher *KeyHasher
	// RevealKeys makes errors and log lines name keys as they are (quoted)
	// instead of by their hash, for debugging. Keys may carry personal
	// data: leave it off in production. Default false.
	RevealKeys bool
	// Prefix begins every Redis key name, so that idem's keys can share a
	// Redis with others. No '{' or '}'. Default "idem:".
	Prefix string
	// AllowEviction accepts a Redis whose maxmemory-policy may evict keys
	// (an evicted record is work done twice). It only allows eviction: the
	// other checks of first contact still run. Default false: refused
	// (ErrEviction).
	AllowEviction bool
	// AutoPipeline sends the calls of concurrent goroutines to Redis
	// together, one pipeline per connection (see the package documentation,
	// Automatic pipelining). A lone call is sent at once. Default false.
	AutoPipeline bool
	// WaitReplicas makes Confirm wait, in the same round trip, until this
	// many replicas have the confirmation; fewer within WaitTimeout is
	// ErrNotReplicated, the confirmation recorded on the master. Not
	// negative, and not above the replicas a master has when first
	// contacted (ErrTooFewReplicas). Default 0: no wait.
	WaitReplicas int
	// WaitTimeout bounds the wait for replicas; shorter than the client's
	// ReadTimeout, and only with WaitReplicas. Default 1s when WaitReplicas
	// is set.
	WaitTimeout time.Duration
}

// options returns the settings o shares with every store.
func (o RedisOptions) options() Options {
	return Options{Retention: o.Retention, LeaseTTL: o.LeaseTTL, Worker: o.Worker,
		MaxKeyBytes: o.MaxKeyBytes, MaxResultBytes: o.MaxResultBytes, Logger: o.Logger,
		Observer: o.Observer, KeyHasher: o.KeyHasher, RevealKeys: o.RevealKeys}
}

// DefaultWaitTimeout is RedisOptions.WaitTimeout's default.
const DefaultWaitTimeout = time.Second

// ErrNotReplicated is wrapped by the error of a Confirm (or of a
// ConfirmBatch item) made with RedisOptions.WaitReplicas when fewer replicas
// than asked acknowledged the confirmation in time. The confirmation IS
// recorded on the master, and duplicates are answered with it; but should
// the master fail before a replica has it, the failover loses it and the
// work may be done again. The caller decides: accept the risk, or Confirm
// again (a repeated Confirm of the same lease changes nothing and waits
// again).
var ErrNotReplicated = errors.New("idem: not replicated")

// RedisStore is a Store and Batcher on Redis: one Redis string per key, one
// Lua script per operation, Redis TTLs for lease expiry and retention.
//
// It works on a single Redis (*redis.Client), on Sentinel
// (redis.NewFailoverClient) and on Redis Cluster (*redis.ClusterClient). The
// Redis key of an idempotency key is Prefix + "{" + escaped key + "}": the
// escaping (bytes other than printable ASCII, and '%', '{', '}', become %XX)
// is injective and keeps braces out of the hash tag.
//
// Each operation is one round trip. Redis replicates asynchronously: a
// failover can lose a record written just before it (see the package
// documentation).
type RedisStore struct {
	c      redis.UniversalClient
	core   Core
	prefix string

	// Script arguments that never change, converted to interface values
	// once rather than on every call.
	leaseMs, retentionMs any
	attemptPrefix        string
	attempts             atomic.Uint64

	auto *autoPipe // nil unless RedisOptions.AutoPipeline

	// cluster is c on Redis Cluster, else nil; reloaded is when the store
	// last asked it to reload its slot map (UnixNano), see reloadSlots.
	cluster  *redis.ClusterClient
	reloaded atomic.Int64

	waitReplicas  int // RedisOptions.WaitReplicas
	waitTimeout   time.Duration
	allowEviction bool

	probe probe // the server's check on first contact
}

// NewRedisStore returns a store on c. It does no I/O, so a service can
// start before its Redis: the server is checked on first contact (see
// Check), and every call fails with the named finding until the server is
// fit. Invalid options are errors naming the field: negative durations,
// braces in the prefix, WaitTimeout without WaitReplicas, limits beyond
// what a Redis string can hold.
func NewRedisStore(c redis.UniversalClient, o RedisOptions) (*RedisStore, error) {
	if c == nil || isNilClient(c) {
		return nil, errors.New("idem: NewRedisStore with a nil client")
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	core, err := newCore("RedisStore Prefix "+strconv.Quote(o.Prefix), o.options())
	if err != nil {
		return nil, err
	}
	opts := core.o
	if strings.ContainsAny(o.Prefix, "{}") {
		return nil, badopt.Error("idem", "Prefix", o.Prefix, "must not contain '{' or '}' (the hash tag after it is idem's)")
	}
	if o.WaitReplicas < 0 {
		return nil, badopt.Default("idem", "WaitReplicas", o.WaitReplicas, "no wait", "is negative")
	}
	if o.WaitTimeout < 0 {
		return nil, badopt.Default("idem", "WaitTimeout", o.WaitTimeout, DefaultWaitTimeout, "is negative")
	}
	if o.WaitTimeout > 0 && o.WaitReplicas == 0 {
		return nil, badopt.Error("idem", "WaitTimeout", o.WaitTimeout, "is set without WaitReplicas; set WaitReplicas, or leave WaitTimeout 0")
	}
	// A record is one Redis string, whose size the server bounds
	// (proto-max-bulk-len, 512 MiB by default): a limit above it would
	// accept a result that no Confirm can write.
	if opts.MaxResultBytes > maxRedisResult {
		return nil, badopt.Error("idem", "MaxResultBytes", opts.MaxResultBytes,
			"exceeds %d, what a Redis string holds with the record around it", maxRedisResult)
	}
	if maxKey := (maxRedisString - len(o.Prefix) - 2) / 3; opts.MaxKeyBytes > maxKey {
		return nil, badopt.Error("idem", "MaxKeyBytes", opts.MaxKeyBytes, "exceeds %d, what a Redis key name holds once escaped", maxKey)
	}
	if o.WaitReplicas > 0 {
		if o.WaitTimeout == 0 {
			o.WaitTimeout = DefaultWaitTimeout
		}
		if o.WaitTimeout < time.Millisecond {
			// WAIT counts milliseconds, and WAIT 0 would wait forever.
			return nil, badopt.Error("idem", "WaitTimeout", o.WaitTimeout, "is under 1ms")
		}
		if rt := readTimeout(c); rt > 0 && o.WaitTimeout >= rt {
			return nil, badopt.Error("idem", "WaitTimeout", o.WaitTimeout, "must be shorter than the client's ReadTimeout %v, "+
				"or reading WAIT's reply would time out first", rt)
		}
	}
	var seed [8]byte
	_, _ = rand.Read(seed[:]) // crypto/rand.Read never fails (Go 1.24+)
	s := &RedisStore{
		c:             c,
		core:          core,
		prefix:        o.Prefix,
		leaseMs:       strconv.FormatInt(opts.LeaseTTL.Milliseconds(), 10),
		retentionMs:   strconv.FormatInt(opts.Retention.Milliseconds(), 10),
		attemptPrefix: hex.EncodeToString(seed[:]) + ".",
	}
	if o.AutoPipeline {
		s.auto = &autoPipe{s: s}
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		s.cluster = cc
	}
	if o.WaitReplicas > 0 {
		s.waitReplicas, s.waitTimeout = o.WaitReplicas, o.WaitTimeout
	}
	s.allowEviction = o.AllowEviction
	s.probe.gate = make(chan struct{}, 1)
	return s, nil
}

// isNilClient reports a typed nil pointer in c: a nil *redis.Client passed as
// a UniversalClient is not == nil, and would panic on first use.
func isNilClient(c redis.UniversalClient) bool {
	switch c := c.(type) {
	case *redis.Client:
		return c == nil
	case *redis.ClusterClient:
		return c == nil
	case *redis.Ring:
		return c == nil
	}
	return false
}

// readTimeout is c's ReadTimeout, or 0 where it is unknown or unbounded.
func readTimeout(c redis.UniversalClient) time.Duration {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().ReadTimeout
	case *redis.ClusterClient:
		return c.Options().ReadTimeout
	}
	return 0
}

// appendAttempt appends a new attempt id to b: unique to this store
// instance and call.
func (s *RedisStore) appendAttempt(b []byte) []byte {
	b = append(b, s.attemptPrefix...)
	return strconv.AppendUint(b, s.attempts.Add(1), 36)
}

// run runs script on key's record and returns its reply: at once, or with
// AutoPipeline in the next pipeline. A confirm with WaitReplicas is followed
// by WAIT in the same pipeline; waitErr is its verdict.
func (s *RedisStore) run(ctx context.Context, script *luaScript, key string, args ...any) (v any, waitErr, err error) {
	if err := s.ready(ctx); err != nil {
		return nil, nil, err
	}
	if s.auto != nil {
		return s.auto.do(ctx, script, s.redisKey(key), args)
	}
	return s.runNow(ctx, script, s.redisKey(key), args)
}

// runNow runs script on key (a Redis key) at once, as one command; a
// confirm with WaitReplicas is followed by WAIT in the same pipeline, and
// waitErr is its verdict.
func (s *RedisStore) runNow(ctx context.Context, script *luaScript, key string, args []any) (v any, waitErr, err error) {
	if s.waitReplicas > 0 && (scriptCall{script: script}).confirms() {
		cmds, waitErrs := s.pipeline(ctx, []scriptCall{{script: script, keys: []string{key}, args: args}})
		v, err := cmds[0].Result()
		return v, waitErrs[0], err
	}
	v, err = s.eval(ctx, script, key, args)
	return v, nil, err
}

// eval runs script on key (a Redis key) with args as one EVALSHA. When
// the server lost its scripts (NOSCRIPT: SCRIPT FLUSH, a restart, a
// failover to a replica that never loaded them), the script is loaded
// again with SCRIPT LOAD and the call sent again: it had not run.
func (s *RedisStore) eval(ctx context.Context, script *luaScript, key string, args []any) (any, error) {
	sha := script.digest()
	if sha == nil {
		if err := s.loadScript(ctx, script); err != nil {
			return nil, err
		}
		sha = script.digest()
	}
	v, err := s.evalAs(ctx, sha, key, args)
	for range scriptReloads {
		if err == nil || !redis.HasErrorPrefix(err, "NOSCRIPT") {
			break
		}
		if err := s.loadScript(ctx, script); err != nil {
			return nil, err
		}
		v, err = s.evalAs(ctx, sha, key, args)
	}
	return v, err
}

// scriptReloads bounds how often one call loads its script again and
// resends: a SCRIPT FLUSH can land between a SCRIPT LOAD and the EVALSHA
// after it (a test flushing every 10 ms met that), and a call gives up only
// when flushes keep winning.
const scriptReloads = 5

// loadScript loads one script with SCRIPT LOAD (on every node of a
// cluster) and keeps the digest the server answered.
func (s *RedisStore) loadScript(ctx context.Context, script *luaScript) error {
	sha, err := s.c.ScriptLoad(ctx, script.src).Result()
	if err != nil {
		return fmt.Errorf("idem: SCRIPT LOAD of %s.lua: %w", script.name, scriptsRefused(err))
	}
	script.sha.Store(any(sha))
	return nil
}

// evalAs sends one EVALSHA of sha (a boxed digest) on key with args. The
// verdict is read from the command, not from Process's return: a client
// that queues commands (go-redis's AutoPipeliner) returns from Process
// before the reply, and the command then holds both.
func (s *RedisStore) evalAs(ctx context.Context, sha any, key string, args []any) (any, error) {
	cmdArgs := make([]any, 0, 4+len(args))
	cmdArgs = append(cmdArgs, "evalsha", sha, 1, key)
	cmdArgs = append(cmdArgs, args...)
	cmd := redis.NewCmd(ctx, cmdArgs...)
	cmd.SetFirstKeyPos(3) // for a cluster's routing, as go-redis's EvalSha does
	_ = s.c.Process(ctx, cmd)
	v, err := cmd.Result()
	s.reloadSlots(err)
	return v, err
}

// slotReloadGap is the least time between two slot-map reloads a store
// asks of its ClusterClient (see reloadSlots).
const slotReloadGap = 250 * time.Millisecond

// reloadSlots asks a ClusterClient to reload its slot map, at most once per
// slotReloadGap, when a call failed without an answer from Redis (a refused
// or broken connection, a timeout) or with CLUSTERDOWN. go-redis reloads
// the map only on MOVED or ASK, or every ClusterStateReloadInterval (60s by
// default); a dead master never answers MOVED, so after a failover its
// callers kept failing for 46 s after the replica's promotion (issue 20).
// The reload runs in the background (ReloadState); calls made meanwhile
// still go by the old map.
func (s *RedisStore) reloadSlots(err error) {
	if s.cluster == nil || !unanswered(err) {
		return
	}
	now := time.Now().UnixNano()
	last := s.reloaded.Load()
	if now-last < int64(slotReloadGap) || !s.reloaded.CompareAndSwap(last, now) {
		return
	}
	s.cluster.ReloadState(context.Background())
}

// unanswered reports an error that may mean the node serving the call is
// gone, or no longer serves its slot: anything but a reply from Redis
// (CLUSTERDOWN excepted), a missing key, or the caller's cancellation.
func unanswered(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, context.Canceled) {
		return false
	}
	var reply redis.Error
	if errors.As(err, &reply) {
		return redis.HasErrorPrefix(err, "CLUSTERDOWN")
	}
	return true
}

// Claim implements Store in one round trip. Should go-redis retry the
// command after a lost reply, the retry carries the same attempt id and gets
// the same lease back.
func (s *RedisStore) Claim(ctx context.Context, key string, fingerprint []byte) (c Claim, err error) {
	start := time.Now()
	defer func() {
		s.core.Observe(ctx, Event{Op: OpClaim, Outcome: c.Outcome, TakeOver: c.TakeOver, Err: err}, key, start)
	}()
	if err := s.core.CheckClaim(key, fingerprint); err != nil {
		return Claim{}, err
	}
	sent, err := s.contact(ctx, start)
	if err != nil {
		return Claim{}, s.fail("claim", key, err)
	}
	var buf [40]byte
	v, _, err := s.run(ctx, claimScript, key, s.leaseMs, claimTail(s.core.o.Worker, s.appendAttempt(buf[:0]), fingerprint))
	if err != nil {
		return Claim{}, s.fail("claim", key, err)
	}
	return s.parseClaim(key, fingerprint, sent, v)
}

// fail wraps a Redis error with the operation and key. The operation's
// event logs it (see Options.observe), with the key's hash in the error.
func (s *RedisStore) fail(op, key string, err error) error {
	return fmt.Errorf("idem: %s of %s: %w", op, s.core.KeyName(key), err)
}

// Renew implements Store in one round trip.
func (s *RedisStore) Renew(ctx context.Context, l *Lease) (err error) {
	start := time.Now()
	defer func() { s.core.Observe(ctx, Event{Op: OpRenew, Err: err}, leaseKey(l), start) }()
	if err := s.core.CheckLease(l); err != nil {
		return err
	}
	v, _, err := s.run(ctx, renewScript, l.Key, heldPrefix(l), s.leaseMs)
	if err != nil {
		return s.fail("renew", l.Key, err)
	}
	if damaged(v) {
		return s.errDamaged("renew", l.Key)
	}
	n, ok := v.(int64)
	if !ok {
		return s.badReply("renew", l.Key, v)
	}
	if n != 1 {
		return s.core.LeaseLost("renew", l)
	}
	return nil
}

// Confirm implements Store in one round trip.
func (s *RedisStore) Confirm(ctx context.Context, l *Lease, result []byte) (err error) {
	start := time.Now()
	late := false
	defer func() { s.core.Observe(ctx, Event{Op: OpConfirm, Late: late, Err: err}, leaseKey(l), start) }()
	if err := s.core.CheckResult(l, result); err != nil {
		return err
	}
	v, waitErr, err := s.run(ctx, confirmScript, l.Key, s.confirmArgs(l, result)...)
	if err != nil {
		return s.fail("confirm", l.Key, err)
	}
	if late, err = s.confirmed(ctx, l, v); err != nil {
		return err
	}
	if waitErr != nil {
		return fmt.Errorf("idem: confirm of %s: %w", s.core.KeyName(l.Key), waitErr)
	}
	return nil
}

// Forget implements Store in one round trip.
func (s *RedisStore) Forget(ctx context.Context, l *Lease) (err error) {
	start := time.Now()
	defer func() { s.core.Observe(ctx, Event{Op: OpForget, Err: err}, leaseKey(l), start) }()
	if err := s.core.CheckForget(l); err != nil {
		return err
	}
	v, _, err := s.run(ctx, forgetScript, l.Key, heldPrefix(l), strconv.FormatInt(l.Token, 10))
	if err != nil {
		return s.fail("forget", l.Key, err)
	}
	if damaged(v) {
		return s.errDamaged("forget", l.Key)
	}
	n, ok := v.(int64)
	if !ok {
		return s.badReply("forget", l.Key, v)
	}
	if n != 1 {
		return s.core.LeaseLost("forget", l)
	}
	return nil
}

// Lookup implements Store in one round trip.
func (s *RedisStore) Lookup(ctx context.Context, key string) (rec *Record, err error) {
	start := time.Now()
	defer func() { s.core.Observe(ctx, Event{Op: OpLookup, Err: err}, key, start) }()
	if err := s.core.CheckKey(key); err != nil {
		return nil, err
	}
	sent, err := s.contact(ctx, start)
	if err != nil {
		return nil, s.fail("lookup", key, err)
	}
	v, _, err := s.run(ctx, lookupScript, key)
	if errors.Is(err, redis.Nil) {
		return nil, s.core.NotFound(key)
	}
	if err != nil {
		return nil, s.fail("lookup", key, err)
	}
	if damaged(v) {
		return nil, s.errDamaged("lookup", key)
	}
	a, ok := v.([]any)
	if !ok {
		return nil, s.badReply("lookup", key, v)
	}
	return s.parseRecord(key, sent, a)
}

// MaxResultBytes returns the largest result Confirm accepts (the option
// resolved to its default), so that a wrapper recording responses can
// refuse, where it is configured, a limit the store would not hold.
func (s *RedisStore) MaxResultBytes() int { return s.core.o.MaxResultBytes }
