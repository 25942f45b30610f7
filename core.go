package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/idemgo/idem/internal/batch"
)

// Core is what every Store shares, and the one path the stores of this
// module take through it: options resolved to their defaults, input checked
// before any I/O, leases granted and recognised, the contract's answers
// built with the key named safely, and each operation observed and logged.
// RedisStore, MemoryStore and the SQL store (package sqlstore) are built on
// it, and so can a Store of your own be, answering as they do: run
// storetest.Run on it to confirm.
//
// A Core is immutable and safe for concurrent use.
type Core struct {
	o Options
	// home names where the store keeps its records (kind and place, say
	// its prefix or table): a lease is accepted by a store of the home
	// that granted it only (see grant).
	home string
	// failures limits the Logger's store-failure lines; shared by copies.
	failures *logLimit
}

// NewCore validates o and resolves its defaults, as every store's
// constructor does: an error names the one field at fault. home names
// where the store keeps its records (its kind and place, say
// `sqlstore table "idem_keys"`): a Core accepts only leases granted by a
// Core of the same home (Lease), and refuses others with ErrInvalidLease.
func NewCore(home string, o Options) (*Core, error) {
	if home == "" {
		return nil, errors.New("idem: NewCore: home is empty; name the store's kind and place")
	}
	c, err := newCore(home, o)
	if err != nil {
		return nil, err
	}
	return &c, nil
}

// newCore is NewCore for the stores of this package, which hold their Core
// by value.
func newCore(home string, o Options) (Core, error) {
	o, err := o.withDefaults()
	if err != nil {
		return Core{}, err
	}
	// The stores keep time in whole milliseconds (Redis PX, SQL
	// intervals): rounded up here, so that none grants less than asked
	// and every store reads the same figures.
	o.LeaseTTL, o.Retention = roundMs(o.LeaseTTL), roundMs(o.Retention)
	c := Core{o: o, home: home}
	if o.Logger != nil {
		c.failures = &logLimit{}
	}
	return c, nil
}

// Options returns the resolved options: every default filled in, Worker
// set, LeaseTTL and Retention rounded up to whole milliseconds.
func (c *Core) Options() Options { return c.o }

// Lease returns a new lease granted by this Core's home: Claim's lease.
// fingerprint is kept as given (not copied).
func (c *Core) Lease(key string, token int64, ttl time.Duration, expires time.Time, fingerprint []byte) *Lease {
	return newLease(c.home, key, token, c.o.Worker, ttl, expires, fingerprint)
}

// CheckKey returns ErrInvalidKey for an empty key or one over MaxKeyBytes:
// Lookup's check. Keys are byte strings otherwise: NUL bytes and invalid
// UTF-8 included, compared byte for byte.
func (c *Core) CheckKey(key string) error {
	if c.o.MaxKeyBytes == 0 {
		// Only a store that no constructor made has unresolved options.
		return errZeroStore
	}
	if key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	if len(key) > c.o.MaxKeyBytes {
		return fmt.Errorf("%w: key of %d bytes exceeds MaxKeyBytes %d", ErrInvalidKey, len(key), c.o.MaxKeyBytes)
	}
	return nil
}

// CheckClaim checks Claim's key (as CheckKey) and fingerprint (ErrTooLarge
// over MaxFingerprintBytes).
func (c *Core) CheckClaim(key string, fingerprint []byte) error {
	if err := c.CheckKey(key); err != nil {
		return err
	}
	if len(fingerprint) > MaxFingerprintBytes {
		return fmt.Errorf("%w: fingerprint of %d bytes exceeds %d", ErrTooLarge, len(fingerprint), MaxFingerprintBytes)
	}
	return nil
}

// CheckLease is Renew's check of the lease given back to a store:
// ErrInvalidLease for one that no Claim of this Core's home returned (it
// would record work nobody claimed here), ErrLeaseLost for one its holder
// forgot (the caller said the work did not happen), and its key as
// CheckKey.
func (c *Core) CheckLease(l *Lease) error {
	if err := c.checkGrant(l); err != nil {
		return err
	}
	if l.grant.forgotten.Load() {
		return fmt.Errorf("%w: %s token %d was forgotten by its holder", ErrLeaseLost, c.KeyName(l.Key), l.Token)
	}
	return nil
}

// CheckForget is Forget's check: ErrInvalidLease as CheckLease, and it
// marks l forgotten (later Renew and Confirm of l are ErrLeaseLost)
// whatever the store then answers. Forget itself may be repeated (after a
// transient failure), so a forgotten lease is not refused here.
func (c *Core) CheckForget(l *Lease) error {
	if err := c.checkGrant(l); err != nil {
		return err
	}
	l.grant.forgotten.Store(true)
	return nil
}

// checkGrant refuses a lease that this store's home did not grant.
func (c *Core) checkGrant(l *Lease) error {
	if c.o.MaxKeyBytes == 0 {
		// Before the lease's checks: a zero store has no home, and would
		// blame the lease for its own want of a constructor.
		return errZeroStore
	}
	switch {
	case l == nil:
		return fmt.Errorf("%w: nil *Lease", ErrInvalidLease)
	case l.Token <= 0:
		return fmt.Errorf("%w: Token %d (a Lease comes from Claim)", ErrInvalidLease, l.Token)
	case l.Owner == "":
		return fmt.Errorf("%w: empty Owner (a Lease comes from Claim)", ErrInvalidLease)
	case l.grant == nil:
		return fmt.Errorf("%w: a Lease made by hand; a Lease comes from Claim", ErrInvalidLease)
	case l.grant.store != c.home:
		return fmt.Errorf("%w: granted by %s, given to %s", ErrInvalidLease, l.grant.store, c.home)
	}
	return c.CheckKey(l.Key)
}

// CheckResult is Confirm's check: the lease as CheckLease, and the result
// (ErrTooLarge over MaxResultBytes).
func (c *Core) CheckResult(l *Lease, result []byte) error {
	if err := c.CheckLease(l); err != nil {
		return err
	}
	if len(result) > c.o.MaxResultBytes {
		return fmt.Errorf("%w: result of %d bytes for %s exceeds MaxResultBytes %d",
			ErrTooLarge, len(result), c.KeyName(l.Key), c.o.MaxResultBytes)
	}
	return nil
}

// CheckClaimBatch checks ClaimBatch's input as CheckClaim does each item,
// and that fingerprints (when not nil) has one entry per key.
func (c *Core) CheckClaimBatch(keys []string, fingerprints [][]byte) error {
	if fingerprints != nil && len(fingerprints) != len(keys) {
		return fmt.Errorf("idem: ClaimBatch with %d keys and %d fingerprints", len(keys), len(fingerprints))
	}
	for i, k := range keys {
		if err := c.CheckClaim(k, batch.Item(fingerprints, i)); err != nil {
			return fmt.Errorf("batch item %d: %w", i, err)
		}
	}
	return nil
}

// CheckConfirmBatch checks ConfirmBatch's input as CheckResult does each
// item, and that results (when not nil) has one entry per lease.
func (c *Core) CheckConfirmBatch(leases []*Lease, results [][]byte) error {
	if results != nil && len(results) != len(leases) {
		return fmt.Errorf("idem: ConfirmBatch with %d leases and %d results", len(leases), len(results))
	}
	for i, l := range leases {
		if err := c.CheckResult(l, batch.Item(results, i)); err != nil {
			return fmt.Errorf("batch item %d: %w", i, err)
		}
	}
	return nil
}

// FingerprintMismatch is the error Claim returns together with cl when the
// record cl found was made with a different fingerprint (wrapping
// ErrFingerprintMismatch), or nil when the fingerprints agree. An empty
// fingerprint on either side is not compared.
func (c *Core) FingerprintMismatch(cl Claim, key string, fingerprint []byte) error {
	if cl.Record == nil || len(fingerprint) == 0 || len(cl.Record.Fingerprint) == 0 ||
		bytes.Equal(fingerprint, cl.Record.Fingerprint) {
		return nil
	}
	found := "confirmed"
	if cl.Outcome == InProgress {
		found = "claimed"
	}
	return fmt.Errorf("%w: claim of %s found it %s with another fingerprint",
		ErrFingerprintMismatch, c.KeyName(key), found)
}

// AlreadyConfirmed is the error Confirm returns when another lease's
// confirmation of l's key was kept (wrapping ErrAlreadyConfirmed).
func (c *Core) AlreadyConfirmed(l *Lease) error {
	return fmt.Errorf("%w: confirm of %s token %d", ErrAlreadyConfirmed, c.KeyName(l.Key), l.Token)
}

// LeaseLost is the error op ("renew", "forget", ...) returns when the store
// holds nothing of l's (wrapping ErrLeaseLost).
func (c *Core) LeaseLost(op string, l *Lease) error {
	return fmt.Errorf("%w: %s of %s token %d", ErrLeaseLost, op, c.KeyName(l.Key), l.Token)
}

// NotFound is the error Lookup returns when key has no live record
// (wrapping ErrNotFound).
func (c *Core) NotFound(key string) error {
	return fmt.Errorf("%w: %s", ErrNotFound, c.KeyName(key))
}

// KeyName names key in an error message by its keyed hash ("key#…"):
// errors end up in logs, and keys may carry personal data. With RevealKeys
// it is the key itself, quoted.
func (c *Core) KeyName(key string) string {
	if c.o.RevealKeys {
		return "key " + strconv.Quote(key)
	}
	return "key#" + c.o.KeyHasher.Hash(key)
}

// keyAttr names key in a log line: by its hash, or with RevealKeys as it is.
func (c *Core) keyAttr(key string) slog.Attr {
	if c.o.RevealKeys {
		return slog.String("key", key)
	}
	return slog.String("key_hash", c.o.KeyHasher.Hash(key))
}

// LogLate logs a confirmation recorded after l was lost: the work may have
// run twice, which an operator wants to know.
func (c *Core) LogLate(ctx context.Context, l *Lease) {
	if c.o.Logger == nil {
		return
	}
	c.o.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: late confirm: the lease was lost before the work was confirmed",
		c.keyAttr(l.Key), slog.Int64("token", l.Token), slog.String("owner", l.Owner))
}

// roundMs rounds d up to whole milliseconds.
func roundMs(d time.Duration) time.Duration {
	return (d + time.Millisecond - 1) / time.Millisecond * time.Millisecond
}
