package idem_test

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/google/uuid"
	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/internal/testing/obstest"
	"github.com/idemgo/idem/internal/testing/sqltest"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/idemgo/idem/middleware"
	"github.com/idemgo/idem/sqlstore"
	"github.com/idemgo/idem/storetest"
	"github.com/redis/go-redis/v9"
)

// cacheRig is a backend the cache's checks run on: stores sharing one set
// of records (Backend.Open), the clock by which their Record.Expires are
// reckoned, which the cache reads and which moves with the store's, and
// a hand that deletes a record as an operator would.
type cacheRig struct {
	b storetest.Backend
	// now is the cache's clock. On a backend whose clock the rig moves
	// (Backend.Advance), it moves too: miniredis's TTLs jump with
	// FastForward while the process's clock does not.
	now func() time.Time
	// del deletes key's record by hand; nil where no one can (MemoryStore).
	del func(key string) error
	// cmds counts the Redis commands sent; nil off Redis.
	cmds *testenv.IOCounter
}

// pass lets d pass on the rig's clock: moved where the rig controls it,
// slept otherwise.
func (r *cacheRig) pass(d time.Duration) {
	if r.b.Advance != nil {
		r.b.Advance(d)
		return
	}
	time.Sleep(d)
}

// offsetClock is the process's clock plus the advances made to a backend's
// own (miniredis's FastForward).
type offsetClock struct{ off atomic.Int64 }

func (c *offsetClock) Now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *offsetClock) Advance(d time.Duration) { c.off.Add(int64(d)) }

// cacheRigs are the backends every check of the cache runs on.
var cacheRigs = []struct {
	name string
	open func(t *testing.T) *cacheRig
}{
	{"memory", func(t *testing.T) *cacheRig {
		b := storetest.MemoryBackend()
		return &cacheRig{b: b, now: b.Now}
	}},
	{"miniredis", func(t *testing.T) *cacheRig {
		m := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { _ = c.Close() })
		return redisRig(c, func(d time.Duration) { m.FastForward(d) })
	}},
	{"redis", func(t *testing.T) *cacheRig {
		return redisRig(testenv.Redis(t), nil)
	}},
	{"sqlite", func(t *testing.T) *cacheRig {
		path := filepath.Join(t.TempDir(), "idem.db")
		return sqlRig(t, sqltest.OpenSQLite(t, path), sqlstore.SQLite, func() *sql.DB { return sqltest.OpenSQLite(t, path) })
	}},
	{"postgres", func(t *testing.T) *cacheRig {
		db := sqltest.Postgres(t)
		return sqlRig(t, db, sqlstore.Postgres, func() *sql.DB { return db })
	}},
	{"mysql", func(t *testing.T) *cacheRig {
		db := sqltest.MySQL(t)
		return sqlRig(t, db, sqlstore.MySQL, func() *sql.DB { return db })
	}},
}

// redisRig opens RedisStores on c under a prefix of their own; advance is
// the server's FastForward, nil on a real server.
func redisRig(c *redis.Client, advance func(time.Duration)) *cacheRig {
	prefix := testenv.UniquePrefix()
	io := &testenv.IOCounter{}
	c.AddHook(io)
	r := &cacheRig{b: redisBackend(c, idem.RedisOptions{Prefix: prefix}, nil), now: time.Now, cmds: io}
	if advance != nil {
		clock := &offsetClock{}
		r.now = clock.Now
		r.b.Advance = func(d time.Duration) { advance(d); clock.Advance(d) }
	}
	r.del = func(key string) error { return c.Del(context.Background(), redisKeyName(c, prefix, key)).Err() }
	return r
}

// sqlRig opens sqlstore.Stores of dialect d on a table of its own in db,
// each on the handle that handle returns.
func sqlRig(t *testing.T, db *sql.DB, d sqlstore.Dialect, handle func() *sql.DB) *cacheRig {
	table := sqltest.UniqueTable()
	sqltest.NewStore(t, db, sqlstore.Options{Dialect: d, Table: table})
	del := sqltest.Query(d, `DELETE FROM "`+table+`" WHERE key = $1`)
	return &cacheRig{
		b: storetest.Backend{Open: func(o idem.Options) (idem.Store, error) {
			so := sqlstore.OptionsFrom(o, d)
			so.Table = table
			return sqlstore.New(handle(), so)
		}},
		now: time.Now,
		del: func(key string) error { _, err := db.Exec(del, []byte(key)); return err },
	}
}

// eachCacheRig runs f on every backend, a subtest each.
func eachCacheRig(t *testing.T, f func(t *testing.T, r *cacheRig)) {
	for _, rig := range cacheRigs {
		t.Run(rig.name, func(t *testing.T) {
			t.Parallel()
			f(t, rig.open(t))
		})
	}
}

// cached returns a backend whose stores are the rig's, each behind a
// Cache of its own (as each process has its own), with co's options and
// the rig's clock.
func (r *cacheRig) cached(co idem.CacheOptions) storetest.Backend {
	b := r.b
	b.Open = func(o idem.Options) (idem.Store, error) {
		s, err := r.b.Open(o)
		if err != nil {
			return nil, err
		}
		co := co
		co.Now, co.Observer, co.KeyHasher = r.now, o.Observer, o.KeyHasher
		return idem.NewCache(s, co)
	}
	return b
}

// The conformance suite, its linearizability check included, on the
// cached store of every backend: a Cache answers as its store does.
func TestCacheConformance(t *testing.T) {
	t.Parallel()
	for _, rig := range cacheRigs {
		t.Run(rig.name, func(t *testing.T) {
			t.Parallel()
			storetest.Run(t, func(t *testing.T) storetest.Backend {
				return rig.open(t).cached(idem.CacheOptions{})
			})
		})
	}
}

// countingStore counts the calls that reach the store behind a Cache (a
// batch counts its items).
type countingStore struct {
	idem.Store
	calls atomic.Int64
}

func (s *countingStore) Claim(ctx context.Context, key string, fp []byte) (idem.Claim, error) {
	s.calls.Add(1)
	return s.Store.Claim(ctx, key, fp)
}

func (s *countingStore) Lookup(ctx context.Context, key string) (*idem.Record, error) {
	s.calls.Add(1)
	return s.Store.Lookup(ctx, key)
}

func (s *countingStore) ClaimBatch(ctx context.Context, keys []string, fps [][]byte) ([]idem.Claim, error) {
	s.calls.Add(int64(len(keys)))
	return s.Store.(idem.Batcher).ClaimBatch(ctx, keys, fps)
}

func (s *countingStore) ConfirmBatch(ctx context.Context, ls []*idem.Lease, results [][]byte) error {
	return s.Store.(idem.Batcher).ConfirmBatch(ctx, ls, results)
}

// cacheEvents counts the events of op with cache result r that l kept.
func cacheEvents(l *obstest.Log, op idem.Op, r idem.CacheResult) int {
	n := 0
	for _, e := range l.Of(op) {
		if e.Cache == r {
			n++
		}
	}
	return n
}

// cacheUnderTest is a Cache on one store of a rig, with the store's calls
// counted and both observed into one log.
type cacheUnderTest struct {
	*idem.Cache
	inner  idem.Store // the rig's store, behind the counter
	store  *countingStore
	events *obstest.Log
	rig    *cacheRig
}

func newCacheUnderTest(t *testing.T, r *cacheRig, o idem.Options, co idem.CacheOptions) *cacheUnderTest {
	t.Helper()
	events := &obstest.Log{}
	o.Observer = events
	if o.LeaseTTL == 0 {
		o.LeaseTTL = time.Second
	}
	if o.Retention == 0 {
		o.Retention = time.Minute
	}
	inner, err := r.b.Open(o)
	if err != nil {
		t.Fatalf("Open = %v", err)
	}
	cs := &countingStore{Store: inner}
	co.Now, co.Observer = r.now, events
	c, err := idem.NewCache(cs, co)
	if err != nil {
		t.Fatalf("NewCache = %v", err)
	}
	return &cacheUnderTest{Cache: c, inner: inner, store: cs, events: events, rig: r}
}

// confirm claims and confirms key with fingerprint fp and result res
// through the cache.
func (c *cacheUnderTest) confirm(t *testing.T, key string, fp, res []byte) {
	t.Helper()
	cl, err := c.Claim(context.Background(), key, fp)
	if err != nil || cl.Outcome != idem.Claimed {
		t.Fatalf("Claim(%q) = %v, %v; want claimed", key, cl.Outcome, err)
	}
	if err := c.Confirm(context.Background(), cl.Lease, res); err != nil {
		t.Fatalf("Confirm(%q) = %v", key, err)
	}
}

// claim claims key through the cache and reports whether the store was
// called.
func (c *cacheUnderTest) claim(t *testing.T, key string, fp []byte) (idem.Claim, error, bool) {
	t.Helper()
	before := c.store.calls.Load()
	cl, err := c.Claim(context.Background(), key, fp)
	return cl, err, c.store.calls.Load() != before
}

// sameRecord fails t unless got is want, Expires included within slack (a
// store's estimate of it differs between two reads).
func sameRecord(t *testing.T, what string, got, want *idem.Record, slack time.Duration) {
	t.Helper()
	if got == nil || want == nil {
		t.Fatalf("%s: record %+v; want %+v", what, got, want)
	}
	if got.Key != want.Key || got.Confirmed != want.Confirmed || got.Token != want.Token || got.Owner != want.Owner ||
		string(got.Fingerprint) != string(want.Fingerprint) || string(got.Result) != string(want.Result) ||
		got.Expires.Sub(want.Expires).Abs() > slack {
		t.Errorf("%s: record %+v; want %+v", what, got, want)
	}
}

// Only confirmed records are answered from memory, without the store: a
// claim in flight is always the store's answer, however often asked.
func TestCacheConfirmedOnly(t *testing.T) {
	eachCacheRig(t, func(t *testing.T, r *cacheRig) {
		// A lease long enough that the claim would outlive the margin, were
		// it ever cached.
		c := newCacheUnderTest(t, r, idem.Options{LeaseTTL: 30 * time.Second}, idem.CacheOptions{MaxAge: time.Hour})
		ctx := context.Background()
		key := "cache-only-" + uuid.NewString()
		first, err := c.Claim(ctx, key, []byte("fp"))
		if err != nil || first.Outcome != idem.Claimed {
			t.Fatalf("Claim(%q) = %v, %v; want claimed", key, first.Outcome, err)
		}
		for i := range 3 {
			cl, err, asked := c.claim(t, key, []byte("fp"))
			if err != nil || cl.Outcome != idem.InProgress || !asked {
				t.Fatalf("Claim(%q) #%d of a claim in flight = %v, %v, store asked %v; want InProgress from the store", key, i, cl.Outcome, err, asked)
			}
			before := c.store.calls.Load()
			if rec, err := c.Lookup(ctx, key); err != nil || rec.Confirmed || c.store.calls.Load() == before {
				t.Fatalf("Lookup(%q) of a claim = %+v, %v, store asked %v; want the claim from the store", key, rec, err, c.store.calls.Load() != before)
			}
		}
		if err := c.Confirm(ctx, first.Lease, []byte("result")); err != nil {
			t.Fatalf("Confirm = %v", err)
		}
		want, err, asked := c.claim(t, key, []byte("fp"))
		if err != nil || want.Outcome != idem.Duplicate || !asked {
			t.Fatalf("first Claim(%q) after Confirm = %v, %v, store asked %v; want Duplicate from the store", key, want.Outcome, err, asked)
		}
		if n := cacheEvents(c.events, idem.OpClaim, idem.CacheMiss); n != 5 {
			t.Errorf("store's claim events marked CacheMiss = %d; want 5 (every Claim the cache passed on)", n)
		}
		var cmds int64
		if r.cmds != nil {
			cmds = r.cmds.N.Load()
		}
		for i := range 100 {
			cl, err, asked := c.claim(t, key, []byte("fp"))
			if err != nil || cl.Outcome != idem.Duplicate || asked {
				t.Fatalf("Claim(%q) #%d of a cached confirmation = %v, %v, store asked %v; want Duplicate from memory", key, i, cl.Outcome, err, asked)
			}
			sameRecord(t, "cached Claim", cl.Record, want.Record, 0)
		}
		before := c.store.calls.Load()
		rec, err := c.Lookup(ctx, key)
		if err != nil || c.store.calls.Load() != before {
			t.Fatalf("Lookup(%q) of a cached confirmation = %v, store asked %v; want it from memory", key, err, c.store.calls.Load() != before)
		}
		sameRecord(t, "cached Lookup", rec, want.Record, 0)
		if r.cmds != nil {
			if n := r.cmds.N.Load() - cmds; n != 0 {
				t.Errorf("Redis commands sent for 101 cached duplicates = %d; want 0", n)
			}
		}
		if n := cacheEvents(c.events, idem.OpClaim, idem.CacheHit); n != 100 {
			t.Errorf("claim events marked CacheHit = %d; want 100", n)
		}
		if n := cacheEvents(c.events, idem.OpLookup, idem.CacheHit); n != 1 {
			t.Errorf("lookup events marked CacheHit = %d; want 1", n)
		}
		// The caller's copy is its own: changing it changes no other answer.
		rec.Result[0] = 'X'
		cl, _, _ := c.claim(t, key, []byte("fp"))
		sameRecord(t, "Claim after a caller changed its copy", cl.Record, want.Record, 0)
	})
}

// A cached record made with another fingerprint is answered as the store
// answers it: ErrFingerprintMismatch together with the Duplicate and its
// record; an empty fingerprint on either side is not compared.
func TestCacheFingerprint(t *testing.T) {
	eachCacheRig(t, func(t *testing.T, r *cacheRig) {
		c := newCacheUnderTest(t, r, idem.Options{}, idem.CacheOptions{MaxAge: time.Hour})
		ctx := context.Background()
		key := "cache-fp-" + uuid.NewString()
		c.confirm(t, key, []byte("fp-a"), []byte("result-a"))
		want, wantErr := c.inner.Claim(ctx, key, []byte("fp-b"))
		if !errors.Is(wantErr, idem.ErrFingerprintMismatch) || want.Outcome != idem.Duplicate {
			t.Fatalf("store's Claim(%q, fp-b) = %v, %v; want Duplicate with ErrFingerprintMismatch", key, want.Outcome, wantErr)
		}
		for i, wantAsked := range []bool{true, false, false} {
			cl, err, asked := c.claim(t, key, []byte("fp-b"))
			if !errors.Is(err, idem.ErrFingerprintMismatch) || cl.Outcome != idem.Duplicate || asked != wantAsked {
				t.Fatalf("Claim(%q, fp-b) #%d = %v, %v, store asked %v; want Duplicate with ErrFingerprintMismatch, store asked %v",
					key, i, cl.Outcome, err, asked, wantAsked)
			}
			sameRecord(t, fmt.Sprintf("Claim #%d with another fingerprint", i), cl.Record, want.Record, time.Second)
		}
		for _, fp := range [][]byte{nil, []byte("fp-a")} {
			cl, err, asked := c.claim(t, key, fp)
			if err != nil || cl.Outcome != idem.Duplicate || asked {
				t.Errorf("Claim(%q, %q) = %v, %v, store asked %v; want Duplicate from memory, no error", key, fp, cl.Outcome, err, asked)
			}
		}
		// A fingerprint the store refuses is refused as the store refuses it.
		if _, err := c.Claim(ctx, key, make([]byte, idem.MaxFingerprintBytes+1)); !errors.Is(err, idem.ErrTooLarge) {
			t.Errorf("Claim(%q, oversized fingerprint) = %v; want ErrTooLarge", key, err)
		}
	})
}

// An entry never outlives its record: it ends ClockMargin before the
// record's retention end (Record.Expires), however long MaxAge is.
func TestCacheNeverOutlivesRecord(t *testing.T) {
	eachCacheRig(t, func(t *testing.T, r *cacheRig) {
		// Seconds, not milliseconds: on the stores with a real clock the
		// Duplicate in the window below must not lapse on a busy machine.
		const retention, margin = 3 * time.Second, time.Second
		c := newCacheUnderTest(t, r, idem.Options{Retention: retention},
			idem.CacheOptions{MaxAge: time.Hour, ClockMargin: margin})
		key := "cache-ttl-" + uuid.NewString()
		c.confirm(t, key, nil, []byte("r"))
		cl, err, _ := c.claim(t, key, nil)
		if err != nil || cl.Outcome != idem.Duplicate {
			t.Fatalf("Claim(%q) = %v, %v; want Duplicate", key, cl.Outcome, err)
		}
		if _, _, asked := c.claim(t, key, nil); asked {
			t.Fatalf("Claim(%q) right after = store asked; want the cached record", key)
		}
		// Past the margin before the record's end, the store answers.
		r.pass(cl.Record.Expires.Sub(r.now()) - margin + 20*time.Millisecond)
		cl, err, asked := c.claim(t, key, nil)
		if !asked {
			t.Fatalf("Claim(%q) within ClockMargin of the record's end (Expires %v, now %v) = from memory; want the store asked",
				key, cl.Record.Expires, r.now())
		}
		if err != nil || cl.Outcome != idem.Duplicate {
			t.Fatalf("Claim(%q) = %v, %v; want Duplicate (the record lives yet)", key, cl.Outcome, err)
		}
		// Past the record's end, the key is new again. (A whole retention:
		// on miniredis the TTL moves with FastForward only, not with the
		// real time the calls took.)
		r.pass(retention)
		if cl, err, _ := c.claim(t, key, nil); err != nil || cl.Outcome != idem.Claimed {
			t.Fatalf("Claim(%q) past retention = %v, %v; want Claimed", key, cl.Outcome, err)
		}
	})
}

// A record deleted by hand is answered from memory for at most MaxAge
// after the store was asked; then the store's answer (Claimed) comes back.
func TestCacheDeletedByHand(t *testing.T) {
	eachCacheRig(t, func(t *testing.T, r *cacheRig) {
		if r.del == nil {
			t.Skip("no one can delete a MemoryStore's record by hand")
		}
		const maxAge = 300 * time.Millisecond
		c := newCacheUnderTest(t, r, idem.Options{}, idem.CacheOptions{MaxAge: maxAge})
		key := "cache-del-" + uuid.NewString()
		c.confirm(t, key, nil, []byte("r"))
		if cl, err, _ := c.claim(t, key, nil); err != nil || cl.Outcome != idem.Duplicate {
			t.Fatalf("Claim(%q) = %v, %v; want Duplicate", key, cl.Outcome, err)
		}
		asked := r.now() // no earlier than the store was asked
		if err := r.del(key); err != nil {
			t.Fatalf("deleting %q by hand: %v", key, err)
		}
		if _, err := c.inner.Lookup(context.Background(), key); !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("store's Lookup(%q) after the delete = %v; want ErrNotFound", key, err)
		}
		// Within MaxAge the cache may still answer Duplicate (documented);
		// past it, never.
		r.pass(maxAge - r.now().Sub(asked) + 10*time.Millisecond)
		cl, err, fromStore := c.claim(t, key, nil)
		if err != nil || cl.Outcome != idem.Claimed || !fromStore {
			t.Fatalf("Claim(%q) MaxAge after the store was asked = %v, %v, store asked %v; want Claimed from the store", key, cl.Outcome, err, fromStore)
		}
	})
}

// Memory is bounded in bytes: entries are counted by their size, the least
// recently used make room, and one too large for a shard is not kept.
func TestCacheMaxBytes(t *testing.T) {
	eachCacheRig(t, func(t *testing.T, r *cacheRig) {
		const maxBytes = 16 * 4 * (idem.CacheEntryOverhead + 200)
		c := newCacheUnderTest(t, r, idem.Options{}, idem.CacheOptions{MaxBytes: maxBytes, MaxAge: time.Hour})
		ctx := context.Background()
		prefix := "cache-bytes-" + uuid.NewString() + "-"
		keys := make([]string, 100)
		var cls []*idem.Lease
		for i := range keys {
			keys[i] = fmt.Sprintf("%s%03d", prefix, i)
			cl, err := c.Claim(ctx, keys[i], nil)
			if err != nil || cl.Outcome != idem.Claimed {
				t.Fatalf("Claim(%q) = %v, %v", keys[i], cl.Outcome, err)
			}
			cls = append(cls, cl.Lease)
		}
		if err := c.ConfirmBatch(ctx, cls, nil); err != nil {
			t.Fatalf("ConfirmBatch = %v", err)
		}
		for _, k := range keys {
			if cl, err := c.Claim(ctx, k, make([]byte, 100)); err != nil || cl.Outcome != idem.Duplicate {
				t.Fatalf("Claim(%q) = %v, %v; want Duplicate", k, cl.Outcome, err)
			}
		}
		n, b := c.Size()
		if b > maxBytes || n == 0 || n == len(keys) {
			t.Errorf("Size() after 100 records = %d entries, %d bytes; want some but not all, at most %d bytes", n, b, maxBytes)
		}
		if per := b / int64(n); per < idem.CacheEntryOverhead+int64(len(keys[0])) {
			t.Errorf("Size() = %d bytes for %d entries; want each counted at least its key and CacheEntryOverhead", b, n)
		}
		// The most recently used key is kept.
		if _, _, asked := c.claim(t, keys[len(keys)-1], nil); asked {
			t.Errorf("Claim of the most recently used key asked the store; want it cached")
		}
		// A record larger than a shard's share is never kept.
		big := prefix + "big"
		c.confirm(t, big, nil, make([]byte, maxBytes/16))
		for i, want := range []bool{true, true} {
			if _, _, asked := c.claim(t, big, nil); asked != want {
				t.Errorf("Claim #%d of a record over MaxBytes/16: store asked %v; want %v", i, asked, want)
			}
		}
	})
}

// Leases pass through the cache to the store that granted them: Renew,
// Forget, Confirm and ConfirmBatch of a lease the cache's Claim returned
// work, another store's lease is refused, and a Confirm drops the key's
// entry.
func TestCacheLeasesPassThrough(t *testing.T) {
	eachCacheRig(t, func(t *testing.T, r *cacheRig) {
		c := newCacheUnderTest(t, r, idem.Options{}, idem.CacheOptions{MaxAge: time.Hour})
		ctx := context.Background()
		key := "cache-lease-" + uuid.NewString()
		cl, err := c.Claim(ctx, key, nil)
		if err != nil || cl.Outcome != idem.Claimed {
			t.Fatalf("Claim(%q) = %v, %v; want claimed", key, cl.Outcome, err)
		}
		if err := c.Renew(ctx, cl.Lease); err != nil {
			t.Errorf("Renew through the cache = %v; want nil", err)
		}
		if err := c.Forget(ctx, cl.Lease); err != nil {
			t.Errorf("Forget through the cache = %v; want nil", err)
		}
		if err := c.Renew(ctx, cl.Lease); !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("Renew of a forgotten lease through the cache = %v; want ErrLeaseLost", err)
		}
		cl, err = c.Claim(ctx, key, nil)
		if err != nil || cl.Outcome != idem.Claimed {
			t.Fatalf("Claim(%q) after Forget = %v, %v; want claimed", key, cl.Outcome, err)
		}
		if err := c.Confirm(ctx, cl.Lease, []byte("done")); err != nil {
			t.Errorf("Confirm through the cache = %v; want nil", err)
		}
		if rec, err := c.inner.Lookup(ctx, key); err != nil || !rec.Confirmed || string(rec.Result) != "done" {
			t.Errorf("store's Lookup(%q) = %+v, %v; want the confirmation", key, rec, err)
		}
		batch := []string{key + "/1", key + "/2"}
		bcs, err := c.ClaimBatch(ctx, batch, nil)
		if err != nil {
			t.Fatalf("ClaimBatch = %v", err)
		}
		if err := c.ConfirmBatch(ctx, []*idem.Lease{bcs[0].Lease, bcs[1].Lease}, [][]byte{[]byte("1"), []byte("2")}); err != nil {
			t.Errorf("ConfirmBatch through the cache = %v; want nil", err)
		}
		other := memStore(idem.Options{})
		foreign := claimLease(t, other)
		if err := c.Confirm(ctx, foreign, nil); !errors.Is(err, idem.ErrInvalidLease) {
			t.Errorf("Confirm of another store's lease through the cache = %v; want ErrInvalidLease", err)
		}
	})
}

// ClaimBatch answers the keys it has cached from memory and passes the
// others on in one batch, merging the answers in order; input the store
// refuses fails the whole batch with the store's own words, before any
// I/O.
func TestCacheClaimBatch(t *testing.T) {
	eachCacheRig(t, func(t *testing.T, r *cacheRig) {
		c := newCacheUnderTest(t, r, idem.Options{}, idem.CacheOptions{MaxAge: time.Hour})
		ctx := context.Background()
		p := "cache-batch-" + uuid.NewString() + "-"
		done1, done2, fresh := p+"done1", p+"done2", p+"fresh"
		c.confirm(t, done1, []byte("a"), []byte("r1"))
		c.confirm(t, done2, []byte("a"), []byte("r2"))
		for _, k := range []string{done1, done2} {
			if cl, err := c.Claim(ctx, k, nil); err != nil || cl.Outcome != idem.Duplicate {
				t.Fatalf("Claim(%q) = %v, %v; want Duplicate", k, cl.Outcome, err)
			}
		}
		before := c.store.calls.Load()
		cs, err := c.ClaimBatch(ctx, []string{done1, fresh, done2}, [][]byte{[]byte("a"), nil, []byte("b")})
		var be *idem.BatchError
		if !errors.As(err, &be) || be.Errs[0] != nil || be.Errs[1] != nil || !errors.Is(be.Errs[2], idem.ErrFingerprintMismatch) {
			t.Fatalf("ClaimBatch = %v; want a *BatchError with ErrFingerprintMismatch for item 2 only", err)
		}
		if n := c.store.calls.Load() - before; n != 1 {
			t.Errorf("keys passed on to the store = %d; want 1 (the two others are cached)", n)
		}
		if cs[0].Outcome != idem.Duplicate || string(cs[0].Record.Result) != "r1" || cs[1].Outcome != idem.Claimed ||
			cs[2].Outcome != idem.Duplicate || string(cs[2].Record.Result) != "r2" {
			t.Errorf("ClaimBatch = %v %v %v; want Duplicate(r1), Claimed, Duplicate(r2)", cs[0].Outcome, cs[1].Outcome, cs[2].Outcome)
		}
		if n := cacheEvents(c.events, idem.OpClaimBatch, idem.CacheHit); n != 1 {
			t.Errorf("ClaimBatch events marked CacheHit = %d; want 1", n)
		}
		if n := cacheEvents(c.events, idem.OpClaimBatch, idem.CacheMiss); n != 1 {
			t.Errorf("ClaimBatch events marked CacheMiss = %d; want 1", n)
		}
		var cmds int64
		if r.cmds != nil {
			cmds = r.cmds.N.Load()
		}
		long := strings.Repeat("k", idem.DefaultMaxKeyBytes+1)
		for _, keys := range [][]string{{done1, long, done2}, {done1, "", done2}} {
			if _, err := c.ClaimBatch(ctx, keys, nil); !errors.Is(err, idem.ErrInvalidKey) || !strings.Contains(err.Error(), "batch item 1") {
				t.Errorf("ClaimBatch with a bad key at 1 among cached ones = %v; want ErrInvalidKey naming batch item 1", err)
			}
		}
		if r.cmds != nil {
			if n := r.cmds.N.Load() - cmds; n != 0 {
				t.Errorf("Redis commands sent for refused batches = %d; want 0", n)
			}
		}
		all, err := c.ClaimBatch(ctx, []string{done1, done2}, nil)
		if err != nil || all[0].Outcome != idem.Duplicate || all[1].Outcome != idem.Duplicate {
			t.Errorf("ClaimBatch of cached keys = %v, %v; want two Duplicates", all, err)
		}
	})
}

// A store failing answers the batch's cached keys all the same, the others
// with its error.
func TestCacheClaimBatchStoreDown(t *testing.T) {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	s := must(idem.NewRedisStore(c, idem.RedisOptions{}))
	cache := must(idem.NewCache(s, idem.CacheOptions{}))
	ctx := context.Background()
	cl := must(cache.Claim(ctx, "done", nil))
	if err := cache.Confirm(ctx, cl.Lease, []byte("r")); err != nil {
		t.Fatal(err)
	}
	if cl, err := cache.Claim(ctx, "done", nil); err != nil || cl.Outcome != idem.Duplicate {
		t.Fatalf("Claim = %v, %v; want Duplicate", cl.Outcome, err)
	}
	m.Close()
	cs, err := cache.ClaimBatch(ctx, []string{"done", "new"}, nil)
	var be *idem.BatchError
	if !errors.As(err, &be) || be.Errs[0] != nil || be.Errs[1] == nil || cs[0].Outcome != idem.Duplicate || cs[1].Outcome != 0 {
		t.Errorf("ClaimBatch with the store down = %v, %v; want Duplicate for the cached key and an error for the other", cs, err)
	}
}

// NewCache refuses options that cannot be right, naming the field.
func TestNewCacheOptions(t *testing.T) {
	s := memStore(idem.Options{})
	for _, tc := range []struct {
		o    idem.CacheOptions
		says string
	}{
		{idem.CacheOptions{MaxBytes: -1}, "idem: CacheOptions.MaxBytes: -1 is negative; 0 means the default, 33554432"},
		{idem.CacheOptions{MaxAge: -time.Second}, "idem: CacheOptions.MaxAge: -1s is negative; 0 means the default, 1s"},
		{idem.CacheOptions{MaxAge: time.Microsecond}, "idem: CacheOptions.MaxAge: 1µs is under 1ms"},
		{idem.CacheOptions{ClockMargin: -time.Second}, "idem: CacheOptions.ClockMargin: -1s is negative; 0 means the default, 1s"},
	} {
		if _, err := idem.NewCache(s, tc.o); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("NewCache(%+v) = %v; want an error saying %q", tc.o, err, tc.says)
		}
	}
	var nilStore *idem.MemoryStore
	if _, err := idem.NewCache(nilStore, idem.CacheOptions{}); err == nil || !strings.Contains(err.Error(), "nil Store") {
		t.Errorf("NewCache(typed nil) = %v; want an error saying nil Store", err)
	}
	c := must(idem.NewCache(s, idem.CacheOptions{}))
	if got := c.MaxResultBytes(); got != idem.DefaultMaxResultBytes {
		t.Errorf("MaxResultBytes() = %d; want the store's %d", got, idem.DefaultMaxResultBytes)
	}
}

// A Cache around a store answers a key confirmed before from memory.
func ExampleNewCache() {
	store, _ := idem.NewMemoryStore(idem.Options{})
	cache, err := idem.NewCache(store, idem.CacheOptions{MaxBytes: 64 << 20, MaxAge: time.Second})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	c, _ := cache.Claim(ctx, "order-42", nil)
	_ = cache.Confirm(ctx, c.Lease, []byte("receipt-7"))
	for range 3 {
		c, _ = cache.Claim(ctx, "order-42", nil) // the store, then memory
		fmt.Println(c.Outcome, string(c.Record.Result))
	}
	entries, _ := cache.Size()
	fmt.Println("cached:", entries)
	// Output:
	// duplicate receipt-7
	// duplicate receipt-7
	// duplicate receipt-7
	// cached: 1
}

// A quarantined record is never cached: a Lookup that returned one leaves
// nothing in memory, and the next Claim is still the store's answer,
// ErrQuarantined — not a Duplicate replayed from the record the Lookup
// saw (a crash loop's key answered as done).
func TestCacheQuarantined(t *testing.T) {
	eachCacheRig(t, func(t *testing.T, r *cacheRig) {
		const lease = idem.MinLeaseTTL
		c := newCacheUnderTest(t, r, idem.Options{LeaseTTL: lease, MaxTakeOvers: 1}, idem.CacheOptions{MaxAge: time.Hour})
		ctx := context.Background()
		key := "cache-quarantined-" + uuid.NewString()
		for i := range 2 {
			if cl, err := c.Claim(ctx, key, []byte("fp")); err != nil || cl.Outcome != idem.Claimed {
				t.Fatalf("Claim(%q) attempt %d = %v, %v; want claimed", key, i+1, cl.Outcome, err)
			}
			r.pass(2 * lease) // the holder crashed
		}
		if _, err := c.Claim(ctx, key, []byte("fp")); !errors.Is(err, idem.ErrQuarantined) {
			t.Fatalf("Claim(%q) after %d crashed attempts = %v; want ErrQuarantined", key, 2, err)
		}
		for i := range 3 {
			rec, err := c.Lookup(ctx, key)
			if err != nil || !rec.Quarantined || rec.Confirmed {
				t.Fatalf("Lookup(%q) #%d of a quarantined key = %+v, %v; want the quarantined record", key, i, rec, err)
			}
			cl, err, asked := c.claim(t, key, []byte("fp"))
			if !errors.Is(err, idem.ErrQuarantined) || cl.Outcome == idem.Duplicate || !asked {
				t.Fatalf("Claim(%q) #%d after a Lookup of its quarantined record = %v, %v, store asked %v; want ErrQuarantined from the store",
					key, i, cl.Outcome, err, asked)
			}
		}
	})
}

// --- Benchmarks ---

// The cache side by side with its store on the real Redis
// (IDEM_REDIS_ADDR), round after round in one run, so that the machine's
// load weighs on both alike:
//
//	go test -run '^$' -bench CacheCompare -benchtime 1s -idem.cacherounds 5 .
//
// Each round runs, with and without a Cache: the middleware's replay at 64
// goroutines, its first write (a new key each request: what the cache
// costs where it cannot help), a consumer at 64 goroutines whose messages are 80%
// duplicates of hot keys, and a Claim of a confirmed key at one goroutine
// (cmds/op: the Redis commands each duplicate sends). At the end the
// benchmark logs each workload's ratio, with ÷ without, per round and the
// median (on standard output).

var cacheRounds = flag.Int("idem.cacherounds", 1, "rounds of BenchmarkCacheCompare")

// cacheGoroutines is how many goroutines the throughput workloads run.
const cacheGoroutines = 64

func BenchmarkCacheCompare(b *testing.B) {
	c := testenv.Redis(b)
	cmds := &testenv.IOCounter{}
	c.AddHook(cmds)
	workloads := []struct {
		name string
		run  func(b *testing.B, s idem.Store) float64
	}{
		{"MiddlewareReplay", benchReplay},
		{"MiddlewareFirstWrite", benchFirstWrite},
		{"Consumer80PercentDuplicates", benchConsumerDuplicates},
		{"DuplicateClaim", func(b *testing.B, s idem.Store) float64 { return benchDuplicateClaim(b, s, cmds) }},
	}
	rates := map[string][]float64{}
	for round := range *cacheRounds {
		for _, w := range workloads {
			// Which goes first alternates, so that neither always runs on
			// the other's leftovers (connections warm, keys in Redis).
			order := []bool{false, true}
			if round%2 == 1 {
				order = []bool{true, false}
			}
			for _, cached := range order {
				name := w.name + "/nocache"
				if cached {
					name = w.name + "/cache"
				}
				var rate float64
				b.Run(name, func(b *testing.B) {
					var s idem.Store = newBenchRedisStore(b, c)
					if cached {
						s = must(idem.NewCache(s, idem.CacheOptions{}))
					}
					rate = w.run(b, s)
				})
				if rate > 0 { // not filtered out by -bench
					rates[name] = append(rates[name], rate)
				}
			}
		}
	}
	for _, w := range workloads[:3] {
		with, without := rates[w.name+"/cache"], rates[w.name+"/nocache"]
		if len(with) == 0 || len(with) != len(without) {
			continue
		}
		ratios := make([]float64, len(with))
		for i := range with {
			ratios[i] = with[i] / without[i]
		}
		sorted := slices.Clone(ratios)
		slices.Sort(sorted)
		// Printed, not logged: a benchmark with sub-benchmarks shows its
		// own log only with -v.
		fmt.Printf("%s at %d goroutines, with ÷ without the cache: median %.2f× (%.2f–%.2f) over %d rounds: %s\n",
			w.name, cacheGoroutines, sorted[len(sorted)/2], sorted[0], sorted[len(sorted)-1], len(ratios), fmtRatios(ratios))
	}
}

func fmtRatios(rs []float64) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = strconv.FormatFloat(r, 'f', 2, 64)
	}
	return strings.Join(s, " ")
}

// newBenchRedisStore returns a RedisStore under a prefix of its own, whose
// keys are deleted when b ends.
func newBenchRedisStore(b *testing.B, c *redis.Client) *idem.RedisStore {
	b.Helper()
	prefix := testenv.UniquePrefix()
	b.Cleanup(func() { _ = testenv.DeletePrefix(context.Background(), c, prefix) })
	return must(idem.NewRedisStore(c, idem.RedisOptions{Prefix: prefix, Retention: 10 * time.Minute}))
}

// parallel runs body in cacheGoroutines goroutines until b.N calls were
// made, and returns the calls per second.
func parallel(b *testing.B, body func(pb *testing.PB)) float64 {
	b.ReportAllocs()
	b.SetParallelism(max(1, (cacheGoroutines+runtime.GOMAXPROCS(0)-1)/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	b.RunParallel(body)
	rate := float64(b.N) / b.Elapsed().Seconds()
	b.ReportMetric(rate, "msgs/s")
	return rate
}

// benchReplay: the middleware's replay on s, each goroutine replaying its
// own key after the first request wrote it.
func benchReplay(b *testing.B, s idem.Store) float64 {
	h := orders(b, s)
	var next atomic.Int64
	return parallel(b, func(pb *testing.PB) {
		key := "replay-" + strconv.FormatInt(next.Add(1), 10)
		if err := serveOrder(h, key, false); err != nil {
			b.Error(err)
			return
		}
		for pb.Next() {
			if err := serveOrder(h, key, true); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// benchFirstWrite: the middleware's first write on s, a new key each
// request.
func benchFirstWrite(b *testing.B, s idem.Store) float64 {
	h := orders(b, s)
	var next atomic.Int64
	return parallel(b, func(pb *testing.PB) {
		for pb.Next() {
			if err := serveOrder(h, "first-"+strconv.FormatInt(next.Add(1), 10), false); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// orders returns the middleware on s around a handler that creates an
// order.
func orders(b *testing.B, s idem.Store) http.Handler {
	mw, err := middleware.New(middleware.Options{Store: s, SingleTenant: true})
	if err != nil {
		b.Fatal(err)
	}
	return mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"ord_123","status":"created"}`))
	}))
}

// serveOrder sends one order to h in process and checks that it was
// created, and replayed when replay is set.
func serveOrder(h http.Handler, key string, replay bool) error {
	r, err := http.NewRequest(http.MethodPost, "http://bench.test/orders", strings.NewReader(`{"amount":1000,"currency":"eur"}`))
	if err != nil {
		return err
	}
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", key)
	w := &benchWriter{header: http.Header{}}
	h.ServeHTTP(w, r)
	if w.code != http.StatusCreated || (w.header.Get(middleware.HeaderReplayed) == "true") != replay {
		return fmt.Errorf("POST /orders (key %q) = %d, replayed %q; want 201, replayed %v",
			key, w.code, w.header.Get(middleware.HeaderReplayed), replay)
	}
	return nil
}

// benchWriter is the least http.ResponseWriter: headers and status.
type benchWriter struct {
	header http.Header
	code   int
}

func (w *benchWriter) Header() http.Header { return w.header }
func (w *benchWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}
func (w *benchWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return len(p), nil
}

// hotKeys is how many keys the consumer's duplicates are spread over.
const hotKeys = 1000

// benchConsumerDuplicates: consumer.Idempotent on s, 80% of the messages
// duplicates of hot keys handled before (a redelivery storm after a
// rebalance), 20% new keys, each handled once.
func benchConsumerDuplicates(b *testing.B, s idem.Store) float64 {
	type msg struct{ id string }
	var handled atomic.Int64
	handle := consumer.Idempotent(s, func(m msg) string { return m.id },
		func(context.Context, msg) error { handled.Add(1); return nil })
	ctx := context.Background()
	for i := range hotKeys {
		if err := handle(ctx, msg{"hot-" + strconv.Itoa(i)}); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Int64
	handled.Store(0)
	var fresh atomic.Int64
	rate := parallel(b, func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(uint64(next.Add(1)), 0))
		for pb.Next() {
			id := "hot-" + strconv.Itoa(rng.IntN(hotKeys))
			if rng.IntN(10) < 2 {
				id = "new-" + strconv.FormatInt(next.Add(1), 10)
				fresh.Add(1)
			}
			if err := handle(ctx, msg{id}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	if h, f := handled.Load(), fresh.Load(); h != f {
		b.Errorf("handler ran %d times for %d new keys; want once each, never for a duplicate", h, f)
	}
	return rate
}

// benchDuplicateClaim: Claim of one confirmed key, at one goroutine; cmds/op
// is the Redis commands each sends.
func benchDuplicateClaim(b *testing.B, s idem.Store, cmds *testenv.IOCounter) float64 {
	ctx := context.Background()
	cl := must(s.Claim(ctx, "dup", nil))
	if err := s.Confirm(ctx, cl.Lease, []byte("result")); err != nil {
		b.Fatal(err)
	}
	if cl, err := s.Claim(ctx, "dup", nil); err != nil || cl.Outcome != idem.Duplicate {
		b.Fatalf("Claim = %v, %v; want Duplicate", cl.Outcome, err)
	}
	b.ReportAllocs()
	before := cmds.N.Load()
	b.ResetTimer()
	for range b.N {
		if cl, err := s.Claim(ctx, "dup", nil); err != nil || cl.Outcome != idem.Duplicate {
			b.Fatalf("Claim = %v, %v; want Duplicate", cl.Outcome, err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(cmds.N.Load()-before)/float64(b.N), "cmds/op")
	return float64(b.N) / b.Elapsed().Seconds()
}
