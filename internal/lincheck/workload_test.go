package lincheck

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/idemgo/idem"
)

// memWorkload runs clients on one MemoryStore, through wrap.
func memWorkload(i int, cut float64, wrap func(s idem.Store, worker string) idem.Store) Workload {
	m := memStore(idem.Options{LeaseTTL: time.Hour})
	w := Workload{Ops: 20, Cut: cut, Batch: 0.3}
	for c := range 5 {
		worker := fmt.Sprintf("w%d", c/2) // two clients per worker
		w.Clients = append(w.Clients, Client{Store: wrap(must(m.Share(idem.Options{LeaseTTL: time.Hour, Worker: worker})), worker), Worker: worker})
	}
	for k := range 3 {
		w.Keys = append(w.Keys, fmt.Sprintf("h%d\x00{k%d}", i, k))
	}
	return w
}

func same(s idem.Store, _ string) idem.Store { return s }

// TestMemoryStoreLinearizable checks the reference store, and that the
// recorder and model agree with it, unknown outcomes included.
func TestMemoryStoreLinearizable(t *testing.T) {
	tally := Verify(t, 50, 1, "idem.seed", func(i int) Workload { return memWorkload(i, 0.1, same) })
	t.Logf("MemoryStore: %v", tally)
	// A batch call records one operation per item.
	if tally.Histories != 50 || tally.Ops <= 50*5*20 {
		t.Errorf("checked %v; want 50 histories of 100 calls, some of them batches", tally)
	}
}

// cutAfter makes every n-th call report context.DeadlineExceeded after it
// took effect, and every other n-th call before it could: the model must
// accept both as unknown outcomes.
type cutAfter struct {
	idem.Store
	n     int64
	calls *atomic.Int64
}

func (c cutAfter) cut(ctx context.Context, do func(ctx context.Context) error) error {
	switch n := c.calls.Add(1); {
	case n%c.n == 0:
		_ = do(ctx)
		return context.DeadlineExceeded
	case n%c.n == c.n/2:
		ctx, cancel := context.WithCancel(ctx)
		cancel()
		return do(ctx)
	}
	return do(ctx)
}

func (c cutAfter) Claim(ctx context.Context, key string, fp []byte) (cl idem.Claim, err error) {
	err = c.cut(ctx, func(ctx context.Context) error {
		cl, err = c.Store.Claim(ctx, key, fp)
		return err
	})
	return cl, err
}

func (c cutAfter) Confirm(ctx context.Context, l *idem.Lease, result []byte) error {
	return c.cut(ctx, func(ctx context.Context) error { return c.Store.Confirm(ctx, l, result) })
}

func (c cutAfter) Forget(ctx context.Context, l *idem.Lease) error {
	return c.cut(ctx, func(ctx context.Context) error { return c.Store.Forget(ctx, l) })
}

func TestUnknownOutcomesAccepted(t *testing.T) {
	calls := new(atomic.Int64)
	ops, unknown := 0, 0
	for i := range 50 {
		h := memWorkload(i, 0, func(s idem.Store, _ string) idem.Store { return cutAfter{Store: s, n: 6, calls: calls} }).Run(uint64(i))
		if r := h.Check(); r != porcupine.Ok {
			path, _ := h.Visualize("")
			t.Fatalf("history %d: Check = %v; want Ok (visualization: %s)", i, r, path)
		}
		ops += len(h.Ops)
		unknown += h.Unknown
	}
	t.Logf("MemoryStore with cut calls: %d operations, %d with unknown outcome", ops, unknown)
	if unknown < ops/20 {
		t.Errorf("%d of %d calls had an unknown outcome; want about a sixth", unknown, ops)
	}
}

// TestFailuresReported: an error on a call whose deadline had not run out is
// the store failing, which Verify reports even though the history checks.
func TestFailuresReported(t *testing.T) {
	calls := new(atomic.Int64)
	w := memWorkload(0, 0, func(s idem.Store, _ string) idem.Store { return cutAfter{Store: s, n: 6, calls: calls} })
	h := w.Run(7)
	if len(h.Failures) == 0 || len(h.Failures) > h.Unknown {
		t.Errorf("history with %d unknown outcomes reports %d failures; want some, at most that many", h.Unknown, len(h.Failures))
	}
	if r := h.Check(); r != porcupine.Ok {
		t.Errorf("Check = %v; want Ok", r)
	}
}

// histories bounds the histories each broken store is given to show its
// bug. A bug that shows only under a rare interleaving (a confirm of a lease
// already lost) slipped through 100 histories about one run in fifteen on
// a loaded machine; a history costs well under a millisecond, and caught
// stops at the first violation.
const histories = 2000

// caught runs histories on a broken store until one is found not
// linearizable, and fails t if none of n is.
func caught(t *testing.T, n int, wrap func(s idem.Store, worker string) idem.Store, newStore func() func(worker string) idem.Store) {
	t.Helper()
	for i := range n {
		var w Workload
		if newStore != nil {
			open := newStore()
			w = memWorkload(i, 0, func(_ idem.Store, worker string) idem.Store { return open(worker) })
		} else {
			w = memWorkload(i, 0, wrap)
		}
		h := w.Run(uint64(i))
		if h.Check() == porcupine.Illegal {
			t.Logf("caught in history %d of %d calls", i, len(h.Ops))
			return
		}
	}
	t.Errorf("%d histories on the broken store all checked as linearizable; want a violation", n)
}

// twiceClaimed answers every other InProgress with a lease of its own.
type twiceClaimed struct {
	idem.Store
	worker string
	calls  *atomic.Int64
}

func (s twiceClaimed) Claim(ctx context.Context, key string, fp []byte) (idem.Claim, error) {
	c, err := s.Store.Claim(ctx, key, fp)
	if err == nil && c.Outcome == idem.InProgress && s.calls.Add(1)%2 == 0 {
		return idem.Claim{Outcome: idem.Claimed, Lease: &idem.Lease{Key: key, Token: c.Record.Token + 1, Owner: s.worker, Fingerprint: fp}}, nil
	}
	return c, err
}

// batchTailLost confirms only the first lease of a ConfirmBatch.
type batchTailLost struct{ *idem.MemoryStore }

func (s batchTailLost) ConfirmBatch(ctx context.Context, leases []*idem.Lease, results [][]byte) error {
	return s.Confirm(ctx, leases[0], results[0])
}

// batchClaimsTwice answers a key that occurs twice in a ClaimBatch with the
// same lease twice.
type batchClaimsTwice struct{ *idem.MemoryStore }

func (s batchClaimsTwice) ClaimBatch(ctx context.Context, keys []string, fps [][]byte) ([]idem.Claim, error) {
	cs, err := s.MemoryStore.ClaimBatch(ctx, keys, fps)
	for i := range cs {
		for j := range i {
			if keys[j] == keys[i] && cs[j].Outcome == idem.Claimed {
				cs[i] = cs[j]
			}
		}
	}
	return cs, err
}

// lostConfirm drops every third confirmation, answering nil.
type lostConfirm struct {
	idem.Store
	calls *atomic.Int64
}

func (s lostConfirm) Confirm(ctx context.Context, l *idem.Lease, result []byte) error {
	if s.calls.Add(1)%3 == 0 {
		return nil
	}
	return s.Store.Confirm(ctx, l, result)
}

func TestBrokenStoresCaught(t *testing.T) {
	t.Run("Claimed twice", func(t *testing.T) {
		calls := new(atomic.Int64)
		caught(t, histories, func(s idem.Store, worker string) idem.Store {
			return twiceClaimed{Store: s, worker: worker, calls: calls}
		}, nil)
	})
	t.Run("batch confirms only its first item", func(t *testing.T) {
		caught(t, histories, func(s idem.Store, _ string) idem.Store { return batchTailLost{s.(*idem.MemoryStore)} }, nil)
	})
	t.Run("batch claims a key twice", func(t *testing.T) {
		caught(t, histories, func(s idem.Store, _ string) idem.Store { return batchClaimsTwice{s.(*idem.MemoryStore)} }, nil)
	})
	t.Run("confirmation lost", func(t *testing.T) {
		calls := new(atomic.Int64)
		caught(t, histories, func(s idem.Store, _ string) idem.Store { return lostConfirm{Store: s, calls: calls} }, nil)
	})
	bugs := []struct {
		name string
		bug  bug
	}{
		{"last confirmation wins", lastConfirmWins},
		{"lost lease's confirm not recorded", confirmOnlyHeld},
		{"forget of another's claim", forgetAny},
		{"forget of a confirmation", forgetConfirmed},
		{"renew of another's claim", renewAny},
		{"token reused after a forget", tokenReused},
		{"claim not atomic", racyClaim},
		{"fingerprint dropped from records", dropFingerprint},
		{"lookup misses a claim", lookupMissesClaim},
	}
	for _, b := range bugs {
		t.Run(b.name, func(t *testing.T) {
			caught(t, histories, nil, func() func(string) idem.Store {
				d := &naive{recs: map[string]*naiveRec{}, bug: b.bug}
				return func(worker string) idem.Store { return newNaiveStore(d, worker) }
			})
		})
	}
	// The same store without a bug passes, so the cases above are caught
	// for their bug and nothing else.
	t.Run("no bug", func(t *testing.T) {
		Verify(t, 50, 0, "idem.seed", func(i int) Workload {
			d := &naive{recs: map[string]*naiveRec{}}
			return memWorkload(i, 0, func(_ idem.Store, worker string) idem.Store { return newNaiveStore(d, worker) })
		})
	})
}

// bug names a way naive breaks the contract, now and then.
type bug uint8

const (
	none bug = iota
	lastConfirmWins
	confirmOnlyHeld
	forgetAny
	forgetConfirmed
	renewAny
	tokenReused
	racyClaim
	dropFingerprint
	lookupMissesClaim
)

// naive is a small store that keeps the contract unless told to break it.
type naive struct {
	mu    sync.Mutex
	recs  map[string]*naiveRec
	token int64
	bug   bug
	n     int // calls, to break the contract only now and then
}

type naiveRec struct {
	confirmed   bool
	token       int64
	owner       string
	fingerprint []byte
	result      []byte
}

// naiveStore is one worker's view of a naive store. Its leases are
// granted and checked by an idem.Core, as a Store of one's own would be:
// a lease forgotten, or made by hand, is refused before the records are
// touched.
type naiveStore struct {
	d      *naive
	worker string
	core   *idem.Core
}

func newNaiveStore(d *naive, worker string) naiveStore {
	return naiveStore{d: d, worker: worker, core: must(idem.NewCore("naive store", idem.Options{Worker: worker}))}
}

// now reports whether the bug strikes this time (every other chance).
func (d *naive) now(b bug) bool {
	if d.bug != b {
		return false
	}
	d.n++
	return d.n%2 == 0
}

func (r *naiveRec) record(key string, fp bool) *idem.Record {
	rec := &idem.Record{Key: key, Confirmed: r.confirmed, Token: r.token, Owner: r.owner, Fingerprint: r.fingerprint, Result: r.result}
	if !fp {
		rec.Fingerprint = nil
	}
	return rec
}

func (s naiveStore) Claim(_ context.Context, key string, fp []byte) (idem.Claim, error) {
	d := s.d
	d.mu.Lock()
	r := d.recs[key]
	if r != nil {
		defer d.mu.Unlock()
		o := idem.InProgress
		if r.confirmed {
			o = idem.Duplicate
		}
		c := idem.Claim{Outcome: o, Record: r.record(key, !d.now(dropFingerprint))}
		if len(fp) > 0 && len(r.fingerprint) > 0 && !bytes.Equal(fp, r.fingerprint) {
			return c, idem.ErrFingerprintMismatch
		}
		return c, nil
	}
	if d.now(racyClaim) {
		// Check, then act: another claim can slip in between.
		d.mu.Unlock()
		runtime.Gosched()
		time.Sleep(50 * time.Microsecond)
		d.mu.Lock()
	}
	defer d.mu.Unlock()
	d.token++
	tok := d.token
	if d.now(tokenReused) {
		tok = 1
	}
	d.recs[key] = &naiveRec{token: tok, owner: s.worker, fingerprint: fp}
	return idem.Claim{Outcome: idem.Claimed, Lease: s.core.Lease(key, tok, time.Hour, time.Now().Add(time.Hour), fp)}, nil
}

func (d *naive) holds(l *idem.Lease) bool {
	r := d.recs[l.Key]
	return r != nil && !r.confirmed && r.token == l.Token && r.owner == l.Owner
}

func (s naiveStore) Renew(_ context.Context, l *idem.Lease) error {
	if err := s.core.CheckLease(l); err != nil {
		return err
	}
	d := s.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.holds(l) || (d.recs[l.Key] != nil && !d.recs[l.Key].confirmed && d.now(renewAny)) {
		return nil
	}
	return idem.ErrLeaseLost
}

func (s naiveStore) Confirm(_ context.Context, l *idem.Lease, result []byte) error {
	if err := s.core.CheckLease(l); err != nil {
		return err
	}
	d := s.d
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.recs[l.Key]
	if r != nil && r.confirmed && !d.now(lastConfirmWins) {
		if r.token != l.Token {
			return idem.ErrAlreadyConfirmed
		}
		return nil
	}
	if !d.holds(l) && d.now(confirmOnlyHeld) {
		return nil
	}
	d.recs[l.Key] = &naiveRec{confirmed: true, token: l.Token, fingerprint: l.Fingerprint, result: result}
	return nil
}

func (s naiveStore) Forget(_ context.Context, l *idem.Lease) error {
	if err := s.core.CheckForget(l); err != nil {
		return err
	}
	d := s.d
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.recs[l.Key]
	switch {
	case d.holds(l),
		r != nil && !r.confirmed && d.now(forgetAny),
		r != nil && r.confirmed && r.token == l.Token && d.now(forgetConfirmed):
		delete(d.recs, l.Key)
		return nil
	}
	return idem.ErrLeaseLost
}

func (s naiveStore) Lookup(_ context.Context, key string) (*idem.Record, error) {
	d := s.d
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.recs[key]
	if r == nil || !r.confirmed && d.now(lookupMissesClaim) {
		return nil, idem.ErrNotFound
	}
	return r.record(key, !d.now(dropFingerprint)), nil
}

// memStore is idem.NewMemoryStore for tests, whose options are valid.
func memStore(o idem.Options) *idem.MemoryStore {
	return must(idem.NewMemoryStore(o))
}

// must returns v, or panics with err: for constructors given options a
// test knows are valid.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
