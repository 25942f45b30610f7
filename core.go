package idem

// Over 500 lines, one concept: Core is one type whose methods are the
// steps every store takes in one operation (check, grant, answer, observe),
// in the order it takes them; a store's author reads them together.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/dchest/siphash"

	"github.com/idemgo/idem/internal/batch"
	"github.com/idemgo/idem/internal/regrant"
)

// Core is what every Store shares, and the one path the stores of this
// module take through it: options resolved to their defaults, input checked
// before any I/O, leases granted and recognised, the contract's answers
// built with the key named safely, and each operation observed and logged.
// RedisStore, MemoryStore and the SQL store (package sqlstore) are built on
// it, and so can a Store of your own be, answering as they do: run
// storetest.Run on it to confirm.
//
// Each operation of such a store takes the same steps, Claim for example:
//
//	func (s *MyStore) Claim(ctx context.Context, key string, fp []byte) (c idem.Claim, err error) {
//		start := time.Now()
//		defer func() {
//			s.core.Observe(ctx, idem.Event{Op: idem.OpClaim, Outcome: c.Outcome, TakeOver: c.TakeOver, Prior: c.Prior, Err: err}, key, start)
//		}()
//		if err := s.core.CheckClaim(key, fp); err != nil {
//			return idem.Claim{}, err // before any I/O
//		}
//		// ... claim key in the database; a new claim's lease is
//		// s.core.Lease(key, token, ttl, expires, fp), a record found is
//		// returned with s.core.FingerprintMismatch(c, key, fp) ...
//	}
//
// Renew starts with CheckLease, Confirm with CheckResult, Forget with
// CheckForget, Lookup with CheckKey, the batches with CheckClaimBatch and
// CheckConfirmBatch; a lease is the store's own claim only when both its
// Token and its Owner match the record's. A store tells the size of the
// results it records with a MaxResultBytes() int method (its
// Options().MaxResultBytes), which package middleware reads to refuse, at
// construction, a response it could not record.
//
// A Core is immutable and safe for concurrent use; a copy is the same Core.
// A zero or nil Core answers every check with an error naming NewCore.
type Core struct {
	o Options
	// home names where the store keeps its records (kind and place, say
	// its prefix or table): a lease is accepted by a store of the home
	// that granted it only (see grant).
	home string
	// failures limits the Logger's store-failure lines; shared by copies.
	failures *logLimit
}

// grant is what a store knows of a lease it granted, beyond its fields.
type grant struct {
	// store names the records' home (kind and prefix, table or memory):
	// a store accepts leases of the same home only, or a Confirm would
	// write a record for a key never claimed there.
	store string
	// key, token and owner are the lease's as granted: a copy with any of
	// them changed is refused, or a Confirm would record work under a
	// token no Claim gave out (0 fences nothing off) or for a key nobody
	// claimed, and a Renew or Forget would act on a claim the caller
	// never held.
	key   string
	token int64
	owner string
	// forgotten is set by Forget: the caller said the work did not
	// happen, so a later Confirm or Renew of the lease is refused
	// locally, before it could touch another holder's claim. A pointer,
	// shared with the leases this one is regranted as (see regranted).
	forgotten *atomic.Bool
	// confirmed is set when a Confirm of the lease passed its checks and
	// went to the store: a Renew or Forget that then finds no live claim
	// most likely found the work recorded, which LeaseLost says. A
	// pointer, as forgotten is.
	confirmed *atomic.Bool
}

// NewCore validates o and resolves its defaults, as every store's
// constructor does: an error names the one field at fault. home names
// where the store keeps its records, and must tell apart every set of
// records in the process (say `mystore db "orders" table "idem_keys"`): a
// Core accepts only leases granted by a Core of the same home (Lease), and
// refuses others with ErrInvalidLease. Two stores sharing one set of
// records (two workers, say) give the same home; two Cores with one home
// over different records would accept each other's leases.
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

// Lease returns a new lease granted by this Core's home: Claim's lease,
// owned by Options().Worker. expires is when the claim lapses by the
// store's own clock (the one that judges expiry); fingerprint is kept as
// given (not copied).
func (c *Core) Lease(key string, token int64, ttl time.Duration, expires time.Time, fingerprint []byte) *Lease {
	// The lease and its grant are one allocation.
	b := &struct {
		l    Lease
		g    grant
		f, c atomic.Bool
	}{}
	b.g = grant{store: c.home, key: key, token: token, owner: c.o.Worker, forgotten: &b.f, confirmed: &b.c}
	b.l = Lease{Key: key, Token: token, Owner: c.o.Worker, TTL: ttl, Expires: expires,
		Fingerprint: fingerprint, grant: &b.g}
	return &b.l
}

func init() {
	regrant.Lease = func(l any, key string, token int64, owner string) any {
		return l.(*Lease).regranted(key, token, owner)
	}
}

// regranted returns a copy of l with key, token and owner replaced, which
// l's home accepts as granted so and whose Forget marks l too: the leases
// this module's tests forge to reach a store's own ownership checks
// (package internal/regrant).
func (l *Lease) regranted(key string, token int64, owner string) *Lease {
	cp := *l
	cp.Key, cp.Token, cp.Owner = key, token, owner
	if l.grant != nil {
		g := *l.grant
		g.key, g.token, g.owner = key, token, owner
		cp.grant = &g
	}
	return &cp
}

// zero reports whether c is nil or a zero Core, which no constructor made:
// its options were never resolved, so no check or default can be trusted,
// and every check answers errZeroStore.
func (c *Core) zero() bool { return c == nil || c.o.MaxKeyBytes == 0 }

// CheckKey returns ErrInvalidKey for an empty key or one over MaxKeyBytes:
// Lookup's check. Keys are byte strings otherwise: NUL bytes and invalid
// UTF-8 included, compared byte for byte.
func (c *Core) CheckKey(key string) error {
	if c.zero() {
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
// ErrInvalidLease for one that no Claim of this Core's home returned, or a
// copy of one with its Key, Token or Owner changed (it would record work
// nobody claimed here), ErrLeaseLost for one its holder forgot (the caller
// said the work did not happen), and its key as CheckKey.
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
	if c.zero() {
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
	if err := c.CheckKey(l.Key); err != nil {
		return err
	}
	// A copy of a lease is the lease; one with its key, token or owner
	// changed is no lease this home granted. (Token <= 0 above refuses
	// a store's own bad grant; a copy set to 0 is refused here too.)
	switch g := l.grant; {
	case l.Key != g.key:
		return fmt.Errorf("%w: Key changed after the grant: %s, granted for %s (a Lease comes from Claim)",
			ErrInvalidLease, c.KeyName(l.Key), c.KeyName(g.key))
	case l.Token != g.token:
		return fmt.Errorf("%w: Token changed after the grant: %d, granted %d (a Lease comes from Claim)",
			ErrInvalidLease, l.Token, g.token)
	case l.Owner != g.owner:
		return fmt.Errorf("%w: Owner changed after the grant: %q, granted to %q (a Lease comes from Claim)",
			ErrInvalidLease, l.Owner, g.owner)
	}
	return nil
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
	l.grant.confirmed.Store(true)
	return nil
}

// CheckClaimBatch checks ClaimBatch's input as CheckClaim does each item,
// and that fingerprints (when not nil) has one entry per key.
func (c *Core) CheckClaimBatch(keys []string, fingerprints [][]byte) error {
	if c.zero() {
		return errZeroStore
	}
	if err := claimBatchPairs(keys, fingerprints); err != nil {
		return err
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
	if c.zero() {
		return errZeroStore
	}
	if err := confirmBatchPairs(leases, results); err != nil {
		return err
	}
	for i, l := range leases {
		if err := c.CheckResult(l, batch.Item(results, i)); err != nil {
			return fmt.Errorf("batch item %d: %w", i, err)
		}
	}
	return nil
}

// claimBatchPairs refuses a ClaimBatch whose fingerprints, when not nil,
// do not pair with its keys.
func claimBatchPairs(keys []string, fingerprints [][]byte) error {
	if fingerprints != nil && len(fingerprints) != len(keys) {
		return fmt.Errorf("%w: ClaimBatch with %d keys and %d fingerprints; want one fingerprint per key, or nil",
			ErrInvalidKey, len(keys), len(fingerprints))
	}
	return nil
}

// confirmBatchPairs refuses a ConfirmBatch whose results, when not nil, do
// not pair with its leases.
func confirmBatchPairs(leases []*Lease, results [][]byte) error {
	if results != nil && len(results) != len(leases) {
		return fmt.Errorf("%w: ConfirmBatch with %d leases and %d results; want one result per lease, or nil",
			ErrInvalidLease, len(leases), len(results))
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

// CheckCheckpoint is Checkpoint's check: the lease as CheckLease, and the
// checkpoint (ErrTooLarge over MaxCheckpointBytes).
func (c *Core) CheckCheckpoint(l *Lease, data []byte) error {
	if err := c.CheckLease(l); err != nil {
		return err
	}
	if len(data) > MaxCheckpointBytes {
		return fmt.Errorf("%w: checkpoint of %d bytes for %s exceeds MaxCheckpointBytes %d",
			ErrTooLarge, len(data), c.KeyName(l.Key), MaxCheckpointBytes)
	}
	return nil
}

// CheckAbandon is Abandon's check: the lease as CheckLease, and a reason
// that is non-empty UTF-8 within MaxReasonBytes.
func (c *Core) CheckAbandon(l *Lease, reason string) error {
	if err := c.CheckLease(l); err != nil {
		return err
	}
	switch {
	case reason == "":
		return fmt.Errorf("idem: Abandon of %s: the reason is empty; say why the attempt gives up", c.KeyName(l.Key))
	case len(reason) > MaxReasonBytes:
		return fmt.Errorf("%w: Abandon's reason of %d bytes for %s exceeds MaxReasonBytes %d",
			ErrTooLarge, len(reason), c.KeyName(l.Key), MaxReasonBytes)
	case !utf8.ValidString(reason):
		return fmt.Errorf("idem: Abandon of %s: the reason is not valid UTF-8", c.KeyName(l.Key))
	}
	return nil
}

// CheckResolve is Resolve's check: the key as CheckKey, a Result only
// with Confirm, within MaxResultBytes, and Force only without Confirm.
func (c *Core) CheckResolve(key string, r Resolution) error {
	if err := c.CheckKey(key); err != nil {
		return err
	}
	if !r.Confirm && r.Result != nil {
		return fmt.Errorf("idem: Resolution.Result is set without Confirm; a forgotten key records no result")
	}
	if r.Confirm && r.Force {
		return fmt.Errorf("idem: Resolution.Force is set with Confirm; Force goes with a forget (clear the key, then the work runs again), Confirm settles a quarantined key")
	}
	if len(r.Result) > c.o.MaxResultBytes {
		return fmt.Errorf("%w: Resolution.Result of %d bytes for %s exceeds MaxResultBytes %d",
			ErrTooLarge, len(r.Result), c.KeyName(key), c.o.MaxResultBytes)
	}
	return nil
}

// Quarantined is the error Claim returns, with the quarantined record in
// its Claim, when key is quarantined (wrapping ErrQuarantined).
func (c *Core) Quarantined(rec *Record) error {
	return fmt.Errorf("%w: claim of %s: %d take-overs, last attempt token %d by %q %s",
		ErrQuarantined, c.KeyName(rec.Key), rec.TakeOvers, rec.Token, rec.Owner, howEnded(rec.Ended))
}

// howEnded says how an attempt that gave its key up unconfirmed ended:
// as its holder said (Abandoner), or, when it said nothing, by its lease
// running out.
func howEnded(reason string) string {
	if reason == "" {
		return "(its lease ran out: a crash or a stall)"
	}
	return "(abandoned: " + reason + ")"
}

// NotQuarantined is the error Resolve returns when key is not quarantined
// (wrapping ErrNotFound).
func (c *Core) NotQuarantined(key string) error {
	return fmt.Errorf("%w: no quarantined record for %s", ErrNotFound, c.KeyName(key))
}

// NothingToClear is the error Resolve with Force returns when key has no
// record (wrapping ErrNotFound).
func (c *Core) NothingToClear(key string) error {
	return fmt.Errorf("%w: no record to clear for %s", ErrNotFound, c.KeyName(key))
}

// LiveClaim is the error Resolve with Force returns when key is held by a
// live claim, which it never removes (wrapping ErrInProgress).
func (c *Core) LiveClaim(key string) error {
	return fmt.Errorf("%w: %s is held by a live claim, which an operator's forget never removes: its holder is at work; wait for its lease to end", ErrInProgress, c.KeyName(key))
}

// AlreadyConfirmed is the error Confirm returns when another lease's
// confirmation of l's key was kept (wrapping ErrAlreadyConfirmed).
func (c *Core) AlreadyConfirmed(l *Lease) error {
	return fmt.Errorf("%w: confirm of %s token %d", ErrAlreadyConfirmed, c.KeyName(l.Key), l.Token)
}

// LeaseLost is the error op (OpRenew, OpForget, ...) returns when the store
// holds nothing of l's: no live claim with l's Token and Owner (wrapping
// ErrLeaseLost). After a Confirm of l was sent, that is what it found: the
// work recorded as done, which the error says instead of a lease lost
// (read alone, "lease lost" suggests the work was); the exception, a
// Confirm that failed and a lease that ran out too, returned its own error
// to the caller first.
func (c *Core) LeaseLost(op Op, l *Lease) error {
	if l.grant != nil && l.grant.confirmed.Load() {
		return fmt.Errorf("%w: %s of %s token %d: %w", ErrLeaseLost, op, c.KeyName(l.Key), l.Token, errConfirmedLease)
	}
	return fmt.Errorf("%w: %s of %s token %d: no live claim of this lease (it ran out, was taken over or forgotten)",
		ErrLeaseLost, op, c.KeyName(l.Key), l.Token)
}

// errConfirmedLease is what LeaseLost says of a lease whose Confirm was
// sent.
var errConfirmedLease = errors.New("the lease was confirmed: its work is recorded as done, and a confirmation is neither renewed nor forgotten")

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

// roundMs rounds d up to whole milliseconds.
func roundMs(d time.Duration) time.Duration {
	return (d + time.Millisecond - 1) / time.Millisecond * time.Millisecond
}

// Observe reports one operation on key (empty for a batch) that began at
// start: to the Observer, and to the Logger when it needs a human (a lease
// found lost on Renew, a store failing: at most one line a second). The
// caller sets e's Op, Err and what it knows (Outcome and TakeOver of a
// Claim, Late of a Confirm, or of a ConfirmBatch when any item was late,
// Items of a batch); Observe fills in Took, KeyHash, Cache and Items (1
// when zero). It costs nothing without an Observer or a Logger.
func (c *Core) Observe(ctx context.Context, e Event, key string, start time.Time) {
	if c == nil {
		return // a zero store's error is its caller's answer
	}
	o := &c.o
	if o.Observer == nil && o.Logger == nil {
		return
	}
	e.Took = time.Since(start)
	if e.Cache == 0 {
		e.Cache = cacheResult(ctx)
	}
	if e.Items == 0 {
		e.Items = 1
	}
	if key != "" && o.Observer != nil {
		e.KeyHash = o.KeyHasher.Hash(key)
	}
	if o.Logger != nil {
		c.logEvent(ctx, &e, key)
	}
	if o.Observer != nil {
		o.Observer.Observe(ctx, e)
	}
}

// logEvent logs the events an operator must see: a take-over (and how
// the attempt taken over ended), a lease found lost on Renew (the work
// goes on unprotected, or stops), and a store failing. A
// late confirm is logged where it is found, per item (LogLate). The key is
// hashed only for a line that is written.
func (c *Core) logEvent(ctx context.Context, e *Event, key string) {
	o := &c.o
	hash := func() string {
		if e.KeyHash == "" && key != "" {
			e.KeyHash = o.KeyHasher.Hash(key)
		}
		return e.KeyHash
	}
	keyAttr := func() slog.Attr {
		if o.RevealKeys && key != "" {
			return c.keyAttr(key)
		}
		return slog.String("key_hash", hash())
	}
	if e.Op == OpClaim && e.TakeOver && e.Err == nil && e.Prior != nil {
		c.logTakeOver(ctx, keyAttr(), e.Prior)
	}
	switch e.Class() {
	case ClassLeaseLost:
		// A renewal racing the Confirm that ended the lease found the work
		// recorded: nothing for an operator.
		if e.Op == OpRenew && !errors.Is(e.Err, errConfirmedLease) {
			o.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: lease lost: another worker may take the key over",
				keyAttr())
		}
	case ClassStore, ClassDamaged:
		if n, ok := c.failures.admit(time.Now()); ok {
			o.Logger.LogAttrs(ctx, slog.LevelError, "idem: store operation failed",
				slog.String("op", e.Op.String()), keyAttr(),
				slog.Int64("failures_not_logged", n), slog.Any("err", e.Err))
		}
	}
}

// LogLate logs a confirmation recorded after l was lost: the work may have
// run twice, which an operator wants to know. A batch calls it once per
// late item; the event's Late says the same to the Observer.
func (c *Core) LogLate(ctx context.Context, l *Lease) {
	if c.o.Logger == nil {
		return
	}
	c.o.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: late confirm: the lease was lost before the work was confirmed",
		c.keyAttr(l.Key), slog.Int64("token", l.Token), slog.String("owner", l.Owner))
}

// logTakeOver logs a take-over of the key key names from prior: the work
// may have happened, and may now happen again, which is what an operator
// asks after a double effect.
func (c *Core) logTakeOver(ctx context.Context, key slog.Attr, prior *Attempt) {
	c.o.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: take-over: an earlier attempt gave the key up unconfirmed, maybe after its effect",
		key, slog.String("prior_owner", prior.Owner), slog.Int64("prior_token", prior.Token),
		slog.String("prior_ended", howEnded(prior.Ended)))
}

// LogTakeOvers logs the take-overs among cs, the claims of keys that a
// ClaimBatch returned (a single Claim's is logged by Observe), as Observe
// logs a Claim's. err is the batch's: a plain error claimed nothing.
func (c *Core) LogTakeOvers(ctx context.Context, keys []string, cs []Claim, err error) {
	if c == nil || c.o.Logger == nil || len(cs) != len(keys) {
		return
	}
	if err != nil && !errors.As(err, new(*BatchError)) {
		return
	}
	for i, cl := range cs {
		if cl.TakeOver && cl.Prior != nil {
			c.logTakeOver(ctx, c.keyAttr(keys[i]), cl.Prior)
		}
	}
}

// LogAbandoned logs l's Abandon with reason: the next claim takes the key
// over, and an operator reading the log of a later take-over or
// quarantine finds why here.
func (c *Core) LogAbandoned(ctx context.Context, l *Lease, reason string) {
	if c.o.Logger == nil {
		return
	}
	c.o.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: attempt abandoned unconfirmed: the next claim takes the key over when its lease runs out",
		c.keyAttr(l.Key), slog.Int64("token", l.Token), slog.String("owner", l.Owner), slog.String("reason", reason))
}

// keyAttr names key in a log line: by its hash, or with RevealKeys as it is.
func (c *Core) keyAttr(key string) slog.Attr {
	if c.o.RevealKeys {
		return slog.String("key", key)
	}
	return slog.String("key_hash", c.o.KeyHasher.Hash(key))
}

// logLimit lets one store-failure line a second through, so that an outage
// at thousands of operations a second is one line a second, each saying how
// many failures it stands for.
type logLimit struct {
	mu      sync.Mutex
	next    time.Time
	dropped int64
}

// admit reports whether to log a failure at now and how many were dropped
// since the last one logged.
func (l *logLimit) admit(now time.Time) (int64, bool) {
	if l == nil {
		return 0, true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Before(l.next) {
		l.dropped++
		return 0, false
	}
	n := l.dropped
	l.dropped, l.next = 0, now.Add(time.Second)
	return n, true
}

// MinKeyHashSecret is the shortest secret NewKeyHasher accepts.
const MinKeyHashSecret = 16

// KeyHasher computes the keyed hash idem writes in place of a key in logs,
// events, metrics and traces: 16 hex digits of SipHash-2-4(k, key), where
// the 128-bit k is drawn from SHA-256 of the secret. Keys are often
// guessable (order numbers, message ids), so a plain hash would reveal them
// to anyone who tries candidates; a keyed one does not without the secret.
// SipHash is a pseudorandom function made for short inputs: it costs tens
// of nanoseconds where HMAC-SHA256 costs hundreds, which matters because an
// observed store hashes a key per operation. Processes that share the
// secret produce the same hash for a key, so their logs correlate. A nil
// *KeyHasher hashes with the process's default secret. Safe for concurrent
// use.
type KeyHasher struct {
	k0, k1 uint64
}

// NewKeyHasher returns a KeyHasher keyed by secret, which must be at least
// MinKeyHashSecret bytes.
func NewKeyHasher(secret []byte) (*KeyHasher, error) {
	if len(secret) < MinKeyHashSecret {
		return nil, fmt.Errorf("idem: key hash secret of %d bytes; need at least %d", len(secret), MinKeyHashSecret)
	}
	k := sha256.Sum256(secret)
	return &KeyHasher{k0: binary.LittleEndian.Uint64(k[0:8]), k1: binary.LittleEndian.Uint64(k[8:16])}, nil
}

// defaultKeyHasher has a random secret: hashes are stable within this
// process and meaningless outside it.
var defaultKeyHasher = func() *KeyHasher {
	var secret [32]byte
	if _, err := rand.Read(secret[:]); err != nil {
		panic("idem: no randomness for the key hash secret: " + err.Error())
	}
	h, _ := NewKeyHasher(secret[:])
	return h
}()

// Hash returns the keyed hash of key.
func (h *KeyHasher) Hash(key string) string {
	if h == nil {
		h = defaultKeyHasher
	}
	var sum [8]byte
	// siphash only reads p: the key's bytes are lent to it without the copy
	// that []byte(key) would allocate for a key over 32 bytes.
	p := unsafe.Slice(unsafe.StringData(key), len(key))
	binary.BigEndian.PutUint64(sum[:], siphash.Hash(h.k0, h.k1, p))
	var out [16]byte
	hex.Encode(out[:], sum[:])
	return string(out[:])
}

// KeyHash returns the hash of key with the process's default KeyHasher: it
// correlates log lines of this process only. To correlate across processes,
// give them all a KeyHasher with one secret (Options.KeyHasher, and the
// wrappers' options).
func KeyHash(key string) string { return defaultKeyHasher.Hash(key) }

// leaseKey is l's key, or "" for a nil lease (which the operation rejects).
func leaseKey(l *Lease) string {
	if l == nil {
		return ""
	}
	return l.Key
}
