package idem

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
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
// I/O: a bad key is ErrInvalidKey, an oversized result ErrTooLarge. A
// Claim whose ctx is done before it starts fails with ctx's error and
// claims nothing.
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

// The errors a Store returns, matched with errors.Is. Returned errors wrap
// them with the key.
var (
	// ErrLeaseLost: the lease expired, was forgotten, confirmed or taken over.
	ErrLeaseLost = errors.New("idem: lease lost")
	// ErrNotFound: no live record for the key.
	ErrNotFound = errors.New("idem: not found")
	// ErrInvalidKey: the key is empty or longer than MaxKeyBytes (or a
	// ClaimBatch's fingerprints do not pair with its keys).
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
	// ErrInvalidLease: a Lease given back to a store that no Claim of that
	// store returned (nil, made by hand, or granted by another store),
	// refused before any I/O (or a ConfirmBatch's results do not pair with
	// its leases).
	ErrInvalidLease = errors.New("idem: invalid lease")
	// ErrDamaged: a stored record could not be decoded. The record is left
	// as it is for an operator to inspect.
	ErrDamaged = errors.New("idem: damaged record")
	// ErrBusy: the store gave up waiting for something other than the key
	// (a database's single writer, a free connection) and wraps
	// ErrInProgress too. A caller that tells the two apart (the HTTP
	// middleware answers 503, not "key in flight") checks ErrBusy first.
	ErrBusy = errors.New("idem: store busy")
)
