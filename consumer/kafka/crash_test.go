package kafka_test

// The store of a process that a crash test kills: the fleet tests run many
// such processes on one real store and kill some mid-work. (A copy of the
// root module's test rig: a module imports nothing from another module's
// internal/.)

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/idemgo/idem"
)

// errCrashed is what every call of a dead Store returns.
var errCrashed = errors.New("test: process crashed")

// crashLease names a lease whose Confirm met a dead Store: its work was done
// and is not recorded, so a later delivery may do it again.
type crashLease struct {
	Key   string
	Token int64
}

// crashStore is a process's view of a store: once Dead is set, every call fails
// with errCrashed, as if the process had died, so that its lease is
// neither renewed nor forgotten nor confirmed. A Confirm it fails is
// stored in Unconfirmed (crashLease → struct{}), once per lease.
type crashStore struct {
	idem.Store
	Dead        atomic.Bool
	Unconfirmed *sync.Map
}

// Claim fails with errCrashed once the process is dead.
func (c *crashStore) Claim(ctx context.Context, k string, fp []byte) (idem.Claim, error) {
	if c.Dead.Load() {
		return idem.Claim{}, errCrashed
	}
	return c.Store.Claim(ctx, k, fp)
}

// Renew fails with errCrashed once the process is dead.
func (c *crashStore) Renew(ctx context.Context, l *idem.Lease) error {
	if c.Dead.Load() {
		return errCrashed
	}
	return c.Store.Renew(ctx, l)
}

// Confirm fails with errCrashed once the process is dead, noting the lease
// in Unconfirmed.
func (c *crashStore) Confirm(ctx context.Context, l *idem.Lease, r []byte) error {
	if c.Dead.Load() {
		c.Unconfirmed.Store(crashLease{l.Key, l.Token}, struct{}{})
		return errCrashed
	}
	return c.Store.Confirm(ctx, l, r)
}

// Forget fails with errCrashed once the process is dead.
func (c *crashStore) Forget(ctx context.Context, l *idem.Lease) error {
	if c.Dead.Load() {
		return errCrashed
	}
	return c.Store.Forget(ctx, l)
}

// crashBatchStore is a Store that is an idem.Batcher too, dying the same way.
// Its Store must be an idem.Batcher.
type crashBatchStore struct{ crashStore }

// ClaimBatch fails with errCrashed once the process is dead.
func (c *crashBatchStore) ClaimBatch(ctx context.Context, keys []string, fps [][]byte) ([]idem.Claim, error) {
	if c.Dead.Load() {
		return nil, errCrashed
	}
	return c.crashStore.Store.(idem.Batcher).ClaimBatch(ctx, keys, fps)
}

// ConfirmBatch fails with errCrashed once the process is dead, noting
// the leases in Unconfirmed.
func (c *crashBatchStore) ConfirmBatch(ctx context.Context, ls []*idem.Lease, rs [][]byte) error {
	if c.Dead.Load() {
		for _, l := range ls {
			c.Unconfirmed.Store(crashLease{l.Key, l.Token}, struct{}{})
		}
		return errCrashed
	}
	return c.crashStore.Store.(idem.Batcher).ConfirmBatch(ctx, ls, rs)
}
