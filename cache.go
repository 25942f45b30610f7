package idem

// Over 500 lines, one concept: the Cache's every Store method and the
// bounded, sharded memory behind them, which only those methods touch.

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"sync"
	"time"

	"github.com/idemgo/idem/internal/badopt"
	"github.com/idemgo/idem/internal/nilcheck"

	"github.com/idemgo/idem/internal/batch"
)

// CacheOptions configure NewCache in one flat literal. The zero value is
// valid: every zero field means its documented default.
type CacheOptions struct {
	// MaxBytes bounds the memory the entries take, counted as their key,
	// fingerprint and result plus CacheEntryOverhead each. The least
	// recently used entries make room for new ones; a record larger than a
	// sixteenth of MaxBytes is not cached. Default 32 MiB.
	MaxBytes int64
	// MaxAge bounds how long an entry answers after the store was asked:
	// a record that the store no longer holds although its retention has
	// not run out (deleted by hand, a Redis that lost it in a failover) is
	// still answered Duplicate by the cache for at most MaxAge. At least
	// 1ms. Default 1s.
	MaxAge time.Duration
	// ClockMargin ends an entry this long before its record's retention
	// end (Record.Expires), for the distance the store's clock may move
	// from this process's while the entry lives (a clock stepped forward on
	// the server). Default 1s.
	ClockMargin time.Duration
	// Now is the clock that the store's Record.Expires are reckoned by:
	// time.Now for RedisStore and sqlstore.Store, the clock given to
	// NewMemoryStoreClock for such a MemoryStore (a test that moves it
	// must move the cache's too). Default time.Now.
	Now func() time.Time
	// Observer receives one Event per Claim, Lookup or ClaimBatch that the
	// cache answers without the store, with Cache set to CacheHit; give it
	// the store's Observer, whose events of the calls the cache passed on
	// say CacheMiss. Default: none.
	Observer Observer
	// KeyHasher hashes keys in the cache's events and errors; give it the
	// store's. Default: a random secret per process.
	KeyHasher *KeyHasher
}

// Defaults of CacheOptions.
const (
	DefaultCacheMaxBytes    = 32 << 20
	DefaultCacheMaxAge      = time.Second
	DefaultCacheClockMargin = time.Second
)

// CacheEntryOverhead is what one cached record is counted to cost beyond
// its key, fingerprint and result: the entry, its Record and its share of
// the map, measured on amd64 and rounded up.
const CacheEntryOverhead = 256

// cacheShards spreads the entries over independently locked parts, so that
// goroutines answering different keys rarely wait for one another. A
// power of two.
const cacheShards = 16

// Cache is a Store and Batcher that keeps, in this process, the confirmed
// records its store answered, and answers a Claim or Lookup of such a key
// from memory: Duplicate, with no round trip. Use it where duplicates come
// often (webhook storms, redeliveries after a consumer rebalance, clients
// that retry); put it around any Store and hand it to the middleware, the
// consumer wrapper or Do as the store.
//
// It is exact about what it answers:
//   - Only confirmed records are kept, as the store returned them (from a
//     Duplicate, even one with ErrFingerprintMismatch, or a Lookup): a
//     confirmed record never changes until its retention ends, while a
//     claim may end at any moment. Claimed and InProgress always come from
//     the store.
//   - The fingerprint check is the store's: a cached record made with
//     another fingerprint is answered with an error wrapping
//     ErrFingerprintMismatch together with the Claim, as the store does.
//   - An entry ends ClockMargin before its record's retention end
//     (Record.Expires, which every store reckons conservatively as the
//     time its call was sent plus what the store said remained), and
//     MaxAge after the store was asked, whichever comes first: a record
//     the store no longer holds is answered for at most MaxAge.
//   - Memory is bounded in bytes (MaxBytes), not entries.
//
// Renew, Confirm, Forget and ConfirmBatch go to the store with the lease
// as given: a lease belongs to the store that granted it, and the cache's
// Claim returns the store's. Confirm drops the key's entry rather than
// writing one: a nil from Confirm does not say which result the store
// kept (a repeated Confirm of one lease keeps the first) nor when its
// retention began, so the next Claim of the key asks the store.
//
// A Cache is safe for concurrent use. Its zero value is not usable: call
// NewCache.
type Cache struct {
	s Store
	b Batcher // s as a Batcher, nil when it is not one

	core   Core // the cache's events and errors: Observer and KeyHasher
	now    func() time.Time
	maxAge time.Duration
	margin time.Duration

	seed   maphash.Seed
	shards [cacheShards]cacheShard
}

// NewCache returns a Cache of s's confirmed records, or an error naming
// the option at fault (a negative size or duration) or a nil s.
func NewCache(s Store, o CacheOptions) (*Cache, error) {
	if nilcheck.Nil(s) {
		return nil, errors.New("idem: NewCache with a nil Store")
	}
	switch {
	case o.MaxBytes < 0:
		return nil, badopt.Default("idem", "CacheOptions.MaxBytes", o.MaxBytes, DefaultCacheMaxBytes, "is negative")
	case o.MaxAge < 0:
		return nil, badopt.Default("idem", "CacheOptions.MaxAge", o.MaxAge, DefaultCacheMaxAge, "is negative")
	case o.MaxAge > 0 && o.MaxAge < time.Millisecond:
		return nil, badopt.Error("idem", "CacheOptions.MaxAge", o.MaxAge, "is under 1ms")
	case o.ClockMargin < 0:
		return nil, badopt.Default("idem", "CacheOptions.ClockMargin", o.ClockMargin, DefaultCacheClockMargin, "is negative")
	}
	c := &Cache{
		s:      s,
		core:   Core{o: Options{Observer: o.Observer, KeyHasher: o.KeyHasher}},
		now:    o.Now,
		maxAge: o.MaxAge,
		margin: o.ClockMargin,
		seed:   maphash.MakeSeed(),
	}
	c.b, _ = s.(Batcher)
	if c.now == nil {
		c.now = time.Now
	}
	if c.maxAge == 0 {
		c.maxAge = DefaultCacheMaxAge
	}
	if c.margin == 0 {
		c.margin = DefaultCacheClockMargin
	}
	maxBytes := o.MaxBytes
	if maxBytes == 0 {
		maxBytes = DefaultCacheMaxBytes
	}
	for i := range c.shards {
		sh := &c.shards[i]
		sh.m = make(map[string]*cacheEntry)
		sh.max = maxBytes / cacheShards
		sh.head.prev, sh.head.next = &sh.head, &sh.head
	}
	return c, nil
}

// Claim implements Store: Duplicate from memory when the key's confirmed
// record is cached, else the store's answer, whose confirmed record it
// then keeps.
func (c *Cache) Claim(ctx context.Context, key string, fingerprint []byte) (Claim, error) {
	start := time.Now()
	if rec := c.hit(ctx, key, fingerprint); rec != nil {
		cl := Claim{Outcome: Duplicate, Record: rec}
		err := c.core.FingerprintMismatch(cl, key, fingerprint)
		c.core.Observe(ctx, Event{Op: OpClaim, Outcome: Duplicate, Cache: CacheHit, Err: err}, key, start)
		return cl, err
	}
	sent := c.now()
	cl, err := c.s.Claim(missContext(ctx), key, fingerprint)
	if cl.Outcome == Duplicate && (err == nil || errors.Is(err, ErrFingerprintMismatch)) {
		c.put(key, cl.Record, sent)
	}
	return cl, err
}

// Lookup implements Store: the key's confirmed record from memory when it
// is cached, else the store's answer, whose confirmed record it then
// keeps.
func (c *Cache) Lookup(ctx context.Context, key string) (*Record, error) {
	start := time.Now()
	if rec := c.hit(ctx, key, nil); rec != nil {
		c.core.Observe(ctx, Event{Op: OpLookup, Cache: CacheHit}, key, start)
		return rec, nil
	}
	sent := c.now()
	rec, err := c.s.Lookup(missContext(ctx), key)
	if err == nil {
		c.put(key, rec, sent)
	}
	return rec, err
}

// Renew implements Store: the store renews l.
func (c *Cache) Renew(ctx context.Context, l *Lease) error { return c.s.Renew(ctx, l) }

// Forget implements Store: the store forgets l.
func (c *Cache) Forget(ctx context.Context, l *Lease) error { return c.s.Forget(ctx, l) }

// Confirm implements Store: the store confirms l, and the cache drops what
// it held for l's key (see Cache).
func (c *Cache) Confirm(ctx context.Context, l *Lease, result []byte) error {
	err := c.s.Confirm(ctx, l, result)
	if l != nil {
		c.drop(l.Key)
	}
	return err
}

// ClaimBatch implements Batcher: the keys whose confirmed records are
// cached are answered from memory, the others are claimed by the store in
// one ClaimBatch (one Claim each when the store is not a Batcher), and the
// answers merged in the order of keys. When the store fails the whole
// call, the items it was to answer fail with its error in a *BatchError
// and the cached ones are still answered; input the store refuses is
// refused for the whole batch, as the store refuses it.
func (c *Cache) ClaimBatch(ctx context.Context, keys []string, fingerprints [][]byte) ([]Claim, error) {
	if err := claimBatchPairs(keys, fingerprints); err != nil {
		return nil, err
	}
	start := time.Now()
	cs := make([]Claim, len(keys))
	var (
		missed []int // indexes of the keys the store must answer
		errs   []error
		hits   int
		hitErr []error
	)
	for i, k := range keys {
		fp := batch.Item(fingerprints, i)
		rec := c.hit(ctx, k, fp)
		if rec == nil {
			missed = append(missed, i)
			continue
		}
		hits++
		cs[i] = Claim{Outcome: Duplicate, Record: rec}
		err := c.core.FingerprintMismatch(cs[i], k, fp)
		errs = batch.Collect(errs, len(keys), i, err)
		hitErr = batch.Collect(hitErr, len(keys), i, err)
	}
	if len(missed) == len(keys) {
		// Nothing answered here: the store's answer is the whole answer.
		return c.claimMissed(ctx, keys, fingerprints)
	}
	if len(missed) > 0 {
		mk := make([]string, len(missed))
		var mf [][]byte
		if fingerprints != nil {
			mf = make([][]byte, len(missed))
		}
		for j, i := range missed {
			mk[j] = keys[i]
			if mf != nil {
				mf[j] = fingerprints[i]
			}
		}
		mcs, err := c.claimMissed(ctx, mk, mf)
		var be *BatchError
		switch {
		case err == nil:
		case errors.As(err, &be) && len(be.Errs) == len(missed):
			for j, i := range missed {
				errs = batch.Collect(errs, len(keys), i, be.Errs[j])
			}
		case errors.Is(err, ErrInvalidKey) || errors.Is(err, ErrTooLarge):
			// Refused before any I/O, and named by its index among the
			// keys passed on: the whole batch again gets the store's own
			// words for it, still without I/O.
			return c.claimMissed(ctx, keys, fingerprints)
		default:
			for _, i := range missed {
				errs = batch.Collect(errs, len(keys), i, err)
			}
		}
		for j, i := range missed {
			if mcs != nil {
				cs[i] = mcs[j]
			}
		}
	}
	e := Event{Op: OpClaimBatch, Items: hits, Cache: CacheHit}
	if hitErr != nil {
		e.Err = &BatchError{Errs: hitErr}
	}
	c.core.Observe(ctx, e, "", start)
	if errs != nil {
		return cs, &BatchError{Errs: errs}
	}
	return cs, nil
}

// claimMissed has the store claim keys, in one ClaimBatch when it is a
// Batcher, and keeps the confirmed records it answers.
func (c *Cache) claimMissed(ctx context.Context, keys []string, fingerprints [][]byte) ([]Claim, error) {
	sent := c.now()
	mctx := missContext(ctx)
	var (
		cs  []Claim
		err error
	)
	if c.b != nil {
		cs, err = c.b.ClaimBatch(mctx, keys, fingerprints)
	} else {
		cs = make([]Claim, len(keys))
		var errs []error
		for i, k := range keys {
			var e error
			cs[i], e = c.s.Claim(mctx, k, batch.Item(fingerprints, i))
			errs = batch.Collect(errs, len(keys), i, e)
		}
		if errs != nil {
			err = &BatchError{Errs: errs}
		}
	}
	for i, cl := range cs {
		if cl.Outcome == Duplicate {
			c.put(keys[i], cl.Record, sent)
		}
	}
	return cs, err
}

// ConfirmBatch implements Batcher: the store confirms the leases (in one
// ConfirmBatch when it is a Batcher, else one Confirm each), and the cache
// drops what it held for their keys.
func (c *Cache) ConfirmBatch(ctx context.Context, leases []*Lease, results [][]byte) error {
	var err error
	if c.b != nil {
		err = c.b.ConfirmBatch(ctx, leases, results)
	} else if err := confirmBatchPairs(leases, results); err != nil {
		return err
	} else {
		var errs []error
		for i, l := range leases {
			errs = batch.Collect(errs, len(leases), i, c.s.Confirm(ctx, l, batch.Item(results, i)))
		}
		if errs != nil {
			err = &BatchError{Errs: errs}
		}
	}
	for _, l := range leases {
		if l != nil {
			c.drop(l.Key)
		}
	}
	return err
}

// Checkpoint implements Checkpointer: the store records the checkpoint,
// or, when it is not a Checkpointer, an error saying so.
func (c *Cache) Checkpoint(ctx context.Context, l *Lease, data []byte) error {
	cp, ok := c.s.(Checkpointer)
	if !ok {
		return fmt.Errorf("idem: Checkpoint: the cache's store %T does not implement idem.Checkpointer", c.s)
	}
	return cp.Checkpoint(ctx, l, data)
}

// Abandon implements Abandoner: the store records the reason (the cache
// holds no claim), or, when it is not an Abandoner, an error wrapping
// errors.ErrUnsupported.
func (c *Cache) Abandon(ctx context.Context, l *Lease, reason string) error {
	a, ok := c.s.(Abandoner)
	if !ok {
		return fmt.Errorf("idem: Abandon: the cache's store %T does not implement idem.Abandoner: %w", c.s, errors.ErrUnsupported)
	}
	return a.Abandon(ctx, l, reason)
}

// Resolve implements Resolver: the store settles the key (the cache holds
// no quarantined key), or, when it is not a Resolver, an error saying so.
// A forced forget drops the key from this cache too; other processes'
// caches answer it for up to their MaxAge.
func (c *Cache) Resolve(ctx context.Context, key string, r Resolution) error {
	rs, ok := c.s.(Resolver)
	if !ok {
		return fmt.Errorf("idem: Resolve: the cache's store %T does not implement idem.Resolver", c.s)
	}
	err := rs.Resolve(ctx, key, r)
	if r.Force {
		c.drop(key)
	}
	return err
}

// Inspect implements Inspector: the store's answer (the cache holds no
// lapsed claim), or, when it is not an Inspector, an error saying so.
func (c *Cache) Inspect(ctx context.Context, key string) (*Record, error) {
	in, ok := c.s.(Inspector)
	if !ok {
		return nil, fmt.Errorf("idem: Inspect: the cache's store %T does not implement idem.Inspector", c.s)
	}
	return in.Inspect(ctx, key)
}

// Quarantined implements Resolver: the store's quarantined records.
func (c *Cache) Quarantined(ctx context.Context, limit int) ([]*Record, error) {
	rs, ok := c.s.(Resolver)
	if !ok {
		return nil, fmt.Errorf("idem: Quarantined: the cache's store %T does not implement idem.Resolver", c.s)
	}
	return rs.Quarantined(ctx, limit)
}

// MaxResultBytes returns the store's MaxResultBytes when it reports one
// (the stores of this module do), else math.MaxInt: no limit known here.
// A wrapper that records responses sizes them by it.
func (c *Cache) MaxResultBytes() int {
	if l, ok := c.s.(interface{ MaxResultBytes() int }); ok {
		return l.MaxResultBytes()
	}
	return math.MaxInt
}

// Size returns how many records the cache holds and the bytes they are
// counted to take (see CacheOptions.MaxBytes).
func (c *Cache) Size() (entries int, bytes int64) {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		entries += len(sh.m)
		bytes += sh.bytes
		sh.mu.Unlock()
	}
	return entries, bytes
}

// cacheEntry is one cached confirmed record, in its shard's map and in its
// list from the most to the least recently used.
type cacheEntry struct {
	key        string
	rec        *Record // never handed out: callers get copies
	expires    time.Time
	size       int64
	prev, next *cacheEntry
}

// cacheShard is one independently locked part of a Cache.
type cacheShard struct {
	mu    sync.Mutex
	m     map[string]*cacheEntry
	head  cacheEntry // list sentinel: head.next is the most recently used
	bytes int64
	max   int64
}

func (c *Cache) shard(key string) *cacheShard {
	return &c.shards[maphash.String(c.seed, key)&(cacheShards-1)]
}

// hit returns a copy of key's cached record, or nil when there is no live
// entry, when fingerprint is one the store would refuse (ErrTooLarge), or
// when ctx is done (the store answers that).
func (c *Cache) hit(ctx context.Context, key string, fingerprint []byte) *Record {
	if len(fingerprint) > MaxFingerprintBytes || ctx.Err() != nil {
		return nil
	}
	sh := c.shard(key)
	now := c.now()
	sh.mu.Lock()
	e := sh.m[key]
	if e == nil {
		sh.mu.Unlock()
		return nil
	}
	if !now.Before(e.expires) {
		sh.remove(e)
		sh.mu.Unlock()
		return nil
	}
	sh.toFront(e)
	rec := e.rec
	sh.mu.Unlock()
	return copyRecord(rec)
}

// put keeps rec, the confirmed record of key that the store answered to a
// call sent at sent, until ClockMargin before its retention end or MaxAge
// after sent, whichever is first.
func (c *Cache) put(key string, rec *Record, sent time.Time) {
	if rec == nil || !rec.Confirmed || rec.Key != key {
		return
	}
	end := sent.Add(c.maxAge)
	// A zero Expires is a record that never expires (a Redis key someone
	// persisted): MaxAge alone bounds it.
	if !rec.Expires.IsZero() {
		if e := rec.Expires.Add(-c.margin); e.Before(end) {
			end = e
		}
	}
	if !c.now().Before(end) {
		return
	}
	size := int64(CacheEntryOverhead + len(key) + len(rec.Fingerprint) + len(rec.Result))
	sh := c.shard(key)
	if size > sh.max {
		return
	}
	e := &cacheEntry{key: key, rec: copyRecord(rec), expires: end, size: size}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if old := sh.m[key]; old != nil {
		sh.remove(old)
	}
	for sh.bytes+size > sh.max && sh.head.prev != &sh.head {
		sh.remove(sh.head.prev)
	}
	sh.m[key] = e
	sh.bytes += size
	e.prev, e.next = &sh.head, sh.head.next
	e.next.prev, sh.head.next = e, e
}

// drop removes key's entry, if any.
func (c *Cache) drop(key string) {
	sh := c.shard(key)
	sh.mu.Lock()
	if e := sh.m[key]; e != nil {
		sh.remove(e)
	}
	sh.mu.Unlock()
}

// remove unlinks e from the shard. The caller holds the lock.
func (sh *cacheShard) remove(e *cacheEntry) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
	delete(sh.m, e.key)
	sh.bytes -= e.size
}

// toFront makes e the most recently used. The caller holds the lock.
func (sh *cacheShard) toFront(e *cacheEntry) {
	if sh.head.next == e {
		return
	}
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = &sh.head, sh.head.next
	e.next.prev, sh.head.next = e, e
}

// copyRecord copies r with its fingerprint and result in one allocation,
// each capped so that appending to one never writes into the other.
func copyRecord(r *Record) *Record {
	buf := make([]byte, len(r.Fingerprint)+len(r.Result))
	n := copy(buf, r.Fingerprint)
	copy(buf[n:], r.Result)
	cp := *r
	cp.Fingerprint = buf[:n:n]
	cp.Result = buf[n:]
	// A store answers an empty result as an empty slice, never nil; so
	// does the copy.
	if r.Result == nil {
		cp.Result = nil
	}
	if r.Fingerprint == nil {
		cp.Fingerprint = nil
	}
	return &cp
}
