package idem

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/testing/testenv"
)

// trickyKeys are keys whose bytes could confuse a Redis key name: hash tag
// braces, the escape character itself, separators, NUL, invalid UTF-8.
var trickyKeys = []string{
	"a",
	"550e8400-e29b-41d4-a716-446655440000",
	"a\x00b", "a\x00c",
	"{x}", "{x}}", "{", "}", "}{", "a}{b", "{}", "{{}}",
	"%", "%25", "%%", "%7B", "%7b",
	":", "a:b", " ", "a b", "\t\r\n",
	"\x00", "\x7f", "\x80", "\xff", "\xff\xfe\xfd", "\xc3\x28", "日本語",
	strings.Repeat("k", 1024),
	strings.Repeat("{", 1024),
	strings.Repeat("\x00", 1024),
}

func escapeKey(key string) string { return string(appendEscapedKey(nil, key)) }

// TestRedisKeyName checks that a Redis key name is the prefix, then the
// escaped key in braces, built in one allocation whether or not the key
// has bytes to escape.
func TestRedisKeyName(t *testing.T) {
	s := &RedisStore{prefix: DefaultPrefix}
	for _, k := range append([]string{""}, trickyKeys...) {
		if got, want := s.redisKey(k), DefaultPrefix+"{"+escapeKey(k)+"}"; got != want {
			t.Errorf("redisKey(%q) = %q; want %q", k, got, want)
		}
	}
	if testenv.RaceEnabled {
		return // the race detector's own allocations would count
	}
	for _, k := range []string{"550e8400-e29b-41d4-a716-446655440000", "a}{b\x00\xff"} {
		if n := testing.AllocsPerRun(100, func() { _ = s.redisKey(k) }); n != 1 {
			t.Errorf("redisKey(%q): %v allocations; want 1", k, n)
		}
	}
}

// checkEscaped fails t unless esc is a well-formed escaped key: only bytes
// 0x21-0x7E, so never a brace (which would change the hash tag) nor a byte
// redis-cli cannot show.
func checkEscaped(t testing.TB, key, esc string) {
	t.Helper()
	for i := 0; i < len(esc); i++ {
		if c := esc[i]; c < 0x21 || c > 0x7E || c == '{' || c == '}' {
			t.Fatalf("appendEscapedKey(%q) = %q: byte %d is %#x; want only 0x21-0x7E without braces", key, esc, i, c)
		}
	}
}

func TestEscapeKeyRoundTrip(t *testing.T) {
	for _, key := range trickyKeys {
		esc := escapeKey(key)
		checkEscaped(t, key, esc)
		got, ok := unescapeKey(esc)
		if !ok || got != key {
			t.Errorf("unescapeKey(appendEscapedKey(%q)) = %q, %v; want %q, true", key, got, ok, key)
		}
	}
}

func TestEscapeKeyAppends(t *testing.T) {
	dst := []byte("idem:{")
	got := string(appendEscapedKey(dst, "a{b"))
	if want := "idem:{a%7Bb"; got != want {
		t.Errorf("appendEscapedKey(%q, %q) = %q; want %q", "idem:{", "a{b", got, want)
	}
}

func TestEscapeKeyReadable(t *testing.T) {
	// Printable keys stay as they are: readable with redis-cli, no bigger.
	for _, tt := range []struct{ key, want string }{
		{"550e8400-e29b-41d4-a716-446655440000", "550e8400-e29b-41d4-a716-446655440000"},
		{"order:42", "order:42"},
		{"a b", "a%20b"},
		{"{x}", "%7Bx%7D"},
		{"%", "%25"},
		{"\x00\xff", "%00%FF"},
	} {
		if got := escapeKey(tt.key); got != tt.want {
			t.Errorf("appendEscapedKey(%q) = %q; want %q", tt.key, got, tt.want)
		}
	}
}

func TestEscapeKeyInjective(t *testing.T) {
	pairs := [][2]string{
		{"a\x00b", "a\x00c"},
		{"{x}", "{x}}"},
		{"%", "%25"},
		{"%25", "%2525"},
		{"%7B", "{"},
		{"\xff", "%FF"},
		{"\xc3\x28", "%C3("},
		{strings.Repeat("a", 1024), strings.Repeat("a", 1023) + "b"},
		{strings.Repeat("%", 1024), strings.Repeat("%25", 341) + "%"},
	}
	for _, p := range pairs {
		if a, b := escapeKey(p[0]), escapeKey(p[1]); a == b {
			t.Errorf("appendEscapedKey(%q) = appendEscapedKey(%q) = %q; want different encodings", p[0], p[1], a)
		}
	}

	// Every key of up to two bytes: 65,793 keys, no two alike once escaped.
	seen := make(map[string]string, 1+256+256*256)
	add := func(key string) {
		esc := escapeKey(key)
		checkEscaped(t, key, esc)
		if other, dup := seen[esc]; dup {
			t.Fatalf("appendEscapedKey(%q) = appendEscapedKey(%q) = %q; want different encodings", key, other, esc)
		}
		seen[esc] = key
	}
	add("")
	for a := 0; a < 256; a++ {
		add(string([]byte{byte(a)}))
		for b := 0; b < 256; b++ {
			add(string([]byte{byte(a), byte(b)}))
		}
	}
}

func TestUnescapeKeyRejectsNonCanonical(t *testing.T) {
	for _, s := range []string{
		"%",      // truncated
		"%4",     // truncated
		"a%2",    // truncated
		"%7b",    // lower-case hex
		"%fF",    // mixed case
		"%41",    // 'A' needs no escape
		"%3A",    // ':' needs no escape
		"%G0",    // not hex
		"%+1",    // sign
		"%0x",    // not hex
		"%%",     // '%' unescaped
		"{", "}", // braces are always escaped
		"a{b}",    // ... even inside
		" ",       // space is escaped
		"\x00",    // so is NUL
		"\x7f",    // DEL
		"\xff",    // and bytes above 0x7E
		"abc\xc3", // anywhere
	} {
		if got, ok := unescapeKey(s); ok {
			t.Errorf("unescapeKey(%q) = %q, true; want false: appendEscapedKey never produces it", s, got)
		}
	}
}

func FuzzEscapeKey(f *testing.F) {
	for _, k := range trickyKeys {
		f.Add(k)
	}
	f.Add("%7b")
	f.Add("%41")
	f.Add("%2")
	f.Fuzz(func(t *testing.T, key string) {
		esc := escapeKey(key)
		checkEscaped(t, key, esc)
		if got, ok := unescapeKey(esc); !ok || got != key {
			t.Fatalf("unescapeKey(appendEscapedKey(%q)) = %q, %v; want %q, true", key, got, ok, key)
		}
		// Read as an escaped form, the input decodes only if it is the
		// canonical encoding of what it decodes to: one key, one name.
		if dec, ok := unescapeKey(key); ok {
			if again := escapeKey(dec); again != key {
				t.Fatalf("unescapeKey(%q) = %q, true, but appendEscapedKey(%q) = %q; want non-canonical input refused",
					key, dec, dec, again)
			}
		}
	})
}

// keySlot is Redis Cluster's keyHashSlot: the hash tag is what lies between
// the first '{' and the first '}' after it, when that is not empty.
func keySlot(key string) int {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if n := strings.IndexByte(key[open+1:], '}'); n > 0 {
			key = key[open+1 : open+1+n]
		}
	}
	return int(crc16(key) % clusterSlots)
}

func TestKeySlot(t *testing.T) {
	// Vectors from the Redis Cluster specification and redis-cli.
	if got := crc16("123456789"); got != 0x31C3 {
		t.Fatalf("crc16(%q) = %#x; want 0x31c3", "123456789", got)
	}
	for _, tt := range []struct {
		key  string
		want int
	}{
		{"foo", 12182},
		{"{user1000}.following", keySlot("user1000")},
		{"foo{}{bar}", keySlot("foo{}{bar}")}, // empty tag: the whole key
		{"foo{{bar}}zap", keySlot("{bar")},
	} {
		if got := keySlot(tt.key); got != tt.want {
			t.Errorf("keySlot(%q) = %d; want %d", tt.key, got, tt.want)
		}
	}
}

func TestRedisKeySlotIsEscapedKey(t *testing.T) {
	s := &RedisStore{prefix: DefaultPrefix}
	for _, key := range trickyKeys {
		rk := s.redisKey(key)
		if want := int(crc16(escapeKey(key)) % 16384); keySlot(rk) != want {
			t.Errorf("slot of redisKey(%q) = %q is %d; want %d, the slot of the escaped key", key, rk, keySlot(rk), want)
		}
	}
}

// TestRedisKeySlotCluster asks a real cluster: braces in a user key do not
// move its record off the slot of its whole escaped form.
func TestRedisKeySlotCluster(t *testing.T) {
	c := testenv.Cluster(t)
	ctx := context.Background()
	s := newTestRedisStore(t, c, RedisOptions{})
	naiveDiffers := false
	for _, key := range append([]string{"{x}", "{x}}", "a}{b", "}", "{", "{}", "x"}, trickyKeys...) {
		rk := s.redisKey(key)
		got, err := c.ClusterKeySlot(ctx, rk).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %q: %v", rk, err)
		}
		want, err := c.ClusterKeySlot(ctx, escapeKey(key)).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %q: %v", escapeKey(key), err)
		}
		if got != want || int(got) != keySlot(rk) {
			t.Errorf("CLUSTER KEYSLOT %q = %d; want %d, the slot of the escaped key %q (computed here: %d)",
				rk, got, want, escapeKey(key), keySlot(rk))
		}
		// The same key wrapped without escaping would hash elsewhere for
		// some of these keys: this test can tell the difference.
		naive, err := c.ClusterKeySlot(ctx, s.prefix+"{"+key+"}").Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT: %v", err)
		}
		naiveDiffers = naiveDiffers || naive != got
	}
	if !naiveDiffers {
		t.Errorf("unescaped braces hashed like escaped ones for every key; want the test keys to tell them apart")
	}

	// Keys that differ only by braces are separate records on the cluster.
	keys := []string{"{x}", "{x}}", "a}{b", "}"}
	for _, k := range keys {
		c, err := s.Claim(ctx, k, nil)
		if err != nil || c.Outcome != Claimed {
			t.Fatalf("Claim(%q) = %v, %v; want claimed", k, c.Outcome, err)
		}
		if err := s.Confirm(ctx, c.Lease, []byte(k)); err != nil {
			t.Fatalf("Confirm(%q): %v", k, err)
		}
	}
	for _, k := range keys {
		rec, err := s.Lookup(ctx, k)
		if err != nil || string(rec.Result) != k {
			t.Errorf("Lookup(%q) = %v, %v; want the record with result %q", k, rec, err, k)
		}
	}
}

// unescapeKey reverses appendEscapedKey, to show that the encoding is
// injective (nothing in the package needs to decode a Redis key name); ok is false for a string it cannot
// have produced.
func unescapeKey(s string) (key string, ok bool) {
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '%':
			if i+2 >= len(s) {
				return "", false
			}
			v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
			// Only the canonical form decodes: upper-case digits, and only
			// for bytes that appendEscapedKey escapes.
			if err != nil || strings.ToUpper(s[i+1:i+3]) != s[i+1:i+3] || !mustEscape(byte(v)) {
				return "", false
			}
			b = append(b, byte(v))
			i += 2
		case !mustEscape(c):
			b = append(b, c)
		default:
			return "", false
		}
	}
	return string(b), true
}

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
	// Inputs the fuzzer once found interesting, kept as seeds.
	f.Add("0", "", "8")
	f.Add("", "0", "0")
	f.Add("0", "", "0")
	f.Add("0", "", "1")
	f.Add("0", "1", "0")
	f.Add("0", "", "\"")
	f.Add("}", "0", "0")
	f.Add("ѿ", "0", "0")
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
	if sha, _ := args[1].(string); sha == probeScript.Hash() {
		return // first contact's probe, on a key of its own
	}
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
