package idem

import (
	"context"
	"time"
)

// Core is the part of a Store that every implementation shares: options
// resolved to their defaults, input checked before any I/O with the
// contract's errors, the contract's answers built, and each operation
// observed and logged. The stores of this package share its code, the SQL
// store (package sqlstore) is built on it, and so can a Store of your own
// be, answering as they do.
//
// A Core is immutable and safe for concurrent use.
type Core struct {
	o Options
}

// NewCore validates o and resolves its defaults, as every store's
// constructor does: an error names the one field at fault.
func NewCore(o Options) (*Core, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Core{o: o}, nil
}

// Options returns the resolved options: every default filled in, Worker
// set.
func (c *Core) Options() Options { return c.o }

// CheckKey returns ErrInvalidKey for an empty key or one over MaxKeyBytes.
func (c *Core) CheckKey(key string) error { return c.o.checkKey(key) }

// CheckClaim checks Claim's key and fingerprint (ErrInvalidKey,
// ErrTooLarge).
func (c *Core) CheckClaim(key string, fingerprint []byte) error {
	return c.o.checkClaim(key, fingerprint)
}

// CheckLease returns ErrInvalidLease for a lease no Claim returned, and
// checks its key.
func (c *Core) CheckLease(l *Lease) error { return c.o.checkLease(l) }

// CheckResult checks Confirm's lease and result (ErrTooLarge over
// MaxResultBytes).
func (c *Core) CheckResult(l *Lease, result []byte) error { return c.o.checkResult(l, result) }

// CheckClaimBatch checks ClaimBatch's input as CheckClaim does each item,
// and that fingerprints (when not nil) has one entry per key.
func (c *Core) CheckClaimBatch(keys []string, fingerprints [][]byte) error {
	return c.o.checkClaimBatch(keys, fingerprints)
}

// CheckConfirmBatch checks ConfirmBatch's input as CheckResult does each
// item, and that results (when not nil) has one entry per lease.
func (c *Core) CheckConfirmBatch(leases []*Lease, results [][]byte) error {
	return c.o.checkConfirmBatch(leases, results)
}

// Mismatch returns the error Claim returns with cl when the record found
// was made with another fingerprint (ErrFingerprintMismatch), or nil.
func (c *Core) Mismatch(cl Claim, key string, fingerprint []byte) error {
	return c.o.checkFingerprint(cl, key, fingerprint)
}

// NotKept returns the error Confirm returns when another lease's
// confirmation of l's key was kept (ErrAlreadyConfirmed).
func (c *Core) NotKept(l *Lease) error { return c.o.notKept(l) }

// KeyName names key in an error message: by its keyed hash, or with
// RevealKeys as it is.
func (c *Core) KeyName(key string) string { return c.o.keyName(key) }

// LogLate logs a confirmation recorded after l was lost.
func (c *Core) LogLate(ctx context.Context, l *Lease) { c.o.logLate(ctx, l) }

// Observe reports one operation on key (empty for a batch) that began at
// start: to the Observer, and to the Logger when it needs a human. It costs
// nothing without either.
func (c *Core) Observe(ctx context.Context, e Event, key string, start time.Time) {
	c.o.observe(ctx, e, key, start)
}
