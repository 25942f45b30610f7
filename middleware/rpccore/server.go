package rpccore

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/backoff"
)

// Handler is a front door's side of one covered call: what only the
// framework knows (the request, the handler, how an answer is sent),
// which the core asks for as it serves the call. A front door implements
// it on its own per-call value.
type Handler interface {
	// Scope names the call's tenant by the front door's Scope, which is
	// set: the core asks only when Config.Scoped. An error that IsAnswer
	// reports is the call's answer.
	Scope(ctx context.Context) (string, error)
	// Request returns the request message, for Frame.Proto.
	Request() any
	// Handle runs the call's handler with ctx (the lease's), keeps its
	// answer, and returns its error: nil for a response.
	Handle(ctx context.Context) error
	// Answered returns the metadata the handler set and, for a response,
	// its message; the core reads the rest (Frame.Status, Frame.Proto).
	Answered() Answered
	// Replay answers the call with a record: with answer, when it is set
	// (the recorded status, or the answer to a response not recorded),
	// else with m, the recorded message decoded; with r's metadata and
	// the replay marker in either case.
	Replay(ctx context.Context, r *Record, m any, answer error)
}

// Answered is a handler's answer as the core records it.
type Answered struct {
	// Header and Trailer are the metadata the handler set.
	Header, Trailer Metadata
	// Message is the response message; nil for an error.
	Message any
	// Status is the handler's error; nil for a response. The core sets
	// it, by Frame.Status.
	Status *Status
	// Name and Size are the response message's full type name and the size
	// of its encoding; the core sets them, by Frame.Proto.
	Name string
	Size int
}

// Proto is the protobuf runtime as the core uses it: the front doors
// import protobuf, the core does not, so each hands it these functions
// (messages are proto.Message values), written once in the module
// github.com/idemgo/idem/middleware/rpcproto. Append and Describe refuse a
// value that is not a protobuf message with ErrNotMessage.
type Proto struct {
	// Append appends m's encoding to b: deterministic, as the request's
	// for its fingerprint, when deterministic is set.
	Append func(b []byte, m any, deterministic bool) ([]byte, error)
	// Describe returns m's full type name and the size of its encoding.
	Describe func(m any) (name string, size int, err error)
	// Decode decodes body as a new message of the full type name, found in
	// the registry where generated code registers every type.
	Decode func(name string, body []byte) (any, error)
	// Field returns the value of m's field name, a singular string at its
	// top level (AIP-155's request_id): "" when m is no message, has no
	// such field or leaves it empty; an error when the field is no
	// singular string.
	Field func(m any, name string) (string, error)
}

// ErrNotMessage is a value given for a protobuf message that is not one.
var ErrNotMessage = errors.New("rpccore: not a protobuf message")

// call is one covered call and what the core did with it.
type call struct {
	ctx    context.Context
	method string
	key    string // the client's key
	h      Handler

	err       error // the core's answer; nil when the handler's or a replay's stands
	storeKey  string
	outcome   idem.Outcome
	layerErr  error // the idempotency layer's error, for the Observer
	handlerOK bool  // the handler ran (for a panic's event)
	takeOver  bool  // the claim took the key over from a lapsed attempt
}

// Errors reported to the Observer for calls refused before any store call.
var (
	errKeyRefused    = fmt.Errorf("%w: the call's key is missing or malformed, or its scope refused", idem.ErrInvalidKey)
	errNotMessage    = fmt.Errorf("%w: the request is not a protobuf message", idem.ErrInvalidKey)
	errRecordDamaged = fmt.Errorf("%w: the recorded response cannot be read", idem.ErrDamaged)
)

// Key checks a call's key: the value of the request's KeyField, read from
// req by Proto.Field, or where it is unset or empty, values, the call's
// values of the key's metadata. It returns the key, "" for none, or the
// answer to a malformed one (InvalidArgument, ReasonKeyInvalid), or
// Internal when KeyField is no singular string field of req.
func (s *Server) Key(ctx context.Context, req any, values []string) (string, error) {
	c := &s.c
	max := c.MaxKeyBytes
	if c.KeyField != "" {
		field, err := c.Proto.Field(req, c.KeyField)
		switch {
		case err != nil:
			return "", s.Plain(Internal, err.Error())
		case len(field) > max:
			return "", s.Answer(ctx, InvalidArgument, ReasonKeyInvalid, "the request's "+c.KeyField+" is longer than "+strconv.Itoa(max)+" bytes", "", nil)
		case field != "":
			return field, nil
		}
	}
	switch {
	case len(values) == 0:
		return "", nil
	case len(values) > 1:
		return "", s.Answer(ctx, InvalidArgument, ReasonKeyInvalid, "the call has more than one "+c.KeyName, "", nil)
	case values[0] == "":
		return "", s.Answer(ctx, InvalidArgument, ReasonKeyInvalid, "the call's "+c.KeyName+" is empty", "", nil)
	case len(values[0]) > max:
		return "", s.Answer(ctx, InvalidArgument, ReasonKeyInvalid, "the call's "+c.KeyName+" is longer than "+strconv.Itoa(max)+" bytes", "", nil)
	}
	return values[0], nil
}

// Passes reports whether a call whose Key returned key and err passes
// through to its handler untouched: no key, and none required.
func (s *Server) Passes(key string, err error) bool {
	return err == nil && key == "" && !s.c.Required
}

// Serve handles a covered call of method with the client's key (or
// keyErr, Key's error about it): it claims the key and runs h's handler
// under the lease, records its answer (per Keep) or releases the key; or
// replays the key's record through h; or waits for the call holding the
// key. It returns the core's own answer, or nil when h holds the call's
// (the handler's, or a replay). See the package documentation for every
// answer.
func (s *Server) Serve(ctx context.Context, method, key string, keyErr error, h Handler) error {
	cl := call{ctx: ctx, method: method, key: key, h: h}
	if s.c.Observer == nil {
		s.serve(&cl, keyErr)
	} else {
		s.observe(&cl, keyErr)
	}
	return cl.err
}

// observe serves cl and reports it to the Observer as one OpRequest event,
// opening it first when the Observer is an idem.Starter.
func (s *Server) observe(cl *call, keyErr error) {
	start := time.Now()
	if st, ok := s.c.Observer.(idem.Starter); ok {
		cl.ctx = st.Start(cl.ctx, idem.OpRequest)
	}
	done := false
	defer func() {
		e := idem.Event{Op: idem.OpRequest, Outcome: cl.outcome, TakeOver: cl.takeOver, Items: 1, Took: time.Since(start), Err: cl.layerErr}
		if !done {
			// A panic of the handler is its own failure, not the
			// idempotency layer's; one before it is the Scope func's.
			e.Outcome, e.Err = idem.Claimed, nil
			if !cl.handlerOK {
				e.Outcome, e.Err = 0, s.panicked
			}
		}
		if cl.storeKey != "" {
			e.KeyHash = s.c.KeyHasher.Hash(cl.storeKey)
		}
		s.c.Observer.Observe(cl.ctx, e)
	}()
	s.serve(cl, keyErr)
	done = true
}

// serve handles a covered call with its key, or the error about it.
func (s *Server) serve(cl *call, keyErr error) {
	c := &s.c
	if keyErr != nil {
		cl.err, cl.layerErr = keyErr, errKeyRefused
		return
	}
	if cl.key == "" {
		words := ""
		if c.KeyField != "" {
			words = " nor in the request's " + c.KeyField + " field"
		}
		cl.err = s.Answer(cl.ctx, InvalidArgument, ReasonKeyMissing, "the call has no idempotency key in "+s.where+words, "", nil)
		cl.layerErr = errKeyRefused
		return
	}
	scope, err := "", error(nil) // SingleTenant: one scope
	if c.Scoped {
		if scope, err = cl.h.Scope(cl.ctx); err == nil && scope == "" {
			// Every call without a principal would share one scope, and
			// replay each other's responses.
			err = errors.New(c.Pkg + ": Scope returned an empty scope")
		}
	}
	if err != nil {
		if !c.IsAnswer(err) {
			err = s.Answer(cl.ctx, Unauthenticated, ReasonKeyInvalid, "the call's tenant could not be determined", "", err)
		}
		cl.err, cl.layerErr = err, errKeyRefused
		return
	}
	req := cl.h.Request()
	fp, err := fingerprint(cl.method, req, c.Proto.Append)
	if err != nil {
		why := "does not encode: " + err.Error()
		if errors.Is(err, ErrNotMessage) {
			why = fmt.Sprintf("is a %T, not a protobuf message; the interceptor cannot fingerprint it", req)
		}
		cl.err = s.Plain(Internal, "the request of "+cl.method+" "+why)
		cl.layerErr = errNotMessage
		return
	}
	cl.storeKey = StoreKey(scope, cl.key)
	s.lease(cl, fp)
}

// Plain returns the framework's error of code with msg, after the front
// door's name, and no details: a misconfiguration the client cannot fix.
func (s *Server) Plain(code Code, msg string) error {
	return s.c.Error(&Status{Code: code, Message: s.c.Pkg + ": " + msg})
}

// Fingerprint is what tells two requests under one key apart: SHA-256 over
// the method (gRPC's full method name, Connect's procedure: the same
// string), a NUL (never in a method name) and request, the request
// message's deterministic protobuf encoding. Made by the server, so that
// clients in any language agree on it.
func Fingerprint(method string, request []byte) []byte {
	fp, _ := fingerprint(method, request, func(b []byte, request any, _ bool) ([]byte, error) { return append(b, request.([]byte)...), nil })
	return fp
}

// fingerprint is Fingerprint of m, encoded deterministically by enc.
func fingerprint(method string, m any, enc func(b []byte, m any, deterministic bool) ([]byte, error)) ([]byte, error) {
	bp := fpBuffers.Get().(*[]byte)
	defer fpBuffers.Put(bp)
	b := append((*bp)[:0], method...)
	b = append(b, 0)
	b, err := enc(b, m, true)
	if err != nil {
		return nil, err
	}
	if cap(b) <= 64<<10 {
		*bp = b // a huge request's buffer is not kept
	}
	sum := sha256.Sum256(b)
	return sum[:], nil
}

var fpBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// StoreKey is the key the store holds for a client's key in a scope: "g1",
// then each length-prefixed ("g15:acme3:abc"), so that no two pairs share
// a key, and none meets an HTTP middleware's ("h2...") in a shared store.
// The method is not part of it: it is in the fingerprint, so that a key
// reused on another method is a FailedPrecondition. The gRPC and Connect
// front doors share it, so that a service moving between them keeps its
// records.
func StoreKey(scope, key string) string {
	b := make([]byte, 0, 2+len(scope)+len(key)+2*4)
	b = append(b, "g1"...)
	for _, p := range [...]string{scope, key} {
		b = strconv.AppendInt(b, int64(len(p)), 10)
		b = append(b, ':')
		b = append(b, p...)
	}
	return string(b)
}

// lease claims cl's key and runs the handler under the lease; or replays;
// or waits for the holder.
func (s *Server) lease(cl *call, fp []byte) {
	ctx := cl.ctx
	poll := backoff.NewPoll(s.c.LockTimeout)
	for {
		claim, err := s.claim(ctx, cl.storeKey, fp)
		switch {
		case errors.Is(err, idem.ErrFingerprintMismatch):
			// A different request under the key is answered at once, in
			// flight or done: waiting would not make it the same request.
			cl.outcome, cl.layerErr = claim.Outcome, err
			cl.err = s.Answer(ctx, FailedPrecondition, ReasonKeyReused, "the idempotency key was used for another request (another "+s.c.Noun+" or message); use a new key for a new request", cl.key, nil)
			return
		case errors.Is(err, idem.ErrQuarantined):
			cl.layerErr = err
			cl.err = s.quarantined(cl, claim)
			return
		case err != nil:
			cl.layerErr = err
			cl.err = s.storeFailed(cl, err)
			return
		case claim.Outcome == idem.Claimed:
			cl.outcome, cl.takeOver = idem.Claimed, claim.TakeOver
			s.run(cl, claim)
			return
		case claim.Outcome == idem.Duplicate:
			cl.outcome = idem.Duplicate
			s.replay(cl, claim.Record.Result)
			return
		case poll.Expired():
			cl.outcome, cl.layerErr = idem.InProgress, idem.ErrInProgress
			cl.err = s.Answer(ctx, Aborted, ReasonKeyInFlight, "a call with this idempotency key is in flight; retry after the RetryInfo delay", cl.key, idem.ErrInProgress)
			return
		}
		// Jittered, growing waits: many retries of one key do not poll
		// the store in step.
		if !poll.Wait(ctx) {
			cl.outcome, cl.layerErr = idem.InProgress, context.Cause(ctx)
			cl.err = s.c.ContextError(ctx, ctx.Err())
			return
		}
	}
}

// claim claims key on a context detached from the call's cancellation,
// bounded by RecordTimeout: a Claim cut off by a client that hung up may
// still have been applied, and its lease, unknown to anyone, would hold the
// key for a whole LeaseTTL, answering the client's own retries Aborted.
// Once the claim is known it is released on every path.
func (s *Server) claim(ctx context.Context, key string, fp []byte) (idem.Claim, error) {
	if ctx.Err() != nil {
		return idem.Claim{}, context.Cause(ctx)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.c.RecordTimeout)
	defer cancel()
	return s.c.Store.Claim(cctx, key, fp)
}

// storeFailed answers a failed Claim: InvalidArgument for a key the store
// refuses, the context's code when the caller is gone, Unavailable (fail
// closed) for anything else.
func (s *Server) storeFailed(cl *call, err error) error {
	switch {
	case errors.Is(err, idem.ErrInvalidKey):
		return s.Answer(cl.ctx, InvalidArgument, ReasonKeyInvalid, "the idempotency key is too long for the store", "", err)
	case cl.ctx.Err() != nil:
		return s.c.ContextError(cl.ctx, cl.ctx.Err())
	}
	return s.Answer(cl.ctx, Unavailable, ReasonStoreUnavailable, "the idempotency store is unavailable; the call was not run", "", err)
}

// run runs the handler under claim's lease, with the take-over in its
// context when claim took the key over, then records its answer or
// releases the key.
func (s *Server) run(cl *call, claim idem.Claim) {
	l := claim.Lease
	// After a crash, the handler is told: idem.TakeOverFrom(ctx).
	work, stop := idem.Hold(idem.ContextWithTakeOver(cl.ctx, idem.TakeOverOf(claim)), s.c.Store, l)
	done := false
	defer func() {
		if !done {
			// The handler panicked: release the key so that a retry does
			// the work, and let the panic go on.
			s.forget(cl.ctx, l, stop())
		}
	}()
	cl.handlerOK = true
	herr := cl.h.Handle(work)
	done = true
	end := stop() // waits for the renewals
	code := OK
	if herr != nil {
		code = s.c.Code(herr)
	}
	if !s.c.Keep(code) {
		s.forget(cl.ctx, l, end)
		return
	}
	a := cl.h.Answered()
	var err error
	if herr != nil {
		a.Status = s.c.Status(herr)
	} else if a.Name, a.Size, err = s.c.Proto.Describe(a.Message); err != nil {
		s.log(cl.ctx, s.c.Pkg+": the handler's response is not a protobuf message; not recorded, the key released", cl.storeKey, fmt.Errorf("%w: %T", err, a.Message))
		s.forget(cl.ctx, l, end)
		return
	}
	cl.layerErr = s.confirm(cl, l, end, &a)
}

// replay answers cl with a recorded answer, its metadata filtered by
// today's allowlist whatever was recorded.
func (s *Server) replay(cl *call, result []byte) {
	r, err := DecodeRecord(result, s.names)
	var answer error
	var m any
	if err == nil {
		switch {
		case r.Flags&FlagStatus != 0:
			var st *Status
			if st, err = ParseStatus(r.Body); err == nil {
				answer = s.c.Error(st)
			}
		case r.Flags&FlagOmitted != 0:
			answer = s.Answer(cl.ctx, AlreadyExists, ReasonResponseNotRecorded, "the call was done once; its response was over MaxResponseBytes and went to the first call only", cl.key, nil)
		default:
			if m, err = s.c.Proto.Decode(r.Name, r.Body); err != nil {
				err = errors.Join(ErrRecord, err)
			}
		}
	}
	if err == nil {
		cl.h.Replay(cl.ctx, r, m, answer)
		return
	}
	cl.layerErr = errRecordDamaged
	cl.err = s.Answer(cl.ctx, Internal, ReasonRecordDamaged, "the call was done, but its recorded answer cannot be read", cl.key, err)
}
