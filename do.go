package idem

// Over 500 lines, one concept: Do's whole path, from the claim to the
// replay, with the encoding of the record that only Do writes and reads.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemgo/idem/internal/backoff"
	"github.com/idemgo/idem/internal/badopt"
	"github.com/idemgo/idem/internal/jsontype"
	"github.com/idemgo/idem/internal/nilcheck"
)

// Do runs fn once per key and hands every call of the key the first
// call's result: the one call for the common case, in place of Claim,
// KeepAlive, Confirm and Forget by hand. It works on every Store.
//
// Do claims key with DoOptions.Fingerprint, and then:
//
//   - Claimed: it runs fn under KeepAlive, with the lease in fn's context
//     (LeaseFrom gives its fencing token), records fn's result encoded by
//     DoOptions.Codec, and returns it decoded from that record: the first
//     caller gets the value every replay gets, not fn's value as it was
//     (a field JSON drops is dropped for both). The record is written on a context
//     detached from ctx's cancellation and retried until the lease runs
//     out: once fn has done the work, a caller giving up must not leave it
//     unrecorded. When no Confirm succeeds, Do returns fn's result with an
//     error matching ErrNotRecorded (the work was done; a call after the
//     lease runs out does it again). When another lease's confirmation was
//     kept first, it returns fn's result with Confirm's error, matching
//     ErrAlreadyConfirmed (the work was done twice; later calls get the
//     other result).
//   - Duplicate: fn does not run; Do returns the recorded result, decoded,
//     or the recorded permanent error (see Permanent). A result an
//     operator recorded (Resolver.Resolve, idem resolve; Record.Resolved)
//     is the value as the Codec encodes it (JSON by default, a string or
//     []byte as it is), decoded into T likewise.
//   - InProgress: Do waits for the holder, for at most DoOptions.Wait and
//     while ctx lasts, polling the store with a jittered backoff (Lookup
//     while the claim lives, Claim once it is gone or done), and returns
//     what the holder recorded; if the holder failed, this call claims the
//     key and runs fn itself. When the wait ends first, Do returns an
//     error matching ErrInProgress.
//   - A fingerprint mismatch, a store error: fn does not run; Do returns
//     Claim's error (matching ErrFingerprintMismatch for the first).
//
// fn's error forgets the claim, so that a later call runs fn again, and is
// returned as it is; unless it is marked with Permanent, in which case it
// is recorded as the key's answer, returned, and replayed to every later
// call. A panic in fn (or runtime.Goexit) forgets the claim too, and goes
// on up the caller's stack. DoOptions.MaxHold caps how long the lease is
// kept alive for fn.
//
// A result that cannot be recorded is never a reason to run fn twice.
// With the default codec, a result type JSON cannot carry there and back
// (a chan, a func, an interface with methods such as error, a struct of
// unexported fields only) is refused before any I/O and before fn runs,
// with an error matching ErrResultType. A value that fails to encode or
// decode once fn has run (a NaN, a chan inside an any) is recorded as the
// key's answer in its place: Do returns fn's value with an error matching
// ErrUnencodable, and every later call of the key, waiters included, gets
// that error (a *PermanentError) without running fn, for the retention.
//
// Bad input (a nil or typed-nil store, a nil fn, an empty key, invalid
// options) is an error before any I/O, as is a key or fingerprint the
// store refuses.
//
// After a crash: when the claim took the key over from an earlier call
// whose lease ran out unconfirmed (Claim.TakeOver: it crashed or stalled,
// maybe after its effect), fn's context carries the take-over
// (TakeOverFrom: the earlier attempt, the count, its last checkpoint), and
// DoOptions.Reconcile, when set, is asked first whether that attempt's
// effect landed; fn runs only if it did not. Inside fn, Checkpoint(ctx,
// data) records progress for the next holder. A key whose calls crashed
// more than the store's MaxTakeOvers times in a row is quarantined: Do
// returns Claim's error, matching ErrQuarantined, and fn does not run
// until an operator settles the key (Resolver, idem resolve).
//
// v is valid when err is nil, and also when err matches ErrNotRecorded,
// ErrAlreadyConfirmed or ErrUnencodable: fn ran (or Reconcile found its
// effect) and returned it.
//
// Where duplicates come often, give Do a Cache around the store (NewCache):
// a duplicate is then answered from memory. Do does not build one itself,
// because a cache answers a record deleted by hand for up to its MaxAge.
func Do[T any](ctx context.Context, s Store, key string, fn func(ctx context.Context) (T, error), opts ...DoOptions) (v T, err error) {
	o, err := doSetup(s, key, fn == nil, reflect.TypeFor[T](), opts)
	if err != nil {
		return v, err
	}
	poll := backoff.NewPoll(o.Wait)
	for {
		cl, err := s.Claim(ctx, key, o.Fingerprint)
		if err != nil {
			return v, err
		}
		switch cl.Outcome {
		case Claimed:
			return run(ctx, s, cl, fn, &o)
		case Duplicate:
			return replay[T](key, cl.Record, &o)
		case InProgress:
		default:
			return v, fmt.Errorf("idem: Do: Claim answered an unknown outcome %v", cl.Outcome)
		}
		if err := waitHolder(ctx, s, key, &poll); err != nil {
			return v, err
		}
	}
}

// DoOptions configure Do: one flat literal, passed by value
// (idem.DoOptions{Fingerprint: fp}). The zero value is valid; a zero field
// means its default.
type DoOptions struct {
	// Fingerprint identifies the call's input: a hash of it, at most
	// MaxFingerprintBytes, stored with the claim. A call whose key was
	// claimed or recorded with another non-empty fingerprint gets an error
	// matching ErrFingerprintMismatch, never the other input's result.
	//
	// Default: none, and so no check. Do cannot derive one: it sees a key
	// and a function, and a function's inputs are in its closure; a
	// fingerprint made from the result type would refuse every key once
	// the type is renamed across a deploy. Pass one whenever the key is
	// chosen apart from the input (a client's Idempotency-Key, a request
	// id): without it a key reused for another input gets the first
	// input's result.
	Fingerprint []byte
	// Codec encodes fn's result for the store and decodes it for the
	// first caller and the calls that replay it. Default: a []byte or a
	// string as it is, any other type as JSON (encoding/json), whose
	// limits then apply to all callers alike: unexported fields are not
	// kept, and a number inside an any comes back a float64 (exact up to
	// 2^53). A Codec given here encodes every type, []byte and string
	// included, and its result type is not checked before fn runs.
	Codec Codec
	// Wait bounds how long a call that finds the key in progress waits for
	// the holder's result (ctx bounds it too), polling with a jittered
	// backoff from 10ms up to 250ms; then Do returns an error matching
	// ErrInProgress. A Wait under 10ms waits once, looks once more, then
	// answers. Negative
	// is an error. Default 5s.
	Wait time.Duration
	// MaxHold caps the total time the lease is kept alive for fn. When it
	// is reached, renewals stop and fn's context is cancelled with a cause
	// (context.Cause) matching ErrMaxHold: the lease then runs out within
	// the store's LeaseTTL, and another call may take the key over, unless
	// fn returns first. It bounds what a stuck fn can hold up, where a
	// renewal without end would stall every call of the key. Negative is
	// an error. Default: no cap (ctx alone bounds fn).
	MaxHold time.Duration
	// Reconcile, when set, is called instead of fn when the claim took the
	// key over from an earlier call whose lease ran out unconfirmed (see
	// TakeOver): that call crashed or stalled, maybe after its effect and
	// before its record. It runs under the lease, as fn would, and asks the
	// downstream system whether the earlier attempt's effect landed (by the
	// key, the attempt's fencing token, its checkpoint):
	//
	//   - done true: the effect happened. result, which must be a value of
	//     fn's result type T (nil for T's zero value), is recorded as the
	//     key's result and returned, and fn does not run.
	//   - done false: it did not; fn runs, with the take-over in its
	//     context.
	//   - an error marked with Permanent: recorded and replayed, as fn's.
	//   - any other error, or a panic, or a result that is not a T: Do
	//     returns it (the panic goes on) and leaves the claim to run out
	//     unforgotten, so that the next call is told of the take-over and
	//     reconciles again; a Forget would erase what it was told, and the
	//     next call would redo the effect. That counts as a take-over
	//     towards the store's MaxTakeOvers. On a store that is an
	//     Abandoner (every store of this module) Do records why first
	//     ("Reconcile failed: " and the error), which the next call finds
	//     in TakeOver.Prior.Ended and `idem inspect`, a quarantine and the
	//     store's log show, so that a failed Reconcile is not taken for a
	//     crash.
	//
	// Default: none; fn runs after a take-over too, and may check
	// TakeOverFrom itself.
	Reconcile func(ctx context.Context, t *TakeOver) (result any, done bool, err error)
	// Errors are the sentinel errors of fn's domain (ErrCardDeclined) that
	// a replayed permanent error must still match: the recorded error
	// keeps the message of the first of them that fn's error matched
	// (errors.Is), and a replay wraps the sentinel of that message. An
	// entry must not be nil. Default: none.
	Errors []error
}

// Codec encodes and decodes the results that Do records. Its methods have
// the signatures of encoding/json's Marshal and Unmarshal.
type Codec interface {
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// defaultWait is DoOptions.Wait's default: long enough for most work in
// flight to finish, short enough that a caller is answered while it waits.
const defaultWait = 5 * time.Second

var (
	// ErrNotRecorded: Do's fn returned, but no Confirm of its result
	// succeeded while the lease lasted. The work was done; the key stays
	// claimed until its lease runs out, and a call after that runs fn
	// again.
	ErrNotRecorded = errors.New("idem: work done but not recorded")
	// ErrMaxHold: the cause with which Do cancels fn's context once the
	// lease has been kept alive for DoOptions.MaxHold.
	ErrMaxHold = errors.New("idem: lease held for DoOptions.MaxHold")
	// ErrResultType: Do refused fn's result type before any I/O, because
	// the default codec (JSON) cannot record a value of it and read it
	// back. fn did not run.
	ErrResultType = errors.New("idem: Do: the result type cannot be recorded")
	// ErrUnencodable: Do's fn ran, but its value could not be encoded and
	// read back by the codec. The key records this error in place of the
	// result, and answers it to every later call within the retention:
	// the work was done, and is not done again.
	ErrUnencodable = errors.New("idem: the work was done but its result could not be encoded")
)

// doSetup checks Do's arguments before any I/O and returns its options
// with the defaults filled in.
func doSetup(s Store, key string, nilFn bool, result reflect.Type, opts []DoOptions) (DoOptions, error) {
	var o DoOptions
	switch {
	case nilcheck.Nil(s):
		return o, errors.New("idem: Do: the store is nil")
	case nilFn:
		return o, errors.New("idem: Do: fn is nil")
	case key == "":
		return o, fmt.Errorf("%w: Do: empty key", ErrInvalidKey)
	case len(opts) > 1:
		return o, fmt.Errorf("idem: Do: %d DoOptions; want at most one", len(opts))
	}
	if len(opts) == 1 {
		o = opts[0]
	}
	if o.Wait < 0 {
		return o, badopt.Default("idem", "DoOptions.Wait", o.Wait, defaultWait, "is negative")
	}
	if o.MaxHold < 0 {
		return o, badopt.Default("idem", "DoOptions.MaxHold", o.MaxHold, "no cap", "is negative")
	}
	for i, e := range o.Errors {
		if e == nil {
			return o, badopt.Error("idem", fmt.Sprintf("DoOptions.Errors[%d]", i), e, "matches no error; give a sentinel error")
		}
	}
	if o.Codec == nil {
		// Checked now, not when the first value fails to encode: by then fn
		// has done the work.
		if err := jsontype.Check(result); err != nil {
			return o, fmt.Errorf("%w: %w; return a type JSON can read back, or set DoOptions.Codec", ErrResultType, err)
		}
	}
	if o.Wait == 0 {
		o.Wait = defaultWait
	}
	return o, nil
}

// waitHolder waits for the holder of key to finish: it polls Lookup at
// poll's pace until the claim is gone or done, when Do claims again. A
// Lookup reads where a Claim would write (on SQL, a SELECT where a Claim
// is an INSERT), so many waiters do not load the store with writes. It
// returns an error matching ErrInProgress when poll's deadline or ctx
// comes first, or Lookup's error.
func waitHolder(ctx context.Context, s Store, key string, poll *backoff.Poll) error {
	for {
		if poll.Expired() {
			return fmt.Errorf("%w: key#%s is held by another call past DoOptions.Wait", ErrInProgress, KeyHash(key))
		}
		if !poll.Wait(ctx) {
			return fmt.Errorf("%w: key#%s: the wait ended: %w", ErrInProgress, KeyHash(key), context.Cause(ctx))
		}
		rec, err := s.Lookup(ctx, key)
		switch {
		case errors.Is(err, ErrNotFound):
			return nil // forgotten, or its lease ran out: claim it
		case err != nil:
			return err
		case rec.Confirmed:
			return nil // Claim answers Duplicate, checking the fingerprint
		}
	}
}

// run runs fn under cl's lease (or, after a take-over, Reconcile first)
// and records its result or permanent error, or forgets the lease.
func run[T any](ctx context.Context, s Store, cl Claim, fn func(context.Context) (T, error), o *DoOptions) (v T, err error) {
	l := cl.Lease
	t := TakeOverOf(cl)
	parent := ContextWithTakeOver(ctx, t)
	if o.MaxHold > 0 {
		var cancel context.CancelFunc
		parent, cancel = context.WithTimeoutCause(parent, o.MaxHold,
			fmt.Errorf("%w: renewals stopped after %v", ErrMaxHold, o.MaxHold))
		defer cancel()
	}
	work, stop := Hold(parent, s, l)
	returned, reconciling := false, false
	defer func() {
		if !returned {
			// fn panicked or called runtime.Goexit: release the key so a
			// later call runs fn, and let the panic go on. A panic of
			// Reconcile leaves the claim to run out (see
			// DoOptions.Reconcile), saying so.
			end := stop()
			if reconciling {
				abandon(ctx, s, l, end, "Reconcile panicked (or called runtime.Goexit)")
			} else {
				_ = settle(ctx, l, end, func(ctx context.Context) error { return s.Forget(ctx, l) })
			}
		}
	}()
	done := false
	if t != nil && o.Reconcile != nil {
		reconciling = true
		v, done, err = reconcile[T](work, o.Reconcile, t)
		reconciling = false
		if err != nil && !isPermanent(err) {
			returned = true
			abandon(ctx, s, l, stop(), "Reconcile failed: "+err.Error())
			return v, fmt.Errorf("idem: Do: Reconcile after the take-over of key#%s (token %d; left to run out): %w", KeyHash(l.Key), l.Token, err)
		}
	}
	if !done && err == nil {
		v, err = fn(work)
	}
	returned = true
	end := stop() // no Renew in flight from here on
	var result []byte
	switch {
	case err == nil:
		var read T
		if result, read, err = recordable(v, o); err != nil {
			// The work is done: returning without a record would leave the
			// key held for the lease and then run fn again. The error is
			// recorded in its place, as a permanent one.
			err = &PermanentError{Err: fmt.Errorf("%w: key#%s token %d: %w", ErrUnencodable, KeyHash(l.Key), l.Token, err)}
			result = encodeUnencodable(err)
		} else {
			v = read
		}
	case isPermanent(err):
		result = encodeError(err, o)
	default:
		_ = settle(ctx, l, end, func(ctx context.Context) error { return s.Forget(ctx, l) })
		return v, err
	}
	cerr := settle(ctx, l, end, func(ctx context.Context) error { return s.Confirm(ctx, l, result) })
	switch {
	case cerr == nil:
	case errors.Is(cerr, ErrAlreadyConfirmed):
		err = errors.Join(err, cerr)
	default:
		err = errors.Join(err, fmt.Errorf("%w: key#%s token %d: %w", ErrNotRecorded, KeyHash(l.Key), l.Token, cerr))
	}
	return v, err
}

// reconcile asks rc whether the attempt t took over did the work, and
// returns its result as a T when it did.
func reconcile[T any](ctx context.Context, rc func(context.Context, *TakeOver) (any, bool, error), t *TakeOver) (v T, done bool, err error) {
	r, done, err := rc(ctx, t)
	if err != nil || !done {
		return v, false, err
	}
	if r == nil {
		return v, true, nil
	}
	x, ok := r.(T)
	if !ok {
		return v, false, fmt.Errorf("the result of Reconcile is a %T; want fn's result type %s", r, strings.TrimPrefix(fmt.Sprintf("%T", (*T)(nil)), "*"))
	}
	return x, true, nil
}

// abandon tells s why l's attempt gives its key up, when s is an
// Abandoner, so that the next holder and an operator do not take a failed
// Reconcile for a crash; end is when l runs out. The claim is left to run
// out either way: a failure to say why loses nothing but the reason, so
// it gets one try, bounded by two seconds and by end, and never holds up
// the caller's error for long.
func abandon(ctx context.Context, s Store, l *Lease, end time.Time, reason string) {
	a, ok := s.(Abandoner)
	if !ok {
		return
	}
	reason = strings.ToValidUTF8(reason, "\uFFFD")
	if len(reason) > MaxReasonBytes {
		cut := MaxReasonBytes - len("…")
		for cut > 0 && !utf8.RuneStart(reason[cut]) {
			cut--
		}
		reason = reason[:cut] + "…"
	}
	bound := 2 * time.Second
	if left := time.Until(end); left > 0 {
		bound = min(bound, left)
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bound)
	defer cancel()
	_ = a.Abandon(actx, l, reason)
}

// settle runs op, the Confirm or Forget of l, which runs out at end, on a
// context detached from ctx's cancellation, retrying until end: past it
// the key may be another call's, and a retry could only find that out. A
// lease already over gets one attempt.
func settle(ctx context.Context, l *Lease, end time.Time, op func(context.Context) error) error {
	if !end.After(time.Now()) {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(l.TTL/3, time.Second))
		defer cancel()
		return op(sctx)
	}
	sctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), end)
	defer cancel()
	return backoff.Retry(sctx, op, unfixable)
}

// unfixable reports the errors of a Confirm or Forget that no retry fixes.
// It is internal/retry.Permanent, which package idem cannot import (it
// imports idem); TestDoRetriesWhatRetryRetries keeps the two the same.
func unfixable(err error) bool {
	for _, e := range [...]error{ErrInvalidKey, ErrTooLarge, ErrInvalidLease, ErrDamaged,
		ErrLeaseLost, ErrFingerprintMismatch, ErrAlreadyConfirmed} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Permanent marks err as the final answer of Do's fn for its key: Do
// records it, as it records a result, returns it, and replays it to every
// later call of the key instead of running fn again (a declined card stays
// declined). fn may wrap the marked error further. An error not so marked
// forgets the claim, so that a later call runs fn. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// PermanentError is an error that Do records and replays (see Permanent).
//
// What survives the round trip through the store: the message of the
// error fn returned (with whatever fn wrapped around the mark), that it is
// a PermanentError (errors.As), and the first of DoOptions.Errors that it
// matched (errors.Is), as long as the replaying call lists it too. Types,
// fields and other wrapped errors do not: a replay carries text.
type PermanentError struct {
	// Err is the marked error. On a replay, it is an error with the
	// recorded message that wraps the recorded sentinel, if any.
	Err error
	// Replayed reports that the error was read from the store, recorded by
	// an earlier call: this call's fn did not run.
	Replayed bool
}

// Error returns Err's message.
func (e *PermanentError) Error() string { return e.Err.Error() }

// Unwrap returns Err, so errors.Is and errors.As see through the mark.
func (e *PermanentError) Unwrap() error { return e.Err }

func isPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}

// A result that Do records begins with a byte that says what follows:
// resultValue, then fn's result as the Codec encoded it (a []byte or a
// string as it is, by default); or resultError, then a permanent error as
// the JSON of recordedError. An earlier version of this format, or a
// record that the raw API wrote, is told apart by the byte.
const (
	resultValue = 'v'
	resultError = 'e'
)

// recordedError is a permanent error as Do records it.
type recordedError struct {
	Error string `json:"error"`
	// Is is the message of the first sentinel of DoOptions.Errors that
	// the error matched; empty if none.
	Is string `json:"is,omitempty"`
	// Unencodable marks the error Do records in place of a result it
	// could not encode: a replay matches ErrUnencodable.
	Unencodable bool `json:"unencodable,omitempty"`
}

// recordable encodes v, and decodes it back as a replay would: the record
// and the value that the first caller gets, which is what every replay
// gets.
func recordable[T any](v T, o *DoOptions) ([]byte, T, error) {
	var read T
	b, err := encodeValue(v, o)
	if err != nil {
		return nil, read, err
	}
	if read, err = decodeValue[T](b[1:], o); err != nil {
		return nil, read, fmt.Errorf("the encoded result, a %T, does not decode: %w", v, err)
	}
	return b, read, nil
}

func encodeUnencodable(err error) []byte {
	b, _ := json.Marshal(recordedError{Error: err.Error(), Unencodable: true}) // a string and a bool: cannot fail
	return append([]byte{resultError}, b...)
}

func encodeValue[T any](v T, o *DoOptions) ([]byte, error) {
	if o.Codec == nil {
		switch x := any(v).(type) {
		case []byte:
			return append([]byte{resultValue}, x...), nil
		case string:
			return append([]byte{resultValue}, x...), nil
		}
	}
	var b []byte
	var err error
	if o.Codec != nil {
		b, err = o.Codec.Marshal(v)
	} else {
		b, err = json.Marshal(v)
	}
	if err != nil {
		return nil, fmt.Errorf("encoding the result, a %T: %w", v, err)
	}
	return append([]byte{resultValue}, b...), nil
}

func encodeError(err error, o *DoOptions) []byte {
	r := recordedError{Error: err.Error()}
	for _, s := range o.Errors {
		if errors.Is(err, s) {
			r.Is = s.Error()
			break
		}
	}
	b, _ := json.Marshal(r) // two strings: cannot fail
	return append([]byte{resultError}, b...)
}

// replay decodes what an earlier call of key recorded, or an operator:
// an operator's result (Record.Resolved) is the value as the codec encodes
// it, without Do's leading byte, which no document asks an operator to
// write (see Resolution.Result).
func replay[T any](key string, rec *Record, o *DoOptions) (v T, err error) {
	result := rec.Result
	if rec.Resolved {
		if v, err = decodeValue[T](result, o); err != nil {
			return v, fmt.Errorf("%w: key#%s: the result an operator recorded does not decode as a %T: %w; idem resolve KEY --forget --force clears it (the work then runs again)",
				ErrDamaged, KeyHash(key), v, err)
		}
		return v, nil
	}
	if len(result) == 0 {
		return v, fmt.Errorf("%w: key#%s: an empty result is not a record of Do's", ErrDamaged, KeyHash(key))
	}
	body := result[1:]
	switch result[0] {
	case resultValue:
		if v, err = decodeValue[T](body, o); err != nil {
			return v, fmt.Errorf("%w: key#%s: the recorded result does not decode as a %T: %w", ErrDamaged, KeyHash(key), v, err)
		}
		return v, nil
	case resultError:
		var r recordedError
		if err := json.Unmarshal(body, &r); err != nil {
			return v, fmt.Errorf("%w: key#%s: the recorded error does not decode: %w", ErrDamaged, KeyHash(key), err)
		}
		e := &replayedError{msg: r.Error}
		if r.Unencodable {
			e.is = ErrUnencodable
		}
		for _, s := range o.Errors {
			if r.Is != "" && s.Error() == r.Is {
				e.is = s
				break
			}
		}
		return v, &PermanentError{Err: e, Replayed: true}
	}
	return v, fmt.Errorf("%w: key#%s: a result beginning with %q is not a record of Do's; idem resolve KEY --forget --force clears it (the work then runs again)", ErrDamaged, KeyHash(key), result[0])
}

// decodeValue decodes body, a result as encodeValue encoded it after its
// first byte.
func decodeValue[T any](body []byte, o *DoOptions) (v T, err error) {
	if o.Codec == nil {
		switch p := any(&v).(type) {
		case *[]byte:
			*p = body
			return v, nil
		case *string:
			*p = string(body)
			return v, nil
		}
	}
	if o.Codec != nil {
		err = o.Codec.Unmarshal(body, &v)
	} else {
		err = json.Unmarshal(body, &v)
	}
	return v, err
}

// replayedError is a recorded permanent error: its message, and the
// sentinel it matched.
type replayedError struct {
	msg string
	is  error
}

func (e *replayedError) Error() string { return e.msg }
func (e *replayedError) Unwrap() error { return e.is }
