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
// and metric labels; "" for the zero Outcome, which an Event of an
// operation that claims nothing (a Confirm, a Renew) carries, as
// ErrorClass says "" for no error.
func (o Outcome) String() string {
	switch o {
	case 0:
		return ""
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

	// Resolved marks a confirmation an operator recorded
	// (Resolver.Resolve with Confirm): its Result is the plain result
	// the key's front door documents (for Do the value as its Codec
	// encodes it, JSON by default, a string or []byte as it is), not
	// the front door's own record of it. Do decodes it as such; a front
	// door whose Resolution is built in its own form (the HTTP
	// middleware's, the RPC interceptors') or that replays no result
	// (the consumer) reads Result as it reads any other.
	Resolved bool
	// Lapsed is set only by Inspector.Inspect, on a claim whose lease ran
	// out unconfirmed and that no one has taken over yet: the attempt
	// (its owner, token, when claimed), which crashed or stalled. Expires
	// is then when the store forgets it (its Retention after the lease),
	// Owner and Token the attempt's, and TakeOvers, Prior and Checkpoint
	// what the next claim will be told.
	Lapsed *Attempt

	// Quarantined is set on a key whose work crashed more times in a row
	// than the store allows (see ErrQuarantined): Token and Owner are its
	// last attempt's, Expires the quarantine's end.
	Quarantined bool
	// Ended is why the claim's own attempt (Owner, Token) gave the key
	// up, as its holder said (see Abandoner), on a claim, a lapsed claim
	// or a quarantined key; empty when it said nothing (on a lapsed or
	// quarantined key: its lease ran out, a crash or a stall) and on a
	// confirmation.
	Ended string
	// TakeOvers counts the take-overs of a live claim's or a quarantined
	// key's earlier attempts (0 when none); Prior is the last attempt
	// taken over, and Checkpoint the last checkpoint recorded (nil: none).
	TakeOvers  int
	Prior      *Attempt
	Checkpoint []byte
}

// Claim is the answer to Store.Claim.
type Claim struct {
	Outcome Outcome
	Lease   *Lease  // set when Claimed
	Record  *Record // set when Duplicate (the confirmation) or InProgress (the holder)
	// TakeOver is set when Claimed replaced a claim whose lease had run out
	// unconfirmed: an earlier attempt crashed or stalled and may have done
	// part of the work. Check before redoing it (did the payment go
	// through?), and resume after Checkpoint. Every store of this module
	// reports it: a lapsed claim is remembered for the store's Retention
	// after its lease. A claim after a Forget (the holder said the work
	// failed), after a confirmation's retention, or of a new key is not a
	// take-over.
	TakeOver bool
	// Prior is the attempt taken over; set with TakeOver.
	Prior *Attempt
	// TakeOvers counts the key's take-overs in a row, this one included
	// (1 on the first); 0 unless TakeOver. At MaxTakeOvers the next
	// lapse quarantines the key.
	TakeOvers int
	// Checkpoint is the last progress an earlier holder recorded (see
	// Checkpointer), carried across take-overs; nil when none was.
	Checkpoint []byte
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
	// store returned (nil, made by hand, granted by another store, or a
	// copy whose Key, Token or Owner was changed), refused before any I/O (or a ConfirmBatch's results do not pair with
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

// After a crash: what the next holder of a key is told (Claim.TakeOver and
// Claim.Prior), the progress an earlier holder left (checkpoints), and the
// end of a crash loop (quarantine). Every store of this module answers the
// same; storetest checks it.

// Attempt is a claim of a key whose lease ran out before it was confirmed
// or forgotten: its worker crashed or stalled, or gave the key up saying
// why (Ended), and may have done part of the work.
type Attempt struct {
	// Owner is the Worker of the store that held it.
	Owner string
	// Token is its fencing token.
	Token int64
	// Claimed is when it was claimed, by the store's clock (on Redis the
	// token's own time: tokens are the server's clock in microseconds;
	// so too Inspect's Record.Lapsed on SQL).
	Claimed time.Time
	// Ended is why the attempt gave the key up, as its holder said with
	// Abandoner.Abandon (Do writes "Reconcile failed: ..." there); empty
	// when it said nothing: its lease ran out under it, a crash or a
	// stall. Set in Claim.Prior (the attempt just taken over) and
	// Record.Lapsed; a Record's Prior, an attempt further back, does not
	// carry it.
	Ended string
}

// MaxReasonBytes bounds Abandoner.Abandon's reason: a line for an
// operator, not a log.
const MaxReasonBytes = 1 << 10

// Abandoner is implemented by stores on which the holder of a lease that
// gives its key up unfinished, but may have done part of the work, says
// why: RedisStore, MemoryStore and the SQL store. Do calls it when
// Reconcile fails, so that neither the next holder nor an operator takes
// a failed Reconcile for a crash.
type Abandoner interface {
	// Abandon records reason as the way l's attempt ends, in one round
	// trip, while l is the key's live lease (else ErrLeaseLost). It
	// neither forgets the claim nor shortens the lease: the claim runs
	// out when it would, and the next claim takes the key over as after
	// a crash (a take-over, counted towards MaxTakeOvers), told reason in
	// Claim.Prior.Ended. Until then Inspector.Inspect shows it in
	// Record.Ended (and Record.Lapsed.Ended once the lease ran out), and
	// a key quarantined at this attempt keeps it. reason is non-empty
	// UTF-8 of at most MaxReasonBytes; a second Abandon replaces the
	// first.
	Abandon(ctx context.Context, l *Lease, reason string) error
}

// MaxCheckpointBytes bounds a checkpoint: a note of progress (the last
// completed step, an id the next holder can look up), not the work's data.
const MaxCheckpointBytes = 64 << 10

// DefaultMaxTakeOvers is Options.MaxTakeOvers' default: the take-overs of
// one key a store allows before it quarantines the key.
//
// Three: a worker killed once by a deploy, an OOM kill or a lost node is
// common, twice in a row for the same key is rare, and three take-overs
// in a row (four attempts, each ending in a crash) is the signature of a
// message that kills whoever handles it. Each one costs a worker and a
// lease of delay; a higher limit only spends more of both on a key that
// will not get through.
const DefaultMaxTakeOvers = 3

// ErrQuarantined is wrapped by Claim's error when the key's work crashed
// (its lease ran out unconfirmed) more times in a row than the store's
// MaxTakeOvers allows: the store stopped the crash loop, and no one runs the
// work again until an operator settles the key (Resolver.Resolve, `idem
// resolve`). The Claim returned with it carries the quarantined Record
// (its last attempt, the one before it, the take-overs and the checkpoint).
// A quarantined key is remembered for the store's Retention.
var ErrQuarantined = errors.New("idem: quarantined after repeated crashes; an operator must settle it")

// Checkpointer is implemented by stores on which a holder records its
// progress under its lease: RedisStore, MemoryStore and the SQL store.
type Checkpointer interface {
	// Checkpoint records data as l's progress, replacing the one before,
	// in one round trip. It writes only while l is the key's live lease
	// (a lease that was lost, forgotten or confirmed is ErrLeaseLost:
	// a stalled worker cannot overwrite its successor's progress). The
	// next holder after a take-over receives the last checkpoint in
	// Claim.Checkpoint. data is at most MaxCheckpointBytes (ErrTooLarge);
	// an empty data clears it. A checkpoint does not renew the lease.
	Checkpoint(ctx context.Context, l *Lease, data []byte) error
}

// Resolver is implemented by stores on which an operator settles a
// quarantined key: RedisStore, MemoryStore and the SQL store.
type Resolver interface {
	// Resolve settles key's quarantine in one atomic step. Without
	// Confirm the record is removed and the next Claim runs the work as
	// new (no take-over, the count starts again); with Confirm the key is
	// recorded as done with Result, marked Resolved, under a token of its
	// own and the quarantined attempts' fingerprint, replayed to
	// duplicates for the store's Retention. A key that is not quarantined
	// (none, a live claim, a confirmation) is left as it is: an error
	// wrapping ErrNotFound.
	//
	// With Force (and without Confirm) the record is removed whatever it
	// holds, but a live claim: a confirmation, a quarantine, a lapsed
	// claim, a damaged record. That is how an operator clears a key that
	// no front door can read; the work then runs again. A live claim is
	// refused with an error wrapping ErrInProgress (its holder is at
	// work: wait for its lease), no record with one wrapping ErrNotFound.
	Resolve(ctx context.Context, key string, r Resolution) error
	// Quarantined returns up to limit quarantined records (all when limit
	// is 0 or less), in no particular order.
	Quarantined(ctx context.Context, limit int) ([]*Record, error)
}

// Inspector is implemented by stores that show an operator a key's record
// whatever its state: RedisStore, MemoryStore and the SQL store.
type Inspector interface {
	// Inspect returns key's record as Lookup does, and also a claim whose
	// lease ran out unconfirmed (a crash or a stall), which Lookup answers
	// ErrNotFound and the next Claim takes over: marked Record.Lapsed. A
	// key without a record (never claimed, forgotten, expired) is
	// ErrNotFound, a damaged record ErrDamaged. It only reads.
	Inspect(ctx context.Context, key string) (*Record, error)
}

// Resolution is an operator's verdict on a key: a quarantined one, or,
// with Force, any key but one in flight.
type Resolution struct {
	// Confirm records the work as done (its effect happened) with Result;
	// false removes the record so that the work runs again.
	Confirm bool
	// Result is what duplicates are answered with when Confirm is set,
	// as the key's front door documents its result: for Do the value as
	// the call's Codec encodes it (JSON by default; a string or []byte
	// as it is), which Do decodes into its result type; for the consumer
	// wrappers the plain bytes (they record none: nil will do); for the
	// HTTP middleware the response as middleware.Resolution builds it.
	// The store keeps it marked Resolved (see Record.Resolved).
	Result []byte
	// Force, without Confirm, removes the key's record whatever it holds
	// but a live claim, a confirmed or damaged one included (see
	// Resolver.Resolve): the work runs again on the next call.
	Force bool
}
