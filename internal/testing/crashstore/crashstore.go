// Package crashstore is the store of a process that a crash test kills:
// the broker adapters' fleet tests run many such processes on one real
// store and kill some mid-work.
package crashstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/idemgo/idem"
)

// ErrCrashed is what every call of a dead Store returns.
var ErrCrashed = errors.New("test: process crashed")

// Lease names a lease whose Confirm met a dead Store: its work was done
// and is not recorded, so a later delivery may do it again.
type Lease struct {
	Key   string
	Token int64
}

// Store is a process's view of a store: once Dead is set, every call fails
// with ErrCrashed, as if the process had died, so that its lease is
// neither renewed nor forgotten nor confirmed. A Confirm it fails is
// stored in Unconfirmed (Lease → struct{}), once per lease.
type Store struct {
	idem.Store
	Dead        atomic.Bool
	Unconfirmed *sync.Map
}

// Claim fails with ErrCrashed once the process is dead.
func (c *Store) Claim(ctx context.Context, k string, fp []byte) (idem.Claim, error) {
	if c.Dead.Load() {
		return idem.Claim{}, ErrCrashed
	}
	return c.Store.Claim(ctx, k, fp)
}

// Renew fails with ErrCrashed once the process is dead.
func (c *Store) Renew(ctx context.Context, l *idem.Lease) error {
	if c.Dead.Load() {
		return ErrCrashed
	}
	return c.Store.Renew(ctx, l)
}

// Confirm fails with ErrCrashed once the process is dead, noting the lease
// in Unconfirmed.
func (c *Store) Confirm(ctx context.Context, l *idem.Lease, r []byte) error {
	if c.Dead.Load() {
		c.Unconfirmed.Store(Lease{l.Key, l.Token}, struct{}{})
		return ErrCrashed
	}
	return c.Store.Confirm(ctx, l, r)
}

// Forget fails with ErrCrashed once the process is dead.
func (c *Store) Forget(ctx context.Context, l *idem.Lease) error {
	if c.Dead.Load() {
		return ErrCrashed
	}
	return c.Store.Forget(ctx, l)
}

// Checkpoint fails with ErrCrashed once the process is dead; before, it
// is the store's (an error when it is not an idem.Checkpointer).
func (c *Store) Checkpoint(ctx context.Context, l *idem.Lease, data []byte) error {
	if c.Dead.Load() {
		return ErrCrashed
	}
	cp, ok := c.Store.(idem.Checkpointer)
	if !ok {
		return errors.New("crashstore: the store records no checkpoints")
	}
	return cp.Checkpoint(ctx, l, data)
}

// BatchStore is a Store that is an idem.Batcher too, dying the same way.
// Its Store.Store must be an idem.Batcher.
type BatchStore struct{ Store }

// ClaimBatch fails with ErrCrashed once the process is dead.
func (c *BatchStore) ClaimBatch(ctx context.Context, keys []string, fps [][]byte) ([]idem.Claim, error) {
	if c.Dead.Load() {
		return nil, ErrCrashed
	}
	return c.Store.Store.(idem.Batcher).ClaimBatch(ctx, keys, fps)
}

// ConfirmBatch fails with ErrCrashed once the process is dead, noting
// the leases in Unconfirmed.
func (c *BatchStore) ConfirmBatch(ctx context.Context, ls []*idem.Lease, rs [][]byte) error {
	if c.Dead.Load() {
		for _, l := range ls {
			c.Unconfirmed.Store(Lease{l.Key, l.Token}, struct{}{})
		}
		return ErrCrashed
	}
	return c.Store.Store.(idem.Batcher).ConfirmBatch(ctx, ls, rs)
}
