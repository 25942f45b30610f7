package idem

// Over 500 lines, one concept: the RedisStore, its options, and each of
// its operations as one call to its script (the operator's ones included);
// what they share lives in the redis*.go files below it.

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
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem/internal/badopt"
	"github.com/idemgo/idem/internal/redisadmin"
	"github.com/redis/go-redis/v9"
)

// DefaultPrefix begins the name of every Redis key a RedisStore writes.
const DefaultPrefix = "idem:"

// RedisOptions configure a RedisStore in one flat literal. The first fields
// are those of Options, with the same meaning and defaults. The zero value
// is valid.
type RedisOptions struct {
	// Retention is how long a confirmed key is remembered. At least
	// LeaseTTL. Default 24h.
	Retention time.Duration
	// LeaseTTL is how long a claim binds unless renewed. At least
	// idem.MinLeaseTTL (500ms), which KeepAlive can renew in time. Default
	// 30s.
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
	// MaxTakeOvers is how many take-overs in a row (claims whose lease ran
	// out unconfirmed, each taken over by the next Claim) a key may have;
	// when the last of them lapses too, the next Claim quarantines the key
	// instead of running the work once more. Not negative. Default 3.
	MaxTakeOvers int
	// Prefix begins every Redis key name, so that idem's keys can share a
	// Redis with others. No '{' or '}'. Default "idem:".
	Prefix string
	// AllowEviction accepts a Redis whose maxmemory-policy may evict keys
	// (an evicted record is work done twice). It only allows eviction: the
	// other checks of first contact still run. Default false: refused
	// (ErrEviction).
	AllowEviction bool
	// NoAutoPipeline sends each call at once on its own, instead of
	// sending the calls of concurrent goroutines to Redis together, one
	// pipeline per connection (see the package documentation, Automatic
	// pipelining). A lone call is sent at once either way, so it costs no
	// latency; turn it off only to rule it out. Default false: on.
	NoAutoPipeline bool
	// LongConfirmations writes every confirmation in the long form
	// (1D<token>:<#fingerprint>:<fingerprint><result>, scripts/record.lua),
	// which releases before the short form can read. By default a
	// confirmation without fingerprint or result, a consumer's, is its
	// token alone, a number Redis keeps in the key's own object: 15 to 36
	// bytes less per record, by server (docs/BENCHMARKS.md, Records at
	// scale). Set it while processes of an earlier release share
	// the store (a rolling upgrade): they would find the short form damaged.
	// Both forms are read either way. Default false: the short form.
	LongConfirmations bool
	// FieldHashes, when above 0, keeps each short confirmation (no
	// fingerprint, no result: a consumer's) as a field with its own TTL in
	// one of FieldHashes hashes per Cluster hash slot (16,384 slots, on one
	// Redis too), instead of as a key of its own: 72 bytes a record instead
	// of 173 on Redis 8.0 (docs/BENCHMARKS.md, Records at scale). A hash
	// stays compact up to 128 fields (Redis's hash-max-listpack-entries):
	// set it to the live records expected over 1,600,000, rounded up. Only
	// where the server has HSETEX (Redis 8.0, Valkey 9.0); elsewhere
	// confirmations stay keys, at one HGET more per claim.
	//
	// The first store with it writes the Prefix's form key (Prefix +
	// "fields"), which every store sharing the Prefix reads at first
	// contact and again before a claim or lookup when a second has passed,
	// with FieldHashes or not: all of them then find and keep confirmations
	// as fields, and a store whose FieldHashes differs from the key's is
	// refused (ErrFieldHashes). A store that cannot read the key for 2s
	// fails its claims and lookups rather than go by an old form. Fields
	// are first written 5s after the key, once every store has read it. Once
	// set, the form stays: deleting the key while fields live makes their
	// work repeatable. Releases before this one read no field: set it once
	// every process sharing the Prefix runs this one. Not negative, at most
	// 65,536. Default 0: keys, unless the form key says otherwise.
	FieldHashes int
	// AutoPipeline is the default now, and false does not turn it off.
	//
	// Deprecated: automatic pipelining is on unless NoAutoPipeline is set.
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

// RedisOptionsFrom returns RedisOptions with the fields of o, the options
// every store shares; the Redis-only fields are left zero for the caller
// to set. It serves code that holds the shared options, as a storetest
// Backend's Open does.
func RedisOptionsFrom(o Options) RedisOptions {
	return RedisOptions{Retention: o.Retention, LeaseTTL: o.LeaseTTL, Worker: o.Worker,
		MaxKeyBytes: o.MaxKeyBytes, MaxResultBytes: o.MaxResultBytes, Logger: o.Logger,
		Observer: o.Observer, KeyHasher: o.KeyHasher, RevealKeys: o.RevealKeys, MaxTakeOvers: o.MaxTakeOvers}
}

// options returns the settings o shares with every store.
func (o RedisOptions) options() Options {
	return Options{Retention: o.Retention, LeaseTTL: o.LeaseTTL, Worker: o.Worker,
		MaxKeyBytes: o.MaxKeyBytes, MaxResultBytes: o.MaxResultBytes, Logger: o.Logger,
		Observer: o.Observer, KeyHasher: o.KeyHasher, RevealKeys: o.RevealKeys, MaxTakeOvers: o.MaxTakeOvers}
}

// maxFieldHashes bounds RedisOptions.FieldHashes: a billion hashes.
const maxFieldHashes = 1 << 16

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
	// claimMs is a claim's TTL, its lease and then Retention more, for
	// which a lapsed claim is kept so that the next claim is told it takes
	// over (see scripts/record.lua: the claim's keep); keep is Retention
	// as the record writes it, maxTakeOvers Options.MaxTakeOvers.
	claimMs, maxTakeOvers any
	keep                  string
	attemptPrefix         string
	attempts              atomic.Uint64

	auto *autoPipe // nil with RedisOptions.NoAutoPipeline

	// cluster is c on Redis Cluster, else nil; reloaded is when the store
	// last asked it to reload its slot map (UnixNano), see reloadSlots.
	cluster  *redis.ClusterClient
	reloaded atomic.Int64

	longConfirmations bool // RedisOptions.LongConfirmations
	fieldHashes       int  // RedisOptions.FieldHashes
	// form is how confirmations are kept, as the form's key said when
	// last read (nil: as keys); formRead is when it was last read
	// (UnixNano), formGate lets one reading run at a time. See readForm
	// and rereadForm.
	form      atomic.Pointer[fieldForm]
	formRead  atomic.Int64
	formGate  chan struct{}
	formGrace time.Duration // formGrace when the store was made

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
	if err := checkAddrs(c); err != nil {
		return nil, err
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
	if o.FieldHashes < 0 || o.FieldHashes > maxFieldHashes {
		return nil, badopt.Error("idem", "FieldHashes", o.FieldHashes, "must be within 0 (confirmations as keys) and %d", maxFieldHashes)
	}
	if o.AutoPipeline && o.NoAutoPipeline {
		return nil, badopt.Error("idem", "NoAutoPipeline", o.NoAutoPipeline, "contradicts AutoPipeline true; set one of them")
	}
	var seed [8]byte
	_, _ = rand.Read(seed[:]) // crypto/rand.Read never fails (Go 1.24+)
	s := &RedisStore{
		c:             c,
		core:          core,
		prefix:        o.Prefix,
		leaseMs:       strconv.FormatInt(opts.LeaseTTL.Milliseconds(), 10),
		retentionMs:   strconv.FormatInt(opts.Retention.Milliseconds(), 10),
		claimMs:       strconv.FormatInt((opts.LeaseTTL + opts.Retention).Milliseconds(), 10),
		maxTakeOvers:  strconv.Itoa(opts.MaxTakeOvers),
		keep:          strconv.FormatInt(opts.Retention.Milliseconds(), 10),
		attemptPrefix: hex.EncodeToString(seed[:]) + ".",
	}
	if !o.NoAutoPipeline {
		s.auto = &autoPipe{s: s}
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		s.cluster = cc
	}
	if o.WaitReplicas > 0 {
		s.waitReplicas, s.waitTimeout = o.WaitReplicas, o.WaitTimeout
	}
	s.allowEviction = o.AllowEviction
	s.longConfirmations = o.LongConfirmations
	s.fieldHashes, s.formGrace, s.formGate = o.FieldHashes, formGrace, make(chan struct{}, 1)
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
// automatic pipelining in the next pipeline. A confirm with WaitReplicas is followed
// by WAIT in the same pipeline; waitErr is its verdict. The caller has
// passed its gate of first contact (contact or leaseReady).
func (s *RedisStore) run(ctx context.Context, script *luaScript, key string, args ...any) (v any, waitErr, err error) {
	hash := ""
	if script.hashed {
		hash = s.fieldHash(s.form.Load(), key, script == confirmScript)
	}
	if s.auto != nil {
		return s.auto.do(ctx, script, s.redisKey(key), hash, args)
	}
	return s.runNow(ctx, script, s.redisKey(key), hash, args)
}

// Claim implements Store in one round trip. Should go-redis retry the
// command after a lost reply, the retry carries the same attempt id and gets
// the same lease back.
func (s *RedisStore) Claim(ctx context.Context, key string, fingerprint []byte) (c Claim, err error) {
	start := time.Now()
	defer func() {
		s.core.Observe(ctx, Event{Op: OpClaim, Outcome: c.Outcome, TakeOver: c.TakeOver, Prior: c.Prior, Err: err}, key, start)
	}()
	if err := s.core.CheckClaim(key, fingerprint); err != nil {
		return Claim{}, err
	}
	sent, err := s.contact(ctx, start)
	if err != nil {
		return Claim{}, s.fail("claim", key, err)
	}
	var buf [40]byte
	v, _, err := s.run(ctx, claimScript, key, s.claimMs, s.maxTakeOvers, claimTail(s.core.o.Worker, s.appendAttempt(buf[:0]), s.keep, fingerprint))
	if err != nil {
		return Claim{}, s.fail("claim", key, err)
	}
	return s.parseClaim(key, fingerprint, sent, v)
}

// fail wraps a Redis error with the operation and key. The operation's
// event logs it (see Core.Observe), with the key's hash in the error.
func (s *RedisStore) fail(op, key string, err error) error {
	if strings.HasPrefix(err.Error(), "idem: ") {
		err = prefixless{err}
	}
	return fmt.Errorf("idem: %s of %s: %w", op, s.core.KeyName(key), err)
}

// prefixless is err with the "idem: " its text begins with dropped, inside
// a message that says it once already ("idem: claim of key#…: cannot reach
// Redis …", not "…: idem: cannot reach …"); errors.Is and As still find
// err.
type prefixless struct{ err error }

func (p prefixless) Error() string { return strings.TrimPrefix(p.err.Error(), "idem: ") }
func (p prefixless) Unwrap() error { return p.err }

// Renew implements Store in one round trip.
func (s *RedisStore) Renew(ctx context.Context, l *Lease) (err error) {
	start := time.Now()
	defer func() { s.core.Observe(ctx, Event{Op: OpRenew, Err: err}, leaseKey(l), start) }()
	if err := s.core.CheckLease(l); err != nil {
		return err
	}
	if err := s.leaseReady(ctx); err != nil {
		return s.fail("renew", l.Key, err)
	}
	v, _, err := s.run(ctx, renewScript, l.Key, heldPrefix(l), s.claimMs, s.retentionMs)
	if err != nil {
		return s.fail("renew", l.Key, err)
	}
	return s.held(OpRenew, l, v)
}

// Confirm implements Store in one round trip.
func (s *RedisStore) Confirm(ctx context.Context, l *Lease, result []byte) (err error) {
	start := time.Now()
	late := false
	defer func() { s.core.Observe(ctx, Event{Op: OpConfirm, Late: late, Err: err}, leaseKey(l), start) }()
	if err := s.core.CheckResult(l, result); err != nil {
		return err
	}
	if err := s.leaseReady(ctx); err != nil {
		return s.fail("confirm", l.Key, err)
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
	if err := s.leaseReady(ctx); err != nil {
		return s.fail("forget", l.Key, err)
	}
	v, _, err := s.run(ctx, forgetScript, l.Key, heldPrefix(l), strconv.FormatInt(l.Token, 10), s.retentionMs)
	if err != nil {
		return s.fail("forget", l.Key, err)
	}
	return s.held(OpForget, l, v)
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

// Inspect implements Inspector in one round trip: lookup.lua, asked for a
// lapsed claim too.
func (s *RedisStore) Inspect(ctx context.Context, key string) (*Record, error) {
	if err := s.core.CheckKey(key); err != nil {
		return nil, err
	}
	sent, err := s.contact(ctx, time.Now())
	if err != nil {
		return nil, s.fail("inspect", key, err)
	}
	v, _, err := s.run(ctx, lookupScript, key, "lapsed")
	if errors.Is(err, redis.Nil) {
		return nil, s.core.NotFound(key)
	}
	if err != nil {
		return nil, s.fail("inspect", key, err)
	}
	if damaged(v) {
		return nil, s.errDamaged("inspect", key)
	}
	a, ok := v.([]any)
	if !ok {
		return nil, s.badReply("inspect", key, v)
	}
	if st, _ := a[0].(string); st != replyLapsed {
		return s.parseRecord(key, sent, a)
	}
	// {'L', pttl, the claim's record}: the key lives pttl more.
	pttl, ok1 := a[1].(int64)
	inner, ok2 := a[2].([]any)
	if len(a) != 3 || !ok1 || !ok2 {
		return nil, s.badReply("inspect", key, v)
	}
	rec, err := s.parseRecord(key, sent, inner)
	if err != nil {
		return nil, err
	}
	// Tokens are the server's clock in microseconds when claimed.
	rec.Lapsed = &Attempt{Owner: rec.Owner, Token: rec.Token, Claimed: time.UnixMicro(rec.Token), Ended: rec.Ended}
	rec.Expires = sent.Add(time.Duration(pttl) * time.Millisecond)
	return rec, nil
}

// Checkpoint implements Checkpointer in one round trip.
func (s *RedisStore) Checkpoint(ctx context.Context, l *Lease, data []byte) (err error) {
	start := time.Now()
	defer func() { s.core.Observe(ctx, Event{Op: OpCheckpoint, Err: err}, leaseKey(l), start) }()
	if err := s.core.CheckCheckpoint(l, data); err != nil {
		return err
	}
	return s.runCheckpoint(ctx, OpCheckpoint, l, data)
}

// Abandon implements Abandoner in one round trip (checkpoint.lua, which
// records the reason in the claim's attempt field).
func (s *RedisStore) Abandon(ctx context.Context, l *Lease, reason string) (err error) {
	start := time.Now()
	defer func() { s.core.Observe(ctx, Event{Op: OpAbandon, Err: err}, leaseKey(l), start) }()
	if err := s.core.CheckAbandon(l, reason); err != nil {
		return err
	}
	if err := s.runCheckpoint(ctx, OpAbandon, l, reason, "ended"); err != nil {
		return err
	}
	s.core.LogAbandoned(ctx, l, reason)
	return nil
}

// runCheckpoint runs checkpoint.lua on l's own live claim with args
// after its own (the checkpoint; or the reason and 'ended'): ErrLeaseLost
// when l holds no live claim.
func (s *RedisStore) runCheckpoint(ctx context.Context, op Op, l *Lease, args ...any) error {
	if err := s.leaseReady(ctx); err != nil {
		return s.fail(op.String(), l.Key, err)
	}
	v, _, err := s.run(ctx, checkpointScript, l.Key, append([]any{heldPrefix(l), s.retentionMs}, args...)...)
	if err != nil {
		return s.fail(op.String(), l.Key, err)
	}
	return s.held(op, l, v)
}

// held reads the answer of a script that acts only on l's own live claim
// (renew, forget, checkpoint, abandon): 1 done, 0 ErrLeaseLost.
func (s *RedisStore) held(op Op, l *Lease, v any) error {
	if damaged(v) {
		return s.errDamaged(op.String(), l.Key)
	}
	n, ok := v.(int64)
	if !ok {
		return s.badReply(op.String(), l.Key, v)
	}
	if n != 1 {
		return s.core.LeaseLost(op, l)
	}
	return nil
}

// Resolve implements Resolver in one round trip.
func (s *RedisStore) Resolve(ctx context.Context, key string, r Resolution) (err error) {
	start := time.Now()
	defer func() { s.core.Observe(ctx, Event{Op: OpResolve, Err: err}, key, start) }()
	if err := s.core.CheckResolve(key, r); err != nil {
		return err
	}
	if _, err := s.contact(ctx, start); err != nil {
		return s.fail("resolve", key, err)
	}
	args := []any{"forget", s.leaseMs, ""}
	switch {
	case r.Confirm:
		args = []any{"confirm", s.retentionMs, r.Result}
	case r.Force:
		args = []any{"clear", s.leaseMs, ""}
	}
	v, _, err := s.run(ctx, resolveScript, key, args...)
	if err != nil {
		return s.fail("resolve", key, err)
	}
	if damaged(v) {
		return s.errDamaged("resolve", key)
	}
	switch n, _ := v.(int64); {
	case n == 1:
		return nil
	case n == 0 && r.Force:
		return s.core.NothingToClear(key)
	case n == 0:
		return s.core.NotQuarantined(key)
	case n == 2 && r.Force:
		return s.core.LiveClaim(key)
	}
	return s.badReply("resolve", key, v)
}

// Quarantined implements Resolver: a SCAN of the store's keys (on every
// master of a cluster), each quarantined one read as Lookup reads it. It
// reads the whole keyspace under the Prefix, a cost for an operator's
// command, not for a request path.
func (s *RedisStore) Quarantined(ctx context.Context, limit int) ([]*Record, error) {
	if _, err := s.contact(ctx, time.Now()); err != nil {
		return nil, fmt.Errorf("idem: quarantined: %w", err)
	}
	var (
		mu  sync.Mutex
		out []*Record
	)
	full := func() bool { return limit > 0 && len(out) >= limit }
	scan := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, escapeGlob(s.prefix)+"{*}", quarantineScan).Iterator()
		names := make([]string, 0, quarantineScan)
		for more := true; more; {
			names = names[:0]
			for len(names) < quarantineScan && iter.Next(ctx) {
				names = append(names, iter.Val())
			}
			more = len(names) == quarantineScan
			// The state of a page of keys in one round trip (its first two
			// bytes, not a whole record); only a quarantined one ("2Q") is
			// read again, by the lookup script that answers it as Lookup
			// does.
			cmds, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, name := range names {
					p.GetRange(ctx, name, 0, 1)
				}
				return nil
			})
			if err != nil && !errors.Is(err, redis.Nil) {
				return err
			}
			var keys []string
			for i, cmd := range cmds {
				if key, ok := s.userKey(names[i]); ok && cmd.(*redis.StringCmd).Val() == "2Q" {
					keys = append(keys, key)
				}
			}
			// The page's quarantined keys are read concurrently: the
			// automatic pipeline sends them in a few round trips, where
			// one by one, 1,000 keys took 1,000 (0.7 s for idem console's
			// list on a loaded machine; issue 45).
			if limit > 0 {
				// No more reads than the limit can take; a key settled
				// meanwhile makes the answer one short, as a SCAN of a
				// changing keyspace may be.
				mu.Lock()
				keys = keys[:min(len(keys), max(limit-len(out), 0))]
				mu.Unlock()
			}
			recs, errs := make([]*Record, len(keys)), make([]error, len(keys))
			var wg sync.WaitGroup
			sem := make(chan struct{}, quarantineLookups)
			for i, key := range keys {
				sem <- struct{}{}
				wg.Go(func() {
					defer func() { <-sem }()
					recs[i], errs[i] = s.Lookup(ctx, key)
				})
			}
			wg.Wait()
			for i, rec := range recs {
				if errors.Is(errs[i], ErrNotFound) {
					continue
				}
				if errs[i] != nil {
					return errs[i]
				}
				mu.Lock()
				if rec.Quarantined && !full() {
					out = append(out, rec)
				}
				done := full()
				mu.Unlock()
				if done {
					return nil
				}
			}
		}
		return iter.Err()
	}
	err := redisadmin.EachMaster(ctx, s.c, scan)
	if err != nil {
		return out, fmt.Errorf("idem: quarantined: %w", err)
	}
	return out, nil
}

// quarantineScan is how many keys one SCAN step of Quarantined asks for,
// and one pipeline reads the state of.
const quarantineScan = 256

// quarantineLookups bounds the Lookups Quarantined has in flight at once:
// a whole page of the SCAN, so that a page costs a round trip or two.
const quarantineLookups = quarantineScan

// MaxResultBytes returns the largest result Confirm accepts (the option
// resolved to its default), so that a wrapper recording responses can
// refuse, where it is configured, a limit the store would not hold.
func (s *RedisStore) MaxResultBytes() int { return s.core.o.MaxResultBytes }
