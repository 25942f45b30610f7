package idem

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
)

// MaxFingerprintBytes bounds a fingerprint: it is meant to be a hash of the
// request, not the request.
const MaxFingerprintBytes = 1024

// Options are the settings every store shares; each store's own options
// (RedisOptions, the SQL store's) repeat these fields in one flat literal.
// The zero value is valid: every zero field means its documented default.
type Options struct {
	// Retention is how long a confirmed key is remembered. At least
	// LeaseTTL. Default 24h.
	Retention time.Duration
	// LeaseTTL is how long a claim binds unless renewed. At least 1ms.
	// Default 30s.
	LeaseTTL time.Duration
	// Worker names this store's leases (Lease.Owner); no two stores may
	// share one. At most 255 bytes, no NUL. Default: a random UUID.
	Worker string
	// MaxKeyBytes bounds keys. Default 1024.
	MaxKeyBytes int
	// MaxResultBytes bounds Confirm's result. Default 1 MiB.
	MaxResultBytes int
	// Logger receives what an operator must see (a late confirm, a lost
	// lease, a store failure at most once a second, a damaged record, and
	// on Redis what first contact found unsafe but allowed). Default: none.
	Logger *slog.Logger
	// Observer is called once per operation. Default: none.
	Observer Observer
	// KeyHasher hashes keys for errors, the Logger and the Observer.
	// Default: a random secret per process.
	KeyHasher *KeyHasher
	// RevealKeys makes errors and log lines name keys as they are (quoted)
	// instead of by their hash, for debugging. Keys may carry personal
	// data: leave it off in production. Default false.
	RevealKeys bool

	// failures limits the Logger's store-failure lines; shared by the
	// copies of these options a store makes.
	failures *logLimit
	// home names the records' home of the store these options were
	// resolved for (see grant); set by each constructor.
	home string
}

// Defaults of Options.
const (
	DefaultRetention      = 24 * time.Hour
	DefaultLeaseTTL       = 30 * time.Second
	DefaultMaxKeyBytes    = 1024
	DefaultMaxResultBytes = 1 << 20
)

// errZeroStore is what every operation of a store's zero value answers: its
// options were never resolved, so no check or default can be trusted.
var errZeroStore = errors.New("idem: a zero-value store: make it with NewRedisStore, NewMemoryStore or sqlstore.New")

// withDefaults validates o and fills in its defaults. Each error names the
// one field at fault.
func (o Options) withDefaults() (Options, error) {
	if o.Retention < 0 {
		return o, fmt.Errorf("idem: negative Retention %v", o.Retention)
	}
	if o.LeaseTTL < 0 {
		return o, fmt.Errorf("idem: negative LeaseTTL %v", o.LeaseTTL)
	}
	if o.MaxKeyBytes < 0 {
		return o, fmt.Errorf("idem: negative MaxKeyBytes %d", o.MaxKeyBytes)
	}
	if o.MaxResultBytes < 0 {
		return o, fmt.Errorf("idem: negative MaxResultBytes %d", o.MaxResultBytes)
	}
	// Stores keep time in milliseconds (Redis PX): a sub-millisecond
	// duration would round to nothing and expire at once.
	if o.Retention > 0 && o.Retention < time.Millisecond {
		return o, fmt.Errorf("idem: Retention %v is under 1ms", o.Retention)
	}
	if o.LeaseTTL > 0 && o.LeaseTTL < time.Millisecond {
		return o, fmt.Errorf("idem: LeaseTTL %v is under 1ms", o.LeaseTTL)
	}
	setRetention := o.Retention != 0
	o.Retention = cmp.Or(o.Retention, DefaultRetention)
	o.LeaseTTL = cmp.Or(o.LeaseTTL, DefaultLeaseTTL)
	// A confirmation forgotten before a claim would have expired lets a
	// duplicate in while its original could still be running.
	if o.Retention < o.LeaseTTL {
		if setRetention {
			return o, fmt.Errorf("idem: Retention %v is shorter than LeaseTTL %v", o.Retention, o.LeaseTTL)
		}
		return o, fmt.Errorf("idem: LeaseTTL %v is longer than the default Retention %v; set Retention too",
			o.LeaseTTL, o.Retention)
	}
	if o.Worker == "" {
		o.Worker = uuid.NewString()
	}
	if strings.ContainsRune(o.Worker, 0) || len(o.Worker) > 255 {
		return o, fmt.Errorf("idem: Worker %q must be at most 255 bytes without NUL", o.Worker)
	}
	o.MaxKeyBytes = cmp.Or(o.MaxKeyBytes, DefaultMaxKeyBytes)
	o.MaxResultBytes = cmp.Or(o.MaxResultBytes, DefaultMaxResultBytes)
	if o.Logger != nil && o.failures == nil {
		o.failures = &logLimit{}
	}
	return o, nil
}

// ms converts a duration to whole milliseconds, rounding up so that a store
// never grants less than asked.
func ms(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// checkLease validates a lease given back to a store, before any I/O: one
// that no Claim returned, or that another store granted, would record work
// nobody claimed here; one its holder forgot is lost (the caller said the
// work did not happen).
func (o *Options) checkLease(l *Lease) error {
	if err := o.checkGrant(l); err != nil {
		return err
	}
	if l.grant.forgotten.Load() {
		return fmt.Errorf("%w: %s token %d was forgotten by its holder", ErrLeaseLost, o.keyName(l.Key), l.Token)
	}
	return nil
}

// checkForget validates the lease given to Forget and marks it forgotten,
// before any I/O: whatever the store answers, the caller has said that the
// work did not happen. Forget itself may be repeated (after a transient
// failure), so a forgotten lease is not refused here.
func (o *Options) checkForget(l *Lease) error {
	if err := o.checkGrant(l); err != nil {
		return err
	}
	l.grant.forgotten.Store(true)
	return nil
}

// checkGrant refuses a lease that this store's home did not grant.
func (o *Options) checkGrant(l *Lease) error {
	if o.MaxKeyBytes == 0 {
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
	case l.grant.store != o.home:
		return fmt.Errorf("%w: granted by %s, given to %s", ErrInvalidLease, l.grant.store, o.home)
	}
	return o.checkKey(l.Key)
}

// checkFingerprint is Claim's answer when c found a record made with a
// different fingerprint: an error wrapping ErrFingerprintMismatch, returned
// together with c. An empty fingerprint on either side is not compared.
func (o *Options) checkFingerprint(c Claim, key string, fingerprint []byte) error {
	if c.Record == nil || len(fingerprint) == 0 || len(c.Record.Fingerprint) == 0 ||
		bytes.Equal(fingerprint, c.Record.Fingerprint) {
		return nil
	}
	found := "confirmed"
	if c.Outcome == InProgress {
		found = "claimed"
	}
	return fmt.Errorf("%w: claim of %s found it %s with another fingerprint",
		ErrFingerprintMismatch, o.keyName(key), found)
}

// notKept is Confirm's answer when another lease's confirmation was kept.
func (o *Options) notKept(l *Lease) error {
	return fmt.Errorf("%w: confirm of %s token %d", ErrAlreadyConfirmed, o.keyName(l.Key), l.Token)
}

// checkResult validates a result given to Confirm, before any I/O.
func (o *Options) checkResult(l *Lease, result []byte) error {
	if err := o.checkLease(l); err != nil {
		return err
	}
	if len(result) > o.MaxResultBytes {
		return fmt.Errorf("%w: result of %d bytes for %s exceeds MaxResultBytes %d",
			ErrTooLarge, len(result), o.keyName(l.Key), o.MaxResultBytes)
	}
	return nil
}

// checkClaim validates Claim's input, before any I/O.
func (o *Options) checkClaim(key string, fingerprint []byte) error {
	if err := o.checkKey(key); err != nil {
		return err
	}
	if len(fingerprint) > MaxFingerprintBytes {
		return fmt.Errorf("%w: fingerprint of %d bytes exceeds %d", ErrTooLarge, len(fingerprint), MaxFingerprintBytes)
	}
	return nil
}

// at returns s[i], or nil when s is nil (the batch calls allow nil for "none").
func at(s [][]byte, i int) []byte {
	if s == nil {
		return nil
	}
	return s[i]
}

func (o *Options) checkClaimBatch(keys []string, fingerprints [][]byte) error {
	if fingerprints != nil && len(fingerprints) != len(keys) {
		return fmt.Errorf("idem: ClaimBatch with %d keys and %d fingerprints", len(keys), len(fingerprints))
	}
	for i, k := range keys {
		if err := o.checkClaim(k, at(fingerprints, i)); err != nil {
			return fmt.Errorf("batch item %d: %w", i, err)
		}
	}
	return nil
}

func (o *Options) checkConfirmBatch(leases []*Lease, results [][]byte) error {
	if results != nil && len(results) != len(leases) {
		return fmt.Errorf("idem: ConfirmBatch with %d leases and %d results", len(leases), len(results))
	}
	for i, l := range leases {
		if err := o.checkResult(l, at(results, i)); err != nil {
			return fmt.Errorf("batch item %d: %w", i, err)
		}
	}
	return nil
}

// logLate logs a confirmation recorded after its lease was lost: the work
// may have run twice, which an operator wants to know.
func (o *Options) logLate(ctx context.Context, l *Lease) {
	if o.Logger == nil {
		return
	}
	o.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: late confirm: the lease was lost before the work was confirmed",
		o.keyAttr(l.Key), slog.Int64("token", l.Token), slog.String("owner", l.Owner))
}

// keyAttr names key in a log line: by its hash, or with RevealKeys as it is.
func (o *Options) keyAttr(key string) slog.Attr {
	if o.RevealKeys {
		return slog.String("key", key)
	}
	return slog.String("key_hash", o.KeyHasher.Hash(key))
}

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
// constructor does: an error names the one field at fault. home names
// where the store keeps its records (its kind and table, say
// `sqlstore table "idem_keys"`): a Core accepts only leases granted by a
// Core of the same home (Lease), and refuses others with ErrInvalidLease.
func NewCore(home string, o Options) (*Core, error) {
	if home == "" {
		return nil, errors.New("idem: NewCore: home is empty; name the store's kind and place")
	}
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	o.home = home
	return &Core{o: o}, nil
}

// Lease returns a new lease granted by this Core's home: Claim's lease.
// fingerprint is kept as given (not copied).
func (c *Core) Lease(key string, token int64, ttl time.Duration, expires time.Time, fingerprint []byte) *Lease {
	return newLease(c.o.home, key, token, c.o.Worker, ttl, expires, fingerprint)
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

// CheckLease returns ErrInvalidLease for a lease that no Claim of this
// Core's home returned, ErrLeaseLost for one its holder forgot, and checks
// its key: Renew's and Confirm's check.
func (c *Core) CheckLease(l *Lease) error { return c.o.checkLease(l) }

// CheckForget is Forget's check: ErrInvalidLease as CheckLease, and it
// marks l forgotten (later Renew and Confirm of l are ErrLeaseLost)
// whatever the store then answers.
func (c *Core) CheckForget(l *Lease) error { return c.o.checkForget(l) }

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
