package middleware

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/backoff"
	"github.com/idemgo/idem/internal/httprecord"
	"github.com/idemgo/idem/internal/retry"
)

// maxRequestID bounds the request id recorded: the client chooses it, and
// must not be able to push the record over the store's limit.
const maxRequestID = 255

// Response headers the middleware adds to a replay.
const (
	// HeaderReplayed is "true" on every replayed response.
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderBodyOmitted is "true" on a replay of a response whose body was
	// over MaxResponseBytes: the status and allowlisted headers are the
	// recorded ones, the body is empty. The work was done once; its full
	// response was sent to the first request only.
	HeaderBodyOmitted = "Idempotent-Body-Omitted"
	// HeaderOriginalRequest is, on a replay, the Options.RequestIDHeader
	// value of the request that did the work, when one was recorded.
	HeaderOriginalRequest = "Original-Request"
)

// New returns the middleware that Options describe, or an error when they
// hold a mistake: the error names the field at fault and the value given
// (a negative duration or size, a header name that is not a token, a
// credential header in ReplayHeaders, a field that is never read, a
// MaxResponseBytes the store cannot record, ...), Store and Tx when
// neither or both are set, and Scope when neither Scope nor SingleTenant
// is set, or both.
//
// The middleware's records are the same however it is mounted: around a
// router, around a wrapper of one, inside each route, under chi's Use.
//
// The returned function is safe to call many times and its handlers are safe
// for concurrent use.
func New(o Options) (func(http.Handler) http.Handler, error) {
	c, err := o.config()
	if err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		return &handler{c: c, next: next}
	}, nil
}

type handler struct {
	c    *config
	next http.Handler
}

// ServeHTTP handles one request: everything up to the fingerprint makes no
// store call, so a malformed request never costs a round trip.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := h.c
	if !c.methods[r.Method] {
		h.next.ServeHTTP(w, r)
		return
	}
	key, p := h.clientKey(r)
	if p == nil && key == "" && !c.Required {
		h.next.ServeHTTP(w, r)
		return
	}
	if c.Observer == nil {
		h.serve(w, r, key, p)
		return
	}
	h.observe(w, r, key, p)
}

// observe serves r and reports it to the Observer as one OpRequest event,
// opening it first when the Observer is an idem.Starter.
func (h *handler) observe(w http.ResponseWriter, r *http.Request, key string, p *Problem) {
	start := time.Now()
	ctx := r.Context()
	if s, ok := h.c.Observer.(idem.Starter); ok {
		ctx = s.Start(ctx, idem.OpRequest)
	}
	var res result
	obs := new(observation)
	r = r.WithContext(context.WithValue(ctx, observationKey{}, obs))
	done := false
	defer func() {
		if !done {
			// A panic still ends the request's event. One from the
			// handler is its own failure, not the idempotency layer's,
			// as a 5xx is; one before it (a Scope, Key or Fingerprint
			// func) is reported as errPanicked.
			res = result{}
			if obs.handlerRan {
				res.outcome = idem.Claimed
			} else {
				res.err = errPanicked
			}
		}
		e := idem.Event{Op: idem.OpRequest, Outcome: res.outcome, TakeOver: res.takeOver, Items: 1, Took: time.Since(start), Err: res.err}
		if res.key != "" {
			e.KeyHash = h.c.KeyHasher.Hash(res.key)
		}
		h.c.Observer.Observe(r.Context(), e)
	}()
	res = h.serve(w, r, key, p)
	done = true
}

// handlerRuns notes, for the Observer, that r's handler runs.
func (h *handler) handlerRuns(r *http.Request) {
	if h.c.Observer != nil {
		if o, ok := r.Context().Value(observationKey{}).(*observation); ok {
			o.handlerRan = true
		}
	}
}

// result is what the Observer is told of a request: the store key, the
// claim's outcome, and the error that the idempotency layer answered with
// (nil when it did its part, whatever the handler answered).
type result struct {
	key      string
	outcome  idem.Outcome
	takeOver bool // the claim took the key over from a lapsed attempt
	err      error
}

// Errors reported to the Observer for requests refused before any store
// call, sorted by idem.Event.Class as invalid input.
var (
	errKeyRefused    = fmt.Errorf("%w: the request's key is missing or malformed, or its scope refused", idem.ErrInvalidKey)
	errBodyRefused   = fmt.Errorf("%w: the request's body is too large or unreadable", idem.ErrTooLarge)
	errRecordDamaged = fmt.Errorf("%w: the recorded response cannot be read", idem.ErrDamaged)
	// errPanicked is reported for a request whose Scope, Key or
	// Fingerprint func panicked.
	errPanicked = errors.New("middleware: an option's func panicked")
	// errEmptyScope is a Scope func's "" without an error.
	errEmptyScope = errors.New("middleware: Scope returned an empty scope")
)

// serve handles a request the middleware covers, with its key (or the
// problem with it).
func (h *handler) serve(w http.ResponseWriter, r *http.Request, key string, p *Problem) result {
	c := h.c
	if p != nil {
		h.fail(w, r, p)
		return result{err: errKeyRefused}
	}
	if key == "" {
		h.fail(w, r, problem(kindKeyMissing, "", nil))
		return result{err: errKeyRefused}
	}
	var scope string
	if c.Scope != nil {
		var err error
		if scope, err = c.Scope(r); err == nil && scope == "" {
			// Every request without a principal would share one scope,
			// and replay each other's responses.
			err = errEmptyScope
		}
		if err != nil {
			h.fail(w, r, problem(kindScopeInvalid, "", err))
			return result{err: errKeyRefused}
		}
	}
	var body *spool
	var err error
	if r.ContentLength > c.MaxBodyBytes {
		err = errBodyTooLarge // known without reading it
	} else {
		body, err = readBody(r.Body, c.MaxBodyBytes)
	}
	if errors.Is(err, errBodyTooLarge) {
		h.fail(w, r, problem(kindBodyTooLarge, "The request body exceeds "+strconv.FormatInt(c.MaxBodyBytes, 10)+" bytes.", err))
		return result{err: errBodyRefused}
	}
	if err != nil {
		h.fail(w, r, problem(kindBodyUnreadable, "", err))
		return result{err: errBodyRefused}
	}
	defer body.Close()
	var fp []byte
	if c.Fingerprint != nil {
		if fp, err = c.Fingerprint(r, body.Reader()); err == nil {
			fp = withEndpoint(r, fp)
		}
	} else {
		fp, err = fingerprint(r, body.Reader)
	}
	if err != nil {
		h.fail(w, r, problem(kindBodyUnreadable, "", err))
		return result{err: errBodyRefused}
	}
	sk := storeKey(scope, key)
	var res result
	if c.Tx != nil {
		res = h.serveTx(w, r, key, sk, fp, body)
	} else {
		res = h.serveLease(w, r, key, sk, fp, body)
	}
	res.key = sk
	return res
}

// clientKey returns the request's key ("" for none) or the problem with it.
func (h *handler) clientKey(r *http.Request) (string, *Problem) {
	if h.c.Key == nil {
		k, err := headerKey(r.Header, h.c.Header, h.c.MaxKeyBytes)
		if err != nil {
			return "", keyProblem(kindKeyInvalid, "", "The "+h.c.Header+" header is invalid: "+err.Error()+".", err)
		}
		return k, nil
	}
	k, err := h.c.Key(r)
	if err != nil {
		return "", keyProblem(kindKeyInvalid, "", "", err)
	}
	if len(k) > h.c.MaxKeyBytes {
		return "", keyProblem(kindKeyInvalid, "", "The key is too long.", errKeyTooLong)
	}
	return k, nil
}

// serveLease is lease mode: claim, and run the handler under the lease;
// or replay; or wait for the holder.
func (h *handler) serveLease(w http.ResponseWriter, r *http.Request, key, sk string, fp []byte, body *spool) result {
	store := h.c.Store
	poll := backoff.NewPoll(h.c.LockTimeout)
	for {
		cl, err := store.Claim(r.Context(), sk, fp)
		// A different request under the key is answered at once, in flight
		// or done: waiting would not make it the same request.
		if errors.Is(err, idem.ErrFingerprintMismatch) {
			h.fail(w, r, keyProblem(kindFingerprintMismatch, key, "", nil))
			return result{outcome: cl.Outcome, err: err}
		}
		if err != nil {
			h.storeFailed(w, r, key, err)
			return result{err: err}
		}
		if cl.Outcome == idem.Claimed {
			return result{outcome: idem.Claimed, takeOver: cl.TakeOver, err: h.run(w, r, cl, body)}
		}
		if cl.Outcome == idem.Duplicate {
			return result{outcome: idem.Duplicate, err: h.replay(w, r, cl.Record.Result)}
		}
		if poll.Expired() {
			h.inProgress(w, r, key)
			return result{outcome: idem.InProgress, err: idem.ErrInProgress}
		}
		if !poll.Wait(r.Context()) {
			// The client is gone: nobody to answer.
			return result{outcome: idem.InProgress, err: context.Cause(r.Context())}
		}
	}
}

// run runs the handler under cl's lease, with the take-over in its
// context when cl took the key over, then records and sends its response,
// or releases the key. It returns the error of a response that could not
// be recorded.
func (h *handler) run(w http.ResponseWriter, r *http.Request, cl idem.Claim, body *spool) error {
	l := cl.Lease
	rec := newRecorder(h.c.MaxResponseBytes)
	work, stop := idem.Hold(idem.ContextWithTakeOver(r.Context(), idem.TakeOverOf(cl)), h.c.Store, l)
	defer rec.body.Close()
	done := false
	defer func() {
		if !done {
			// The handler panicked: release the key so that a retry does
			// the work, and let the panic go on.
			h.forget(r, l, stop())
		}
	}()
	h.handlerRuns(r)
	r2 := r.WithContext(work) // carries l (idem.LeaseFrom) and the take-over (idem.TakeOverFrom)
	r2.Body = spoolBody{body.Reader()}
	h.next.ServeHTTP(rec, r2)
	done = true
	end := stop() // waits for the renewals
	rec.finish()
	if !h.c.Keep(rec.status) {
		h.forget(r, l, end)
		rec.send(w)
		return nil
	}
	err := h.confirm(r, l, end, rec)
	rec.send(w)
	return err
}

// confirm records rec as l's result, on a context detached from the
// request, retrying within RecordTimeout and the lease, which ends at end.
// A result the store finds too large is recorded again without its body:
// the work is done, and must be recorded as done whatever its size. It
// returns the last error when no Confirm succeeded.
func (h *handler) confirm(r *http.Request, l *idem.Lease, end time.Time, rec *recorder) error {
	resp := h.response(r, rec)
	result := h.encode(resp)
	err := h.record(r, end, func(ctx context.Context) error {
		err := h.c.Store.Confirm(ctx, l, result)
		if errors.Is(err, idem.ErrTooLarge) && !resp.BodyOmitted {
			resp.Body, resp.BodyOmitted = nil, true
			result = httprecord.Encode(resp)
			err = h.c.Store.Confirm(ctx, l, result)
		}
		return err
	})
	if errors.Is(err, idem.ErrAlreadyConfirmed) {
		// Another request's response is the one replayed from now on; this
		// one did the work too, which an operator must hear of, but it is
		// done and its client gets its own response.
		h.log(r, "middleware: the work was done twice: another request under the key was recorded first", l.Key, err)
		return nil
	}
	if err != nil {
		// The response still goes out: the work was done, and a client
		// told otherwise would retry it once the lease runs out.
		h.log(r, "middleware: the response could not be recorded; a retry after the lease may run the handler again", l.Key, err)
	}
	return err
}

// forget releases l on a context detached from the request, retrying
// within RecordTimeout and the lease, which ends at end.
func (h *handler) forget(r *http.Request, l *idem.Lease, end time.Time) {
	err := h.record(r, end, func(ctx context.Context) error { return h.c.Store.Forget(ctx, l) })
	if err != nil && !errors.Is(err, idem.ErrLeaseLost) {
		h.log(r, "middleware: the key could not be released; retries wait for the lease to run out", l.Key, err)
	}
}

// record runs op, a Confirm or Forget of a lease that ends at end, on a
// context detached from the request, retrying until RecordTimeout or the
// lease's end, whichever is first. Past the lease's end a retry can only
// find the lease lost, or another request's: retrying on held the response
// for nothing (#17: 10.2 s, the whole RecordTimeout, during a store
// outage). A lease already over gets one attempt.
func (h *handler) record(r *http.Request, end time.Time, op func(context.Context) error) error {
	now := time.Now()
	over := !end.After(now)
	deadline := now.Add(h.c.RecordTimeout)
	if !over && end.Before(deadline) {
		deadline = end
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(r.Context()), deadline)
	defer cancel()
	if over {
		return op(ctx)
	}
	return retry.Do(ctx, op)
}

// response is what of rec, the response to r, is recorded: the
// allowlisted headers, the body unless it is over MaxResponseBytes, and
// r's request id.
func (h *handler) response(r *http.Request, rec *recorder) *httprecord.Response {
	resp := &httprecord.Response{Status: rec.status, Header: make(http.Header, len(h.c.replay))}
	if h.c.RequestIDHeader != "" {
		if id := r.Header.Get(h.c.RequestIDHeader); len(id) <= maxRequestID {
			resp.RequestID = id
		}
	}
	for _, k := range h.c.replay {
		if vs := rec.header[k]; len(vs) > 0 {
			resp.Header[k] = vs
		}
	}
	if rec.body.size > int64(h.c.MaxResponseBytes) {
		resp.BodyOmitted = true
	} else {
		resp.Body = rec.body.mem.Bytes() // the spool holds MaxResponseBytes in memory
	}
	return resp
}

// encode encodes resp for the store, without its body when the whole
// would be over the store's MaxResultBytes: replayed headers over
// RecordOverhead take the body's room, and the work must be recorded as
// done whatever the size of its answer.
func (h *handler) encode(resp *httprecord.Response) []byte {
	b := httprecord.Encode(resp)
	if h.c.maxResult > 0 && len(b) > h.c.maxResult && !resp.BodyOmitted {
		resp.Body, resp.BodyOmitted = nil, true
		b = httprecord.Encode(resp)
	}
	return b
}

// replay answers with a recorded response, its headers filtered by
// today's allowlist whatever was recorded. It returns an error when the
// record cannot be read.
func (h *handler) replay(w http.ResponseWriter, r *http.Request, result []byte) error {
	dst := w.Header()
	status, omitted, body, err := httprecord.Walk(result, func(k, v []byte) {
		if string(k) == httprecord.LineRequestID {
			dst[HeaderOriginalRequest] = []string{string(v)}
			return
		}
		for _, name := range h.c.replay {
			if name == string(k) { // compared without a copy
				dst[name] = append(dst[name], string(v))
				return
			}
		}
	})
	if err != nil {
		h.fail(w, r, problem(kindRecordDamaged, "", err))
		return errRecordDamaged
	}
	// Shared, never modified: net/http only reads header values.
	dst[HeaderReplayed] = headerTrue
	if omitted {
		dst[HeaderBodyOmitted] = headerTrue
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
	return nil
}

var headerTrue = []string{"true"}

// inProgress answers 409 with Options.RetryAfter: not the holder's lease
// end, which KeepAlive keeps a whole LeaseTTL ahead while the holder is
// likely to finish far sooner (#17: a client told 30s waited 28s for
// nothing).
func (h *handler) inProgress(w http.ResponseWriter, r *http.Request, key string) {
	w.Header().Set("Retry-After", h.c.retryAfter)
	h.fail(w, r, keyProblem(kindInProgress, key, "", idem.ErrInProgress))
}

// storeFailed answers a failed Claim or Run: 400 for a key the store
// refuses, 423 for a quarantined key, 503 (fail closed) for anything else,
// nothing when the client is gone.
func (h *handler) storeFailed(w http.ResponseWriter, r *http.Request, key string, err error) {
	switch {
	case errors.Is(err, idem.ErrInvalidKey):
		h.fail(w, r, keyProblem(kindKeyInvalid, key, "The key is too long.", err))
	case errors.Is(err, idem.ErrQuarantined):
		h.fail(w, r, keyProblem(kindQuarantined, key, "", err))
	case r.Context().Err() != nil:
	default:
		w.Header().Set("Retry-After", h.c.retryAfter)
		h.fail(w, r, problem(kindStoreUnavailable, "", err))
	}
}

// fail names p's occurrence, logs it and hands it to the Error hook.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, p *Problem) {
	p.Instance = "urn:uuid:" + uuid.NewString()
	if h.c.Observer != nil {
		if o, ok := r.Context().Value(observationKey{}).(*observation); ok {
			o.instance = p.Instance
		}
	}
	if h.c.Logger != nil {
		// A client error is routine; the operator's attention goes to
		// the service's own failures.
		level := slog.LevelInfo
		if p.Status >= 500 {
			level = slog.LevelError
		}
		attrs := []slog.Attr{slog.String("instance", p.Instance), slog.String("type", p.Type), slog.Int("status", p.Status)}
		if p.Err != nil {
			attrs = append(attrs, slog.Any("err", p.Err))
		}
		h.c.Logger.LogAttrs(r.Context(), level, "middleware: answered "+p.Title, attrs...)
	}
	h.c.Error(w, r, p)
}

func (h *handler) log(r *http.Request, msg, key string, err error) {
	if h.c.Logger != nil {
		h.c.Logger.ErrorContext(r.Context(), msg, "key_hash", h.c.KeyHasher.Hash(key), "err", err)
	}
}
