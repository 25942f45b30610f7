package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
)

// Names of the contenders that others are compared with. "(defaults)" is
// a RedisStore with no options but the benchmark's Retention: what a user
// gets without tuning (automatic pipelining on). The other idem contenders
// each change one thing from it.
const (
	NameClaimConfirm         = "idem (defaults) Claim+Confirm"
	NameReplayClaim          = "idem (defaults) replay"
	NameMix                  = "idem (defaults) 80% duplicates"
	NameNoAutoPipeline       = "idem NoAutoPipeline Claim+Confirm"
	NameLongConfirmations    = "idem LongConfirmations Claim+Confirm"
	NameFieldHashes          = "idem FieldHashes Claim+Confirm"
	NameFieldHashesReplay    = "idem FieldHashes replay"
	NameNoAutoPipelineReplay = "idem NoAutoPipeline replay"
	NameNoAutoPipelineMix    = "idem NoAutoPipeline 80% duplicates"
	NameCacheReplayClaim     = "idem + Cache replay"
	NameCacheMix             = "idem + Cache 80% duplicates"
	NameBatch                = "idem batch(100) ClaimBatch+ConfirmBatch"
	NameSetFloor             = "SET NX PX + SET XX PX"
	NameRedislock            = "redislock Obtain+Release"
	NameScriptFloor          = "script floor: TIME, SET NX + GET, SET"
	NameCheckThenSet         = "GET, SET PX + SET PX (not atomic)"
	NameClusterClaimConfirm  = "idem (defaults) Claim+Confirm (cluster)"
	NameClusterSetFloor      = "SET NX PX + SET XX PX (cluster)"
	NameSQLLease             = "idem sqlstore Claim+Confirm"
	NameSQLRun               = "idem sqlstore Run"
	NameSQLFloor             = "INSERT ON CONFLICT DO NOTHING + UPDATE"
	NameBare                 = "bare handler"
	NameFirstWrite           = "middleware first write"
	NameReplay               = "middleware replay"
	NameReplayMemory         = "middleware replay (MemoryStore)"
	NameReplayCache          = "middleware replay (Cache)"
)

// The durations every Redis contender writes with: a claim binds for
// leaseTTL, a confirmation is kept for retention. The retention is short
// so that a benchmark's records leave a shared Redis by themselves; the
// odd millisecond makes go-redis send PX, as idem's scripts do.
const (
	leaseTTL  = 30*time.Second + time.Millisecond
	retention = 2*time.Minute + time.Millisecond
)

// Contenders is the table of everything `idem bench` measures, in report
// order within each group.
var Contenders = []Contender{
	{
		Name: NameClaimConfirm, Group: GroupRedis, Redis: true,
		Versus: []string{NameNoAutoPipeline, NameLongConfirmations, NameFieldHashes, NameSetFloor, NameScriptFloor, NameRedislock},
		Open: func(ctx context.Context, e *Env) (*Instance, error) {
			s, err := newRedisStore(e.Redis)
			if err != nil {
				return nil, err
			}
			return ClaimConfirm(e, s, "cc"), nil
		},
	},
	{
		// Confirmations in the long form, as before the short one: the
		// defaults are divided by it (docs/BENCHMARKS.md, Records at scale).
		Name: NameLongConfirmations, Group: GroupRedis, Redis: true,
		Open: func(ctx context.Context, e *Env) (*Instance, error) {
			s, err := idem.NewRedisStore(e.Redis, idem.RedisOptions{Retention: retention, LongConfirmations: true})
			if err != nil {
				return nil, err
			}
			return ClaimConfirm(e, s, "lc"), nil
		},
	},
	{
		// Confirmations as hash fields (docs/BENCHMARKS.md, Records at
		// scale), against the defaults' keys.
		Name: NameFieldHashes, Group: GroupRedis, Redis: true,
		Open: func(ctx context.Context, e *Env) (*Instance, error) {
			s, err := newFieldStore(ctx, e)
			if err != nil {
				return nil, err
			}
			return ClaimConfirm(e, s, "fc"), nil
		},
	},
	{
		Name: NameFieldHashesReplay, Group: GroupRedis, Redis: true,
		Open: func(ctx context.Context, e *Env) (*Instance, error) {
			s, err := newFieldStore(ctx, e)
			if err != nil {
				return nil, err
			}
			return Replay(e, s, "fr"), nil
		},
	},
	{
		Name: NameReplayClaim, Group: GroupRedis, Redis: true,
		Versus: []string{NameNoAutoPipelineReplay, NameFieldHashesReplay},
		Open: func(ctx context.Context, e *Env) (*Instance, error) {
			s, err := newRedisStore(e.Redis)
			if err != nil {
				return nil, err
			}
			return Replay(e, s, "rc"), nil
		},
	},
	{
		Name: NameMix, Group: GroupRedis, Redis: true,
		Versus: []string{NameNoAutoPipelineMix},
		Open: func(ctx context.Context, e *Env) (*Instance, error) {
			s, err := newRedisStore(e.Redis)
			if err != nil {
				return nil, err
			}
			return Mix(e, s, "mix"), nil
		},
	},
	{
		Name: NameNoAutoPipeline, Group: GroupRedis, Redis: true,
		Versus: []string{NameSetFloor, NameScriptFloor, NameRedislock, NameCheckThenSet},
		Open: func(ctx context.Context, e *Env) (*Instance, error) {
			s, err := newDirectRedisStore(e.Redis)
			if err != nil {
				return nil, err
			}
			return ClaimConfirm(e, s, "nap"), nil
		},
	},
	{
		Name: NameNoAutoPipelineReplay, Group: GroupRedis, Redis: true,
		Open: func(ctx context.Context, e *Env) (*Instance, error) {
			s, err := newDirectRedisStore(e.Redis)
			if err != nil {
				return nil, err
			}
			return Replay(e, s, "naprc"), nil
		},
	},
	{
		Name: NameNoAutoPipelineMix, Group: GroupRedis, Redis: true,
		Open: func(ctx context.Context, e *Env) (*Instance, error) {
			s, err := newDirectRedisStore(e.Redis)
			if err != nil {
				return nil, err
			}
			return Mix(e, s, "napmix"), nil
		},
	},
	{
		// The store is asked once per key and the cache's MaxAge; the
		// other replays are answered from memory.
		Name: NameCacheReplayClaim, Group: GroupRedis, Redis: true,
		Versus: []string{NameReplayClaim},
		Open: func(ctx context.Context, e *Env) (*Instance, error) {
			s, err := newCachedRedisStore(e.Redis)
			if err != nil {
				return nil, err
			}
			return Replay(e, s, "cacherc"), nil
		},
	},
	{
		Name: NameCacheMix, Group: GroupRedis, Redis: true,
		Versus: []string{NameMix},
		Open: func(ctx context.Context, e *Env) (*Instance, error) {
			s, err := newCachedRedisStore(e.Redis)
			if err != nil {
				return nil, err
			}
			return Mix(e, s, "cachemix"), nil
		},
	},
	{
		Name: NameBatch, Group: GroupRedis, Redis: true, Msgs: 100,
		Versus: []string{NameClaimConfirm, NameNoAutoPipeline},
		Open: func(ctx context.Context, e *Env) (*Instance, error) {
			s, err := newRedisStore(e.Redis)
			if err != nil {
				return nil, err
			}
			return Batch(e, s, "batch", 100), nil
		},
	},
	{
		Name: NameSetFloor, Group: GroupRedis, Redis: true,
		Open: func(ctx context.Context, e *Env) (*Instance, error) { return setFloor(e, e.Redis, "set"), nil },
	},
	{
		Name: NameRedislock, Group: GroupRedis, Redis: true,
		Open: func(ctx context.Context, e *Env) (*Instance, error) {
			locks := redislock.New(e.Redis)
			return &Instance{Worker: func() Op {
				return func(ctx context.Context) error {
					key := e.Key("lock")
					l, err := locks.Obtain(ctx, key, leaseTTL, nil)
					if err != nil {
						return fmt.Errorf("Obtain(%q): %w", key, err)
					}
					if err := l.Release(ctx); err != nil {
						return fmt.Errorf("Release(%q): %w", key, err)
					}
					return nil
				}
			}}, nil
		},
	},
	{
		// The least a store with idem's contract can run in Redis: a claim
		// script that reads the server's clock for the fencing token and
		// writes with NX, a confirm script that compares the record with
		// the lease and writes the result. Nothing else (no owner, attempt
		// or fingerprint; no answer for a key already there): what is left
		// between it and idem is idem's own work, between it and redislock
		// the contract's.
		Name: NameScriptFloor, Group: GroupRedis, Redis: true,
		Versus: []string{NameRedislock, NameSetFloor},
		Open: func(ctx context.Context, e *Env) (*Instance, error) {
			c := e.Redis
			lease, keep := leaseTTL.Milliseconds(), retention.Milliseconds()
			return &Instance{Worker: func() Op {
				return func(ctx context.Context) error {
					key := e.Key("sfloor")
					tok, err := floorClaim.Run(ctx, c, []string{key}, lease).Text()
					if err != nil {
						return fmt.Errorf("claim script %s = %q, %v; want a token", key, tok, err)
					}
					if n, err := floorConfirm.Run(ctx, c, []string{key}, tok, "done", keep).Int(); err != nil || n != 1 {
						return fmt.Errorf("confirm script %s = %d, %v; want 1", key, n, err)
					}
					return nil
				}
			}}, nil
		},
	},
	{
		// What a claim costs without atomicity: two workers may both read
		// nothing and both do the work.
		Name: NameCheckThenSet, Group: GroupRedis, Redis: true,
		Open: func(ctx context.Context, e *Env) (*Instance, error) {
			c := e.Redis
			return &Instance{Worker: func() Op {
				return func(ctx context.Context) error {
					key := e.Key("get")
					err := c.Get(ctx, key).Err()
					if !errors.Is(err, redis.Nil) {
						return fmt.Errorf("GET %s = %v; want nil", key, err)
					}
					if err := c.Set(ctx, key, "claimed", leaseTTL).Err(); err != nil {
						return fmt.Errorf("SET %s PX: %w", key, err)
					}
					if err := c.Set(ctx, key, "done", retention).Err(); err != nil {
						return fmt.Errorf("SET %s PX: %w", key, err)
					}
					return nil
				}
			}}, nil
		},
	},
	{
		Name: NameClusterClaimConfirm, Group: GroupCluster, Redis: true,
		Versus: []string{NameClusterSetFloor},
		Open: func(ctx context.Context, e *Env) (*Instance, error) {
			s, err := newRedisStore(e.Cluster)
			if err != nil {
				return nil, err
			}
			return ClaimConfirm(e, s, "ccc"), nil
		},
	},
	{
		Name: NameClusterSetFloor, Group: GroupCluster, Redis: true,
		Open: func(ctx context.Context, e *Env) (*Instance, error) { return setFloor(e, e.Cluster, "cset"), nil },
	},
	{
		Name: NameSQLLease, Group: GroupSQL,
		Versus: []string{NameSQLFloor},
		Open: func(ctx context.Context, e *Env) (*Instance, error) {
			s, drop, err := newSQLStore(ctx, e, "lease")
			if err != nil {
				return nil, err
			}
			in := ClaimConfirm(e, s, "lease")
			in.Close = drop
			return in, nil
		},
	},
	{
		Name: NameSQLRun, Group: GroupSQL,
		Versus: []string{NameSQLFloor},
		Open: func(ctx context.Context, e *Env) (*Instance, error) {
			s, drop, err := newSQLStore(ctx, e, "run")
			if err != nil {
				return nil, err
			}
			write := func(context.Context, *sql.Tx) ([]byte, error) { return sqlResult, nil }
			return &Instance{Close: drop, Worker: func() Op {
				return func(ctx context.Context) error {
					key := e.Key("run")
					_, replayed, err := s.Run(ctx, key, sqlFingerprint, write)
					if err == nil && replayed {
						err = fmt.Errorf("Run(%q) replayed; want the work done", key)
					}
					return err
				}
			}}, nil
		},
	},
	{
		// The same two writes idem's lease mode makes, as plain SQL on a
		// table of the same shape.
		Name: NameSQLFloor, Group: GroupSQL,
		Open: func(ctx context.Context, e *Env) (*Instance, error) {
			_, drop, err := newSQLStore(ctx, e, "floor")
			if err != nil {
				return nil, err
			}
			table := e.Name("floor")
			insert := `INSERT INTO ` + table + ` (key, state, owner, token, fingerprint, result, recorded_at, expires_at)
VALUES ($1, 'C', $2, $3, $4, NULL, now(), now() + interval '30 seconds') ON CONFLICT (key) DO NOTHING`
			update := `UPDATE ` + table + ` SET state = 'D', owner = '', result = $2, expires_at = now() + interval '2 minutes' WHERE key = $1`
			return &Instance{Close: drop, Worker: func() Op {
				return func(ctx context.Context) error {
					key := []byte(e.Key("floor"))
					if _, err := e.DB.ExecContext(ctx, insert, key, "worker", int64(1), sqlFingerprint); err != nil {
						return err
					}
					_, err := e.DB.ExecContext(ctx, update, key, sqlResult)
					return err
				}
			}}, nil
		},
	},
	{
		Name: NameBare, Group: GroupHTTP,
		Open: func(ctx context.Context, e *Env) (*Instance, error) {
			return &Instance{Worker: func() Op {
				return func(context.Context) error { return serve(bareHandler, "", false) }
			}}, nil
		},
	},
	{
		Name: NameFirstWrite, Group: GroupHTTP, Redis: true,
		Versus: []string{NameBare},
		Open: func(ctx context.Context, e *Env) (*Instance, error) {
			s, err := newRedisStore(e.Redis)
			if err != nil {
				return nil, err
			}
			h, err := newMiddleware(s)
			if err != nil {
				return nil, err
			}
			return &Instance{Worker: func() Op {
				return func(context.Context) error { return serve(h, e.Key("http"), false) }
			}}, nil
		},
	},
	{
		Name: NameReplay, Group: GroupHTTP, Redis: true,
		Versus: []string{NameBare, NameFirstWrite},
		Open: func(ctx context.Context, e *Env) (*Instance, error) {
			s, err := newRedisStore(e.Redis)
			if err != nil {
				return nil, err
			}
			return replay(e, s)
		},
	},
	{
		// The replay path on Redis behind an idem.Cache: the store is asked
		// once per key and MaxAge, the rest is answered from memory.
		Name: NameReplayCache, Group: GroupHTTP, Redis: true,
		Versus: []string{NameReplay, NameBare},
		Open: func(ctx context.Context, e *Env) (*Instance, error) {
			s, err := newRedisStore(e.Redis)
			if err != nil {
				return nil, err
			}
			cache, err := idem.NewCache(s, idem.CacheOptions{})
			if err != nil {
				return nil, err
			}
			return replay(e, cache)
		},
	},
	{
		// The replay path with a store that costs next to nothing: what
		// is left is the middleware's own work per request.
		Name: NameReplayMemory, Group: GroupHTTP,
		Versus: []string{NameBare},
		Open: func(ctx context.Context, e *Env) (*Instance, error) {
			store, err := idem.NewMemoryStore(idem.Options{Retention: retention})
			if err != nil {
				return nil, err
			}
			return replay(e, store)
		},
	},
}

// DefaultTargets are the figures idem aims at (see docs/BENCHMARKS.md).
var DefaultTargets = []Target{
	{What: "idem (defaults) Claim+Confirm ≥ 2× SET NX + SET XX", Contender: NameClaimConfirm, Versus: NameSetFloor, Goroutines: 64, Min: 2.0},
	{What: "idem (defaults) Claim+Confirm ≥ 1.0× NoAutoPipeline (new keys no slower)", Contender: NameClaimConfirm, Versus: NameNoAutoPipeline, Goroutines: 64, Min: 1.0},
	{What: "idem (defaults) replay ≥ 1.8× NoAutoPipeline", Contender: NameReplayClaim, Versus: NameNoAutoPipelineReplay, Goroutines: 64, Min: 1.8},
	{What: "idem (defaults) 80% duplicates ≥ 1.8× NoAutoPipeline", Contender: NameMix, Versus: NameNoAutoPipelineMix, Goroutines: 64, Min: 1.8},
	{What: "idem NoAutoPipeline Claim+Confirm ≥ 1.0× redislock Obtain+Release", Contender: NameNoAutoPipeline, Versus: NameRedislock, Goroutines: 64, Min: 1.0},
	{What: "idem NoAutoPipeline Claim+Confirm ≥ 0.8× SET NX + SET XX", Contender: NameNoAutoPipeline, Versus: NameSetFloor, Goroutines: 64, Min: 0.8},
	{What: "batch(100) ≥ 3× one by one (NoAutoPipeline)", Contender: NameBatch, Versus: NameNoAutoPipeline, Goroutines: 64, Min: 3.0},
	{What: "middleware replay with a Cache ≥ 10× without", Contender: NameReplayCache, Versus: NameReplay, Goroutines: 64, Min: 10.0},
}

// MaxBytesPerRecord is the target for Memory.UsedMemory.
const MaxBytesPerRecord = 200
