package idem

// How a script reaches Redis: the scripts themselves, loaded with SCRIPT
// LOAD and run with EVALSHA, loaded again when the server lost them
// (NOSCRIPT), and the cluster's slot map reloaded when a node stops
// answering. The lowest layer of the Redis store: the operations, the
// pipeline engine and first contact call into it, and it calls none of
// them.

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/backoff"
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
	//go:embed scripts/checkpoint.lua
	checkpointLua string
	//go:embed scripts/resolve.lua
	resolveLua string
	//go:embed scripts/probe.lua
	probeLua string

	// Each script is one operation with the record format's functions
	// included where it asks for them.
	claimScript        = hashed(script("claim", claimLua))
	renewScript        = script("renew", renewLua)
	confirmScript      = hashed(script("confirm", confirmLua))
	forgetScript       = script("forget", forgetLua)
	lookupScript       = hashed(script("lookup", lookupLua))
	claimBatchScript   = hashed(script("claim_batch", claimBatchLua))
	confirmBatchScript = hashed(script("confirm_batch", confirmBatchLua))
	checkpointScript   = script("checkpoint", checkpointLua)
	resolveScript      = hashed(script("resolve", resolveLua))

	// probeScript asks the server, on first contact, for what the others
	// rely on (see RedisStore.Check).
	probeScript = &luaScript{name: "probe", src: probeLua}

	// scripts are all of them, as SCRIPT LOAD loads them on first contact.
	scripts = [...]*luaScript{claimScript, renewScript, confirmScript, forgetScript,
		lookupScript, claimBatchScript, confirmBatchScript, checkpointScript, resolveScript, probeScript}
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
	// hashed is set on the scripts that may read or write a confirmation
	// kept as a field (RedisOptions.FieldHashes): they take its hash as
	// their second key (a batch's, after all the records).
	hashed bool
}

// hashed marks sc as taking a record's field hash (luaScript.hashed).
func hashed(sc *luaScript) *luaScript {
	sc.hashed = true
	return sc
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

// eval runs script on key (a Redis key) and hash, its field hash or ""
// (see luaScript.hashed), with args as one EVALSHA. When
// the server lost its scripts (NOSCRIPT: SCRIPT FLUSH, a restart, a
// failover to a replica that never loaded them), the script is loaded
// again with SCRIPT LOAD and the call sent again: it had not run. On a
// cluster, a call still redirected when go-redis gave up (see redirected)
// is sent again too.
func (s *RedisStore) eval(ctx context.Context, script *luaScript, key, hash string, args []any) (any, error) {
	sha := script.digest()
	if sha == nil {
		if err := s.loadScript(ctx, script); err != nil {
			return nil, err
		}
		sha = script.digest()
	}
	v, err := s.evalAs(ctx, sha, key, hash, args)
	for range scriptReloads {
		if err == nil || !redis.HasErrorPrefix(err, "NOSCRIPT") {
			break
		}
		scriptLosses.Add(1) // the server may have restarted: see recheck
		if err := s.loadScript(ctx, script); err != nil {
			return nil, err
		}
		v, err = s.evalAs(ctx, sha, key, hash, args)
	}
	if s.cluster != nil && redirected(err) {
		v, err = s.resend(ctx, sha, key, hash, args, err)
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

// evalAs sends one EVALSHA of sha (a boxed digest) on key (and hash, when
// not "") with args. The
// verdict is read from the command, not from Process's return: a client
// that queues commands (go-redis's AutoPipeliner) returns from Process
// before the reply, and the command then holds both.
func (s *RedisStore) evalAs(ctx context.Context, sha any, key, hash string, args []any) (any, error) {
	cmdArgs := make([]any, 0, 5+len(args))
	if hash == "" {
		cmdArgs = append(cmdArgs, "evalsha", sha, 1, key)
	} else {
		cmdArgs = append(cmdArgs, "evalsha", sha, 2, key, hash)
	}
	cmdArgs = append(cmdArgs, args...)
	cmd := redis.NewCmd(ctx, cmdArgs...)
	cmd.SetFirstKeyPos(3) // for a cluster's routing, as go-redis's EvalSha does
	_ = s.c.Process(ctx, cmd)
	v, err := cmd.Result()
	s.reloadSlots(err)
	return v, err
}

// redirected reports an answer that says the call's slot is elsewhere or
// in motion: MOVED, ASK, or TRYAGAIN (a slot being migrated holds some of
// a call's keys, a record and its field hash, and not the others). The
// call did not run, so sending it again is safe.
func redirected(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK") || redis.HasErrorPrefix(err, "TRYAGAIN"))
}

// resend sends a redirected call again, a few times a moment apart, the
// cluster's slot map reloaded first: go-redis follows MOVED and ASK and
// waits out TRYAGAIN within MaxRedirects tries only, which a slot's
// migration can outlast (a record and its field hash are two keys, so a
// call meets TRYAGAIN until the slot's last key moved). It returns the
// last answer; err is the first call's.
func (s *RedisStore) resend(ctx context.Context, sha any, key, hash string, args []any, err error) (any, error) {
	s.cluster.ReloadState(ctx)
	wait := backoff.Backoff{First: 20 * time.Millisecond, Most: 60 * time.Millisecond}
	var v any
	for range 3 {
		if !backoff.Sleep(ctx, wait.Next()) {
			return nil, err
		}
		if v, err = s.evalAs(ctx, sha, key, hash, args); !redirected(err) {
			break
		}
	}
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

// scriptsRefused marks a server's refusal of a script command as
// ErrScriptsRefused; an error reaching the server stays as it is.
func scriptsRefused(err error) error {
	var reply redis.Error
	if !errors.As(err, &reply) {
		return err
	}
	// Replies that say "not now" or "not here", not "never".
	for _, transient := range []string{"NOSCRIPT", "LOADING", "BUSY", "CLUSTERDOWN", "MOVED", "ASK", "TRYAGAIN", "READONLY", "MASTERDOWN"} {
		if redis.HasErrorPrefix(err, transient) {
			return err
		}
	}
	return fmt.Errorf("%w: %w", ErrScriptsRefused, err)
}

// evalSha queues one EVALSHA of sha (a boxed digest) on p, as go-redis's
// EvalSha does, without its copies of keys and args.
func evalSha(ctx context.Context, p redis.Pipeliner, sha any, keys []string, args []any) *redis.Cmd {
	cmdArgs := make([]any, 0, 3+len(keys)+len(args))
	cmdArgs = append(cmdArgs, "evalsha", sha, len(keys))
	for _, k := range keys {
		cmdArgs = append(cmdArgs, k)
	}
	cmdArgs = append(cmdArgs, args...)
	cmd := redis.NewCmd(ctx, cmdArgs...)
	if len(keys) > 0 {
		cmd.SetFirstKeyPos(3)
	}
	_ = p.Process(ctx, cmd)
	return cmd
}
