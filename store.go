package idem

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Outcome is what a Claim found.
type Outcome uint8

const (
	// Claimed means this caller holds the lease and must do the work, then
	// Confirm (done) or Forget (failed) it.
	Claimed Outcome = iota + 1
	// Duplicate means the work is confirmed done and still within retention:
	// the caller must not do it again. Claim.Record holds the confirmation.
	Duplicate
	// InProgress means another caller (possibly on this same worker) holds a
	// live lease. Claim.Record describes the holder; retry after it expires.
	InProgress
)

// String returns the outcome's name in snake case ("claimed",
// "duplicate", "in_progress"), as Op and ErrorClass name theirs, for logs
// and metric labels.
func (o Outcome) String() string {
	switch o {
	case Claimed:
		return "claimed"
	case Duplicate:
		return "duplicate"
	case InProgress:
		return "in_progress"
	}
	return "outcome(" + strconv.Itoa(int(o)) + ")"
}

// Record is what a store holds for a key: a live claim or a confirmation.
type Record struct {
	Key         string
	Confirmed   bool      // false: a live claim
	Token       int64     // fencing token of the lease that claimed (or confirmed) it
	Owner       string    // Worker holding a live claim; empty once confirmed
	Fingerprint []byte    // as given to Claim
	Result      []byte    // as given to Confirm; nil while claimed
	Expires     time.Time // lease end while claimed, retention end once confirmed (local estimate)
}

// Claim is the answer to Store.Claim.
type Claim struct {
	Outcome Outcome
	Lease   *Lease  // set when Claimed
	Record  *Record // set when Duplicate (the confirmation) or InProgress (the holder)
	// TakeOver is set when Claimed replaced a claim whose lease had run out
	// unconfirmed: an earlier attempt crashed or stalled and may have done
	// part of the work. MemoryStore and the SQL store (package sqlstore)
	// report it; on RedisStore an expired claim vanishes with its TTL, so
	// TakeOver is always false there.
	TakeOver bool
}

// Store records which keys are being worked on and which are done.
//
// Every method is safe for concurrent use by many goroutines and, for the
// shared stores (Redis, SQL), by many processes. Expiry is judged by the
// store's clock, never the caller's. Methods validate their input before any
// I/O: a bad key is ErrInvalidKey, an oversized result ErrTooLarge.
type Store interface {
	// Claim atomically claims key under a new lease (Claimed), or reports a
	// live confirmation (Duplicate) or a live claim by anyone, this worker
	// included (InProgress). A claim whose lease ran out is taken over in the
	// same atomic step. fingerprint identifies the request's content (a
	// hash); it is stored with the claim and returned in Claim.Record.
	//
	// When the record found (confirmed or live) was made with a different
	// fingerprint, and neither is empty, Claim returns an error wrapping
	// ErrFingerprintMismatch together with the Claim (Duplicate or
	// InProgress, with its Record): the one case where a result comes with
	// an error, so that a caller can tell a request reusing a key that is
	// done from one reusing a key in flight. A caller that replays
	// Duplicate's Result therefore never answers one request with
	// another's result.
	Claim(ctx context.Context, key string, fingerprint []byte) (Claim, error)
	// Renew extends a live lease by the store's LeaseTTL from now. It returns
	// ErrLeaseLost when the lease expired, was forgotten, confirmed or taken
	// over. Renew does not modify *l.
	Renew(ctx context.Context, l *Lease) error
	// Confirm records the work of l as done, remembered for the retention
	// window, with result. It records even when the lease was lost (the work
	// happened). If the key is already confirmed by another lease, the first
	// confirmation stays (duplicates may have been answered with it) and
	// Confirm returns an error wrapping ErrAlreadyConfirmed: the work was
	// done, but twice, and result is not the one kept. A repeated Confirm of
	// the same lease changes nothing and returns nil.
	Confirm(ctx context.Context, l *Lease, result []byte) error
	// Forget deletes l's own live claim so that the key can be claimed again
	// at once (the work failed). It never deletes a confirmation or another
	// holder's claim; when there was nothing of l's to delete it returns
	// ErrLeaseLost.
	Forget(ctx context.Context, l *Lease) error
	// Lookup returns the key's live record, or ErrNotFound.
	Lookup(ctx context.Context, key string) (*Record, error)
}

// Batcher is implemented by stores that can claim and confirm many keys in
// one round trip. RedisStore, MemoryStore and the SQL store implement it.
type Batcher interface {
	// ClaimBatch claims every key as Claim would, fingerprints[i] going with
	// keys[i] (fingerprints may be nil: no fingerprints). Invalid input fails
	// the whole batch before any I/O. When some items fail, the claims of the
	// others are still returned (a failed item has a zero Claim, except a
	// fingerprint mismatch, which keeps its Claim as Claim does) along with
	// a *BatchError that says which failed.
	ClaimBatch(ctx context.Context, keys []string, fingerprints [][]byte) ([]Claim, error)
	// ConfirmBatch confirms every lease as Confirm would, results[i] going
	// with leases[i] (results may be nil: empty results). Partial failure,
	// ErrAlreadyConfirmed included, is a *BatchError.
	ConfirmBatch(ctx context.Context, leases []*Lease, results [][]byte) error
}

// BatchError reports which items of a batch call failed. The items that are
// not named in it succeeded.
type BatchError struct {
	// Errs has one entry per item of the batch: nil for an item that
	// succeeded, its error otherwise.
	Errs []error
}

// Error summarizes the failures: how many, and the first.
func (e *BatchError) Error() string {
	n, first := 0, error(nil)
	for _, err := range e.Errs {
		if err != nil {
			if first == nil {
				first = err
			}
			n++
		}
	}
	return fmt.Sprintf("idem: %d of %d batch items failed; first: %v", n, len(e.Errs), first)
}

// Unwrap returns the items' errors, so errors.Is sees through the batch.
func (e *BatchError) Unwrap() []error {
	var errs []error
	for _, err := range e.Errs {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// collect records item i's error in errs, allocating errs (n long) on the
// first error, so that a batch without failures allocates nothing for them.
func collect(errs []error, n, i int, err error) []error {
	if err == nil {
		return errs
	}
	if errs == nil {
		errs = make([]error, n)
	}
	errs[i] = err
	return errs
}

// The errors a Store returns, matched with errors.Is. Returned errors wrap
// them with the key.
var (
	// ErrLeaseLost: the lease expired, was forgotten, confirmed or taken over.
	ErrLeaseLost = errors.New("idem: lease lost")
	// ErrNotFound: no live record for the key.
	ErrNotFound = errors.New("idem: not found")
	// ErrInvalidKey: the key is empty or longer than MaxKeyBytes.
	ErrInvalidKey = errors.New("idem: invalid key")
	// ErrTooLarge: a result over MaxResultBytes, or a fingerprint over
	// MaxFingerprintBytes.
	ErrTooLarge = errors.New("idem: too large")
	// ErrInProgress: another caller holds the key (returned by wrappers).
	ErrInProgress = errors.New("idem: in progress")
	// ErrFingerprintMismatch: Claim found the key claimed or confirmed with
	// another fingerprint: a different request reusing the key.
	ErrFingerprintMismatch = errors.New("idem: fingerprint mismatch")
	// ErrAlreadyConfirmed: Confirm found the key confirmed by another lease.
	// The first confirmation stays; the work was done more than once.
	ErrAlreadyConfirmed = errors.New("idem: already confirmed by another lease")
	// ErrInvalidLease: a Lease given back to a store that no Claim returned
	// (nil, or a zero Token or Owner), refused before any I/O.
	ErrInvalidLease = errors.New("idem: invalid lease")
	// ErrDamaged: a stored record could not be decoded. The record is left
	// as it is for an operator to inspect.
	ErrDamaged = errors.New("idem: damaged record")
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
	// lease, a store failure at most once a second, a damaged record).
	// Default: none.
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
}

// Defaults of Options.
const (
	DefaultRetention      = 24 * time.Hour
	DefaultLeaseTTL       = 30 * time.Second
	DefaultMaxKeyBytes    = 1024
	DefaultMaxResultBytes = 1 << 20
)

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
// that no Claim returned would record work nobody claimed.
func (o *Options) checkLease(l *Lease) error {
	switch {
	case l == nil:
		return fmt.Errorf("%w: nil *Lease", ErrInvalidLease)
	case l.Token <= 0:
		return fmt.Errorf("%w: Token %d (a Lease comes from Claim)", ErrInvalidLease, l.Token)
	case l.Owner == "":
		return fmt.Errorf("%w: empty Owner (a Lease comes from Claim)", ErrInvalidLease)
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
