package idem

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/redis/go-redis/v9"
)

// splitRedisKey reverses RedisStore.redisKey: the prefix holds no brace, so
// the first '{' ends it, and the escaped key runs to the closing '}' that
// ends the name. ok is false for a name redisKey cannot have produced.
func splitRedisKey(name string) (prefix, key string, ok bool) {
	open := strings.IndexByte(name, '{')
	if open < 0 || !strings.HasSuffix(name, "}") || len(name) < open+2 {
		return "", "", false
	}
	key, ok = unescapeKey(name[open+1 : len(name)-1])
	return name[:open], key, ok
}

// validPrefix is NewRedisStore's rule for a prefix, after the default.
func validPrefix(p string) bool { return p != "" && !strings.ContainsAny(p, "{}") }

// FuzzRedisKey checks the Redis key naming for any prefix and two keys:
// the name decodes back to its prefix and key (so two different (prefix,
// key) pairs never share a name), and the name's cluster slot is the slot
// of the escaped key alone, whatever the prefix and the key's bytes.
func FuzzRedisKey(f *testing.F) {
	for _, k := range trickyKeys {
		f.Add(DefaultPrefix, k, "a")
	}
	f.Add("idem:", "{x}", "{x}}")
	f.Add("idem:", "%7B", "{")
	f.Add("app:idem:", "a\x00b", "a\x00c")
	f.Add("a", "b{c}", "b")
	f.Add(" ", "}", "}{")
	f.Add("p%", "%", "%25")
	f.Add("idem", ":x", "x")
	f.Fuzz(func(t *testing.T, prefix, k1, k2 string) {
		if !validPrefix(prefix) {
			return
		}
		s := &RedisStore{prefix: prefix}
		for _, k := range []string{k1, k2} {
			if k == "" {
				continue // ErrInvalidKey before any name is made
			}
			name := s.redisKey(k)
			p, dec, ok := splitRedisKey(name)
			if !ok || p != prefix || dec != k {
				t.Fatalf("redisKey(%q) with prefix %q = %q, which decodes to %q, %q, %v; want %q, %q, true",
					k, prefix, name, p, dec, ok, prefix, k)
			}
			// Redis Cluster hashes the first {...} that is not empty: that
			// must be the whole escaped key, never a part of the prefix or
			// of a brace inside the key.
			if got, want := keySlot(name), int(crc16(escapeKey(k))%16384); got != want {
				t.Fatalf("slot of redisKey(%q) = %q is %d; want %d, the slot of the escaped key %q",
					k, name, got, want, escapeKey(k))
			}
			if other := (&RedisStore{prefix: DefaultPrefix}).redisKey(k); keySlot(other) != keySlot(name) {
				t.Fatalf("redisKey(%q) lands in slot %d with prefix %q, %d with %q; want the prefix not to move it",
					k, keySlot(name), prefix, keySlot(other), DefaultPrefix)
			}
		}
		if k1 != "" && k2 != "" && k1 != k2 && s.redisKey(k1) == s.redisKey(k2) {
			t.Fatalf("redisKey(%q) = redisKey(%q) = %q; want different names", k1, k2, s.redisKey(k1))
		}
	})
}

// keyRecorder is a go-redis hook that records the keys of every script
// call the store sends, single commands and pipelines alike.
type keyRecorder struct {
	mu    sync.Mutex
	calls [][]string // the KEYS of each EVAL/EVALSHA
}

func (r *keyRecorder) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *keyRecorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.record(cmd)
		return next(ctx, cmd)
	}
}

func (r *keyRecorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			r.record(cmd)
		}
		return next(ctx, cmds)
	}
}

func (r *keyRecorder) record(cmd redis.Cmder) {
	name := strings.ToLower(cmd.Name())
	if name != "evalsha" && name != "eval" && name != "evalsha_ro" && name != "eval_ro" {
		return
	}
	args := cmd.Args() // name, script or sha, numkeys, keys..., argv...
	n, _ := args[2].(int)
	keys := make([]string, 0, n)
	for _, a := range args[3 : 3+n] {
		keys = append(keys, a.(string))
	}
	r.mu.Lock()
	r.calls = append(r.calls, keys)
	r.mu.Unlock()
}

func (r *keyRecorder) take() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.calls
	r.calls = nil
	return c
}

// checkOneSlot runs every operation on each tricky key and checks, from what
// the client sent, that each script call names exactly that key's one Redis
// key, so a record never spans slots (CROSSSLOT on a cluster).
func checkOneSlot(t *testing.T, c redis.UniversalClient, rec *keyRecorder) {
	t.Helper()
	ctx := context.Background()
	s := newTestRedisStore(t, c, RedisOptions{LeaseTTL: time.Minute})
	for _, key := range trickyKeys {
		want := s.redisKey(key)
		cl, err := s.Claim(ctx, key, []byte("fp"))
		if err != nil || cl.Outcome != Claimed {
			t.Fatalf("Claim(%q) = %v, %v; want claimed", key, cl.Outcome, err)
		}
		if err := s.Renew(ctx, cl.Lease); err != nil {
			t.Fatalf("Renew(%q) = %v", key, err)
		}
		if err := s.Confirm(ctx, cl.Lease, []byte("r")); err != nil {
			t.Fatalf("Confirm(%q) = %v", key, err)
		}
		if _, err := s.Lookup(ctx, key); err != nil {
			t.Fatalf("Lookup(%q) = %v", key, err)
		}
		if err := s.Forget(ctx, cl.Lease); err == nil {
			t.Fatalf("Forget(%q) of a confirmed key = nil; want ErrLeaseLost", key)
		}
		calls := rec.take()
		if len(calls) < 5 {
			t.Fatalf("recorded %d script calls for %q; want at least 5 (one per operation)", len(calls), key)
		}
		for _, keys := range calls {
			if len(keys) != 1 || keys[0] != want {
				t.Fatalf("a script call for key %q named Redis keys %q; want only %q", key, keys, want)
			}
		}
	}
	// A batch call may carry many records, but on a cluster every script
	// call's keys share one slot.
	cs, err := s.ClaimBatch(ctx, []string{"b{1}", "b}2", "b%3", "b\x004"}, nil)
	if err != nil {
		t.Fatalf("ClaimBatch = %v", err)
	}
	leases := make([]*Lease, len(cs))
	for i, cl := range cs {
		leases[i] = cl.Lease
	}
	if err := s.ConfirmBatch(ctx, leases, nil); err != nil {
		t.Fatalf("ConfirmBatch = %v", err)
	}
	_, cluster := c.(*redis.ClusterClient)
	calls := rec.take()
	if len(calls) == 0 {
		t.Fatalf("no script call of ClaimBatch and ConfirmBatch was recorded")
	}
	for _, keys := range calls {
		for _, k := range keys[1:] {
			if cluster && keySlot(k) != keySlot(keys[0]) {
				t.Fatalf("a batch script call on a cluster named keys %q of different slots", keys)
			}
		}
	}
}

func TestRedisKeysOneSlotMiniredis(t *testing.T) {
	srv := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	rec := &keyRecorder{}
	c.AddHook(rec)
	checkOneSlot(t, c, rec)
}

func TestRedisKeysOneSlotCluster(t *testing.T) {
	c := testenv.Cluster(t)
	rec := &keyRecorder{}
	c.AddHook(rec)
	checkOneSlot(t, c, rec)
}
