package bench

// The Instances behind the table's store contenders: idem's Redis stores as
// the benchmark opens them, a Claim and a Confirm per message
// (ClaimConfirm), replays, the mix of 80% duplicates, batches; the floors
// idem is measured against (plain SET commands, the script floor's
// scripts); and the SQL store on a table of the run's own.

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/sqlstore"
)

// newRedisStore returns the store as a user gets it without options, but
// for the benchmark's short Retention.
func newRedisStore(c redis.UniversalClient) (*idem.RedisStore, error) {
	return idem.NewRedisStore(c, idem.RedisOptions{Retention: retention})
}

// newFieldStore is newRedisStore with RedisOptions.FieldHashes 1, under a
// Prefix of the run's own: its form key makes every store of its Prefix
// keep fields, which the defaults' must not. The form key is written first
// as if long ago, so that fields are written from the first confirm (a
// store that writes it waits 5s, for the stores that read it before).
func newFieldStore(ctx context.Context, e *Env) (*idem.RedisStore, error) {
	prefix := e.Name("fields") + ":"
	at := strconv.FormatInt(time.Now().Add(-time.Minute).UnixMilli(), 10)
	if err := e.Redis.SetNX(ctx, prefix+"fields", "1:"+at, 0).Err(); err != nil {
		return nil, fmt.Errorf("bench: writing the form key: %w", err)
	}
	return idem.NewRedisStore(e.Redis, idem.RedisOptions{Retention: retention, Prefix: prefix, FieldHashes: 1})
}

// newDirectRedisStore is newRedisStore with RedisOptions.NoAutoPipeline:
// each call its own round trip.
func newDirectRedisStore(c redis.UniversalClient) (*idem.RedisStore, error) {
	return idem.NewRedisStore(c, idem.RedisOptions{Retention: retention, NoAutoPipeline: true})
}

// newCachedRedisStore is newRedisStore behind an idem.Cache with its
// default options.
func newCachedRedisStore(c redis.UniversalClient) (*idem.Cache, error) {
	s, err := newRedisStore(c)
	if err != nil {
		return nil, err
	}
	return idem.NewCache(s, idem.CacheOptions{})
}

// ClaimConfirm is the Instance of one Claim and one Confirm per message on
// s, each message a new key tagged tag: how a store is measured one message
// at a time.
func ClaimConfirm(e *Env, s idem.Store, tag string) *Instance {
	return &Instance{Worker: func() Op {
		return func(ctx context.Context) error {
			key := e.Key(tag)
			c, err := s.Claim(ctx, key, nil)
			if err != nil {
				return err
			}
			if c.Outcome != idem.Claimed {
				return fmt.Errorf("Claim(%q) = %v; want Claimed", key, c.Outcome)
			}
			return s.Confirm(ctx, c.Lease, nil)
		}
	}}
}

// Replay is the Instance of a Claim of a confirmed key per message on s:
// each goroutine confirms a key of its own, tagged tag, when it starts,
// then claims it again and again, each answered Duplicate with the result.
func Replay(e *Env, s idem.Store, tag string) *Instance {
	return &Instance{Worker: func() Op {
		key := e.Key(tag)
		first := claimConfirm(context.Background(), s, key)
		return func(ctx context.Context) error {
			if first != nil {
				return first
			}
			return claimDuplicate(ctx, s, key)
		}
	}}
}

// mixHotKeys is how many confirmed keys each goroutine of Mix replays:
// 1,024 at 64 goroutines.
const mixHotKeys = 16

// Mix is the Instance of traffic whose messages are 80% duplicates: each
// goroutine confirms mixHotKeys keys of its own when it starts; then a
// message is, one time in five, a new key (Claim and Confirm), else a
// Claim of one of those keys, answered Duplicate. The choice follows a
// fixed sequence per goroutine, so that every contender draws the same.
func Mix(e *Env, s idem.Store, tag string) *Instance {
	return &Instance{Worker: func() Op {
		hot := make([]string, mixHotKeys)
		var first error
		for i := range hot {
			hot[i] = e.Key(tag)
			if first == nil {
				first = claimConfirm(context.Background(), s, hot[i])
			}
		}
		n := 0
		return func(ctx context.Context) error {
			if first != nil {
				return first
			}
			n++
			if n%5 == 0 {
				return claimConfirm(ctx, s, e.Key(tag))
			}
			// 7 is prime to mixHotKeys: every hot key in turn, not in order.
			return claimDuplicate(ctx, s, hot[(n*7)%mixHotKeys])
		}
	}}
}

// claimConfirm claims key on s, which must be new, and confirms it with a
// short result.
func claimConfirm(ctx context.Context, s idem.Store, key string) error {
	c, err := s.Claim(ctx, key, nil)
	if err != nil {
		return err
	}
	if c.Outcome != idem.Claimed {
		return fmt.Errorf("Claim(%q) = %v; want Claimed", key, c.Outcome)
	}
	return s.Confirm(ctx, c.Lease, replayResult)
}

// claimDuplicate claims key on s, which must be confirmed with
// replayResult.
func claimDuplicate(ctx context.Context, s idem.Store, key string) error {
	c, err := s.Claim(ctx, key, nil)
	if err != nil {
		return err
	}
	if c.Outcome != idem.Duplicate || c.Record == nil || string(c.Record.Result) != string(replayResult) {
		return fmt.Errorf("Claim(%q) = %v; want Duplicate with the result confirmed", key, c.Outcome)
	}
	return nil
}

// replayResult is what Replay and Mix confirm: a response's size.
var replayResult = []byte(`{"id":"ord_123","status":"created"}`)

// Batch is the Instance of one ClaimBatch and one ConfirmBatch of size new
// keys per Op on s (the contender's Msgs must be size).
func Batch(e *Env, s idem.Batcher, tag string, size int) *Instance {
	return &Instance{Worker: func() Op {
		keys := make([]string, size)
		leases := make([]*idem.Lease, size)
		return func(ctx context.Context) error {
			for i := range keys {
				keys[i] = e.Key(tag)
			}
			cs, err := s.ClaimBatch(ctx, keys, nil)
			if err != nil {
				return err
			}
			for i, c := range cs {
				if c.Outcome != idem.Claimed {
					return fmt.Errorf("ClaimBatch: %q = %v; want Claimed", keys[i], c.Outcome)
				}
				leases[i] = c.Lease
			}
			return s.ConfirmBatch(ctx, leases, nil)
		}
	}}
}

// The scripts of the script floor contender.
var (
	floorClaim = redis.NewScript(`local t = redis.call('TIME')
local tok = t[1] .. t[2]
if redis.call('SET', KEYS[1], tok, 'NX', 'PX', ARGV[1]) then return tok end
return false`)
	floorConfirm = redis.NewScript(`if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1`)
)

// setFloor is the least any store must send per message: a SET NX PX to
// claim and a SET XX PX to confirm, as plain commands.
func setFloor(e *Env, c redis.UniversalClient, tag string) *Instance {
	claim := redis.SetArgs{Mode: "NX", TTL: leaseTTL}
	confirm := redis.SetArgs{Mode: "XX", TTL: retention}
	return &Instance{Worker: func() Op {
		return func(ctx context.Context) error {
			key := e.Key(tag)
			if ok, err := c.SetArgs(ctx, key, "claimed", claim).Result(); err != nil || ok != "OK" {
				return fmt.Errorf("SET %s NX PX = %q, %v; want OK", key, ok, err)
			}
			if err := c.SetArgs(ctx, key, "done", confirm).Err(); err != nil {
				return fmt.Errorf("SET %s XX PX: %w", key, err)
			}
			return nil
		}
	}}
}

var (
	sqlFingerprint = []byte("0123456789abcdef0123456789abcdef")
	sqlResult      = []byte("202 Accepted ok.")
)

// newSQLStore returns a Postgres store on a table of this run, created now;
// drop deletes the table.
func newSQLStore(ctx context.Context, e *Env, tag string) (*sqlstore.Store, func() error, error) {
	table := e.Name(tag)
	s, err := sqlstore.New(e.DB, sqlstore.Options{Dialect: sqlstore.Postgres, Table: table,
		Retention: retention})
	if err != nil {
		return nil, nil, err
	}
	// A contender is opened twice (timed rounds, cost pass) on one table.
	if err := s.CreateSchema(ctx); err != nil {
		return nil, nil, err
	}
	drop := func() error {
		_, err := e.DB.ExecContext(context.Background(), `DROP TABLE IF EXISTS `+table)
		return err
	}
	return s, drop, nil
}
