package idem

// Over 500 lines, one concept: the MemoryStore, the reference every
// store is held to, its records and each operation on them in one place.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemgo/idem/internal/batch"
)

// MemoryStore is a Store that lives in one process: for tests and local
// development, never for work that more than one process may receive. It
// follows the same contract as the shared stores (the storetest suite checks
// it), judges expiry by its clock, and forgets expired records as it goes.
//
// It is safe for concurrent use. Its zero value is not usable: call
// NewMemoryStore.
type MemoryStore struct {
	core Core
	data *memData
}

// memData is the state that stores made with Share have in common.
type memData struct {
	mu      sync.Mutex
	now     func() time.Time
	recs    map[string]*memRecord
	token   int64 // last token issued: one counter for all keys keeps tokens strictly increasing
	writes  int   // writes since the last sweep
	nextCap int   // sweep when the map grows past this
}

type memRecord struct {
	confirmed   bool
	resolved    bool // confirmed by an operator (Record.Resolved)
	quarantined bool
	token       int64
	owner       string
	fingerprint []byte
	result      []byte
	expires     time.Time // the lease's end while claimed; the retention's or quarantine's once not
	// What a claim keeps for the next holder after a take-over.
	claimed    time.Time     // when claimed
	remember   time.Duration // how long a lapsed claim is kept after its lease: its store's Retention
	takeovers  int
	prior      *Attempt
	checkpoint []byte
	ended      string // why this claim's holder gave it up (Abandon); "" when it did not say
}

// NewMemoryStore returns an empty MemoryStore, or an error naming the
// option at fault when o is invalid (a negative duration, a Retention
// shorter than the LeaseTTL).
func NewMemoryStore(o Options) (*MemoryStore, error) {
	return NewMemoryStoreClock(o, time.Now)
}

// NewMemoryStoreClock is NewMemoryStore with the clock that judges expiry,
// so that a test can move time instead of sleeping. now must be safe for
// concurrent use and never go backwards; a nil now is an error.
func NewMemoryStoreClock(o Options, now func() time.Time) (*MemoryStore, error) {
	if now == nil {
		return nil, errors.New("idem: NewMemoryStoreClock: now is nil; pass time.Now or a test clock")
	}
	d := &memData{now: now, recs: make(map[string]*memRecord), nextCap: 1024}
	core, err := newCore(fmt.Sprintf("MemoryStore %p", d), o)
	if err != nil {
		return nil, err
	}
	return &MemoryStore{core: core, data: d}, nil
}

// Share returns a store over m's records with its own options (another
// Worker name, lease or retention), as separate processes would share one
// Redis, or an error naming the option at fault.
func (m *MemoryStore) Share(o Options) (*MemoryStore, error) {
	if err := m.usable(); err != nil {
		return nil, err
	}
	core, err := newCore(m.core.home, o)
	if err != nil {
		return nil, err
	}
	return &MemoryStore{core: core, data: m.data}, nil
}

// usable refuses a MemoryStore that no constructor made.
func (m *MemoryStore) usable() error {
	if m == nil || m.data == nil {
		return errZeroStore
	}
	return nil
}

// claim reports whether r is a claim (live or lapsed).
func (r *memRecord) claim() bool { return !r.confirmed && !r.quarantined }

// lapsed reports whether r is a claim whose lease has run out by now.
func (r *memRecord) lapsed(now time.Time) bool { return r.claim() && !now.Before(r.expires) }

// gone reports whether nothing of r is remembered by now: a claim lives on
// for remember after its lease, so that the next claim is told it takes
// over; anything else ends at its expiry.
func (r *memRecord) gone(now time.Time) bool {
	if r.claim() {
		return !now.Before(r.expires.Add(r.remember))
	}
	return !now.Before(r.expires)
}

// get returns the key's record, lapsed claims included, deleting it once
// nothing of it is remembered. The caller holds the lock.
func (d *memData) get(key string, now time.Time) *memRecord {
	r := d.recs[key]
	if r != nil && r.gone(now) {
		delete(d.recs, key)
		return nil
	}
	return r
}

// live returns the key's record if it is live: a confirmation or
// quarantine within its time, a claim within its lease. The caller holds
// the lock.
func (d *memData) live(key string, now time.Time) *memRecord {
	r := d.get(key, now)
	if r != nil && r.lapsed(now) {
		return nil
	}
	return r
}

// wrote counts a write and, now and then, drops every record nothing of
// which is remembered, so that keys nobody asks for again do not pile up.
// The cost is amortized over the writes: a full scan at most once per
// len(recs) writes.
func (d *memData) wrote(now time.Time) {
	d.writes++
	if len(d.recs) < d.nextCap || d.writes < len(d.recs) {
		return
	}
	for k, r := range d.recs {
		if r.gone(now) {
			delete(d.recs, k)
		}
	}
	d.writes = 0
	d.nextCap = max(1024, 2*len(d.recs))
}

func (r *memRecord) record(key string) *Record {
	rec := &Record{
		Key:         key,
		Confirmed:   r.confirmed,
		Token:       r.token,
		Owner:       r.owner,
		Fingerprint: bytes.Clone(r.fingerprint),
		Result:      bytes.Clone(r.result),
		Expires:     r.expires,
		Resolved:    r.resolved,
	}
	if !r.confirmed {
		rec.Quarantined = r.quarantined
		rec.TakeOvers = r.takeovers
		rec.Checkpoint = bytes.Clone(r.checkpoint)
		rec.Ended = r.ended
		if r.prior != nil {
			p := *r.prior
			rec.Prior = &p
		}
	}
	return rec
}

// Claim implements Store.
func (m *MemoryStore) Claim(ctx context.Context, key string, fingerprint []byte) (c Claim, err error) {
	start := time.Now()
	defer func() {
		m.core.Observe(ctx, Event{Op: OpClaim, Outcome: c.Outcome, TakeOver: c.TakeOver, Prior: c.Prior, Err: err}, key, start)
	}()
	if err := m.core.CheckClaim(key, fingerprint); err != nil {
		return Claim{}, err
	}
	if err := ctx.Err(); err != nil {
		return Claim{}, err
	}
	d := m.data
	d.mu.Lock()
	c, err = m.claimLocked(key, fingerprint)
	d.mu.Unlock()
	if err != nil {
		return c, err
	}
	return c, m.core.FingerprintMismatch(c, key, fingerprint)
}

// claimLocked claims key; err is the quarantine's (with the Claim), the
// only error it can answer.
func (m *MemoryStore) claimLocked(key string, fingerprint []byte) (Claim, error) {
	d := m.data
	now := d.now()
	r := d.get(key, now)
	switch {
	case r == nil:
	case r.confirmed:
		return Claim{Outcome: Duplicate, Record: r.record(key)}, nil
	case r.quarantined:
		rec := r.record(key)
		return Claim{Record: rec}, m.core.Quarantined(rec)
	case !r.lapsed(now):
		return Claim{Outcome: InProgress, Record: r.record(key)}, nil
	case r.takeovers >= m.core.o.MaxTakeOvers:
		// The last take-over allowed lapsed too: stop the crash loop.
		r.quarantined = true
		r.expires = now.Add(m.core.o.Retention)
		rec := r.record(key)
		return Claim{Record: rec}, m.core.Quarantined(rec)
	}
	d.token++
	n := &memRecord{
		token:       d.token,
		owner:       m.core.o.Worker,
		fingerprint: bytes.Clone(fingerprint),
		expires:     now.Add(m.core.o.LeaseTTL),
		claimed:     now,
		remember:    m.core.o.Retention,
	}
	c := Claim{Outcome: Claimed}
	if r != nil {
		// A lapsed claim: taken over, and the next holder told.
		n.takeovers = r.takeovers + 1
		n.prior = &Attempt{Owner: r.owner, Token: r.token, Claimed: r.claimed}
		n.checkpoint = r.checkpoint
		p := *n.prior
		p.Ended = r.ended // told to the next holder, not kept (as on every store)
		c.TakeOver, c.Prior, c.TakeOvers, c.Checkpoint = true, &p, n.takeovers, bytes.Clone(r.checkpoint)
	}
	d.recs[key] = n
	d.wrote(now)
	c.Lease = m.core.Lease(key, n.token, m.core.o.LeaseTTL, n.expires, bytes.Clone(fingerprint))
	return c, nil
}

// holds reports whether r is l's own claim. A quarantined key keeps its
// last attempt's owner and token, but is no one's claim: that attempt,
// stalled and awake again, must not renew it back into a lease or forget
// it, which would start the crash loop again.
func holds(r *memRecord, l *Lease) bool {
	return r != nil && r.claim() && r.owner == l.Owner && r.token == l.Token
}

// Renew implements Store.
func (m *MemoryStore) Renew(ctx context.Context, l *Lease) (err error) {
	start := time.Now()
	defer func() { m.core.Observe(ctx, Event{Op: OpRenew, Err: err}, leaseKey(l), start) }()
	if err := m.core.CheckLease(l); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	d := m.data
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	r := d.live(l.Key, now)
	if !holds(r, l) {
		return m.core.LeaseLost(OpRenew, l)
	}
	r.expires = now.Add(m.core.o.LeaseTTL)
	return nil
}

// Confirm implements Store.
func (m *MemoryStore) Confirm(ctx context.Context, l *Lease, result []byte) (err error) {
	start := time.Now()
	late := false
	defer func() { m.core.Observe(ctx, Event{Op: OpConfirm, Late: late, Err: err}, leaseKey(l), start) }()
	if err := m.core.CheckResult(l, result); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	d := m.data
	d.mu.Lock()
	late, err = m.confirmLocked(l, result)
	d.mu.Unlock()
	if late {
		m.core.LogLate(ctx, l)
	}
	return err
}

// confirmLocked records l's work and reports whether the lease had been
// lost; err is ErrAlreadyConfirmed when another lease's confirmation stays.
func (m *MemoryStore) confirmLocked(l *Lease, result []byte) (late bool, err error) {
	d := m.data
	now := d.now()
	r := d.get(l.Key, now)
	if r != nil && r.confirmed {
		// The first confirmation stays: duplicates may have been answered
		// with it already.
		if r.token != l.Token {
			return true, m.core.AlreadyConfirmed(l)
		}
		return false, nil
	}
	// Over anything else, a quarantine included: the work happened.
	late = !holds(r, l) || r.lapsed(now)
	d.recs[l.Key] = &memRecord{
		confirmed:   true,
		token:       l.Token,
		fingerprint: bytes.Clone(l.Fingerprint),
		result:      append([]byte{}, result...),
		expires:     now.Add(m.core.o.Retention),
	}
	d.wrote(now)
	return late, nil
}

// Forget implements Store.
func (m *MemoryStore) Forget(ctx context.Context, l *Lease) (err error) {
	start := time.Now()
	defer func() { m.core.Observe(ctx, Event{Op: OpForget, Err: err}, leaseKey(l), start) }()
	if err := m.core.CheckForget(l); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	d := m.data
	d.mu.Lock()
	defer d.mu.Unlock()
	if !holds(d.live(l.Key, d.now()), l) {
		return m.core.LeaseLost(OpForget, l)
	}
	delete(d.recs, l.Key)
	return nil
}

// Lookup implements Store.
func (m *MemoryStore) Lookup(ctx context.Context, key string) (rec *Record, err error) {
	start := time.Now()
	defer func() { m.core.Observe(ctx, Event{Op: OpLookup, Err: err}, key, start) }()
	if err := m.core.CheckKey(key); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d := m.data
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.live(key, d.now())
	if r == nil {
		return nil, m.core.NotFound(key)
	}
	return r.record(key), nil
}

// Inspect implements Inspector.
func (m *MemoryStore) Inspect(ctx context.Context, key string) (*Record, error) {
	if err := m.core.CheckKey(key); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d := m.data
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	r := d.get(key, now)
	if r == nil {
		return nil, m.core.NotFound(key)
	}
	rec := r.record(key)
	if r.lapsed(now) {
		rec.Lapsed = &Attempt{Owner: r.owner, Token: r.token, Claimed: r.claimed, Ended: r.ended}
		rec.Expires = r.expires.Add(r.remember)
	}
	return rec, nil
}

// ClaimBatch implements Batcher: the whole batch is claimed under one lock.
func (m *MemoryStore) ClaimBatch(ctx context.Context, keys []string, fingerprints [][]byte) (cs []Claim, err error) {
	start := time.Now()
	defer func() {
		m.core.Observe(ctx, Event{Op: OpClaimBatch, Items: len(keys), Err: err}, "", start)
		m.core.LogTakeOvers(ctx, keys, cs, err)
	}()
	if err := m.core.CheckClaimBatch(keys, fingerprints); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cs = make([]Claim, len(keys))
	d := m.data
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	for i, k := range keys {
		var err error
		if cs[i], err = m.claimLocked(k, batch.Item(fingerprints, i)); err == nil {
			err = m.core.FingerprintMismatch(cs[i], k, batch.Item(fingerprints, i))
		}
		errs = batch.Collect(errs, len(keys), i, err)
	}
	if errs != nil {
		return cs, &BatchError{Errs: errs}
	}
	return cs, nil
}

// ConfirmBatch implements Batcher: the whole batch is confirmed under one lock.
func (m *MemoryStore) ConfirmBatch(ctx context.Context, leases []*Lease, results [][]byte) (err error) {
	start := time.Now()
	var late []*Lease
	defer func() {
		m.core.Observe(ctx, Event{Op: OpConfirmBatch, Items: len(leases), Late: len(late) > 0, Err: err}, "", start)
	}()
	if err := m.core.CheckConfirmBatch(leases, results); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var errs []error
	d := m.data
	d.mu.Lock()
	for i, l := range leases {
		lost, err := m.confirmLocked(l, batch.Item(results, i))
		if lost {
			late = append(late, l)
		}
		errs = batch.Collect(errs, len(leases), i, err)
	}
	d.mu.Unlock()
	for _, l := range late {
		m.core.LogLate(ctx, l)
	}
	if errs != nil {
		return &BatchError{Errs: errs}
	}
	return nil
}

// Checkpoint implements Checkpointer.
func (m *MemoryStore) Checkpoint(ctx context.Context, l *Lease, data []byte) (err error) {
	start := time.Now()
	defer func() { m.core.Observe(ctx, Event{Op: OpCheckpoint, Err: err}, leaseKey(l), start) }()
	if err := m.core.CheckCheckpoint(l, data); err != nil {
		return err
	}
	return m.onHeld(ctx, OpCheckpoint, l, func(r *memRecord) {
		r.checkpoint = nil
		if len(data) > 0 {
			r.checkpoint = bytes.Clone(data)
		}
	})
}

// Abandon implements Abandoner.
func (m *MemoryStore) Abandon(ctx context.Context, l *Lease, reason string) (err error) {
	start := time.Now()
	defer func() { m.core.Observe(ctx, Event{Op: OpAbandon, Err: err}, leaseKey(l), start) }()
	if err := m.core.CheckAbandon(l, reason); err != nil {
		return err
	}
	if err := m.onHeld(ctx, OpAbandon, l, func(r *memRecord) { r.ended = reason }); err != nil {
		return err
	}
	m.core.LogAbandoned(ctx, l, reason)
	return nil
}

// onHeld runs apply on l's own live claim under the lock (the writes only
// a lease's holder makes: Checkpoint, Abandon), or answers ErrLeaseLost.
func (m *MemoryStore) onHeld(ctx context.Context, op Op, l *Lease, apply func(*memRecord)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d := m.data
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.live(l.Key, d.now())
	if !holds(r, l) {
		return m.core.LeaseLost(op, l)
	}
	apply(r)
	return nil
}

// Resolve implements Resolver.
func (m *MemoryStore) Resolve(ctx context.Context, key string, res Resolution) (err error) {
	start := time.Now()
	defer func() { m.core.Observe(ctx, Event{Op: OpResolve, Err: err}, key, start) }()
	if err := m.core.CheckResolve(key, res); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	d := m.data
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	r := d.get(key, now)
	if res.Force {
		switch {
		case r == nil:
			return m.core.NothingToClear(key)
		case r.claim() && !r.lapsed(now):
			return m.core.LiveClaim(key)
		}
		delete(d.recs, key)
		return nil
	}
	if r == nil || !r.quarantined {
		return m.core.NotQuarantined(key)
	}
	if !res.Confirm {
		delete(d.recs, key)
		return nil
	}
	// A token of its own: a stalled attempt's late Confirm is then told
	// another confirmation was kept.
	d.token++
	d.recs[key] = &memRecord{confirmed: true, resolved: true, token: d.token, fingerprint: r.fingerprint,
		result: append([]byte{}, res.Result...), expires: now.Add(m.core.o.Retention)}
	d.wrote(now)
	return nil
}

// Quarantined implements Resolver.
func (m *MemoryStore) Quarantined(ctx context.Context, limit int) ([]*Record, error) {
	if err := m.usable(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d := m.data
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	var out []*Record
	for k, r := range d.recs {
		if r.quarantined && !r.gone(now) && (limit <= 0 || len(out) < limit) {
			out = append(out, r.record(k))
		}
	}
	return out, nil
}

// MaxResultBytes returns the largest result Confirm accepts (the option
// resolved to its default), so that a wrapper recording responses can
// refuse, where it is configured, a limit the store would not hold.
func (m *MemoryStore) MaxResultBytes() int { return m.core.o.MaxResultBytes }
