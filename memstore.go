package idem

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
	token       int64
	owner       string
	fingerprint []byte
	result      []byte
	expires     time.Time
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

// live returns the key's record if it has not expired, deleting it if it has.
// The caller holds the lock.
func (d *memData) live(key string, now time.Time) *memRecord {
	r := d.recs[key]
	if r != nil && !now.Before(r.expires) {
		delete(d.recs, key)
		return nil
	}
	return r
}

// wrote counts a write and, now and then, drops every expired record, so
// that keys nobody asks for again do not pile up. The cost is amortized over
// the writes: a full scan at most once per len(recs) writes.
func (d *memData) wrote(now time.Time) {
	d.writes++
	if len(d.recs) < d.nextCap || d.writes < len(d.recs) {
		return
	}
	for k, r := range d.recs {
		if !now.Before(r.expires) {
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
	}
	return rec
}

// Claim implements Store.
func (m *MemoryStore) Claim(ctx context.Context, key string, fingerprint []byte) (c Claim, err error) {
	start := time.Now()
	defer func() {
		m.core.Observe(ctx, Event{Op: OpClaim, Outcome: c.Outcome, TakeOver: c.TakeOver, Err: err}, key, start)
	}()
	if err := m.core.CheckClaim(key, fingerprint); err != nil {
		return Claim{}, err
	}
	if err := ctx.Err(); err != nil {
		return Claim{}, err
	}
	d := m.data
	d.mu.Lock()
	c = m.claimLocked(key, fingerprint)
	d.mu.Unlock()
	return c, m.core.FingerprintMismatch(c, key, fingerprint)
}

func (m *MemoryStore) claimLocked(key string, fingerprint []byte) Claim {
	d := m.data
	now := d.now()
	// Looked at before live drops it: an expired unconfirmed claim here is
	// a take-over.
	old := d.recs[key]
	takeOver := old != nil && !old.confirmed && !now.Before(old.expires)
	if r := d.live(key, now); r != nil {
		if r.confirmed {
			return Claim{Outcome: Duplicate, Record: r.record(key)}
		}
		return Claim{Outcome: InProgress, Record: r.record(key)}
	}
	d.token++
	r := &memRecord{
		token:       d.token,
		owner:       m.core.o.Worker,
		fingerprint: bytes.Clone(fingerprint),
		expires:     now.Add(m.core.o.LeaseTTL),
	}
	d.recs[key] = r
	d.wrote(now)
	return Claim{Outcome: Claimed, TakeOver: takeOver,
		Lease: m.core.Lease(key, r.token, m.core.o.LeaseTTL, r.expires, bytes.Clone(fingerprint))}
}

// holds reports whether r is l's own live claim.
func holds(r *memRecord, l *Lease) bool {
	return r != nil && !r.confirmed && r.owner == l.Owner && r.token == l.Token
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
	r := d.live(l.Key, now)
	if r != nil && r.confirmed {
		// The first confirmation stays: duplicates may have been answered
		// with it already.
		if r.token != l.Token {
			return true, m.core.AlreadyConfirmed(l)
		}
		return false, nil
	}
	late = !holds(r, l)
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

// ClaimBatch implements Batcher: the whole batch is claimed under one lock.
func (m *MemoryStore) ClaimBatch(ctx context.Context, keys []string, fingerprints [][]byte) (cs []Claim, err error) {
	start := time.Now()
	defer func() { m.core.Observe(ctx, Event{Op: OpClaimBatch, Items: len(keys), Err: err}, "", start) }()
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
		cs[i] = m.claimLocked(k, batch.Item(fingerprints, i))
		errs = batch.Collect(errs, len(keys), i, m.core.FingerprintMismatch(cs[i], k, batch.Item(fingerprints, i)))
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

// MaxResultBytes returns the largest result Confirm accepts (the option
// resolved to its default), so that a wrapper recording responses can
// refuse, where it is configured, a limit the store would not hold.
func (m *MemoryStore) MaxResultBytes() int { return m.core.o.MaxResultBytes }
