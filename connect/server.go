package idemconnect

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/rpccode"
)

// Headers the interceptor adds to a replay, the gRPC module's metadata.
const (
	// HeaderReplayed is "true" on every replayed answer.
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderResponseOmitted is "true" on the replay of a call whose
	// response was over MaxResponseBytes: the work was done once, its
	// response went to the first call only.
	HeaderResponseOmitted = "Idempotent-Response-Omitted"
)

// ErrorDomain is the Domain of the errdetails.ErrorInfo in every error the
// interceptor answers with; its Reason is one of the Reason constants.
const ErrorDomain = "idem"

// Reasons of the errdetails.ErrorInfo of the interceptor's answers, the
// gRPC module's. Every answer carries one; those about a well-formed key
// also carry it, in Metadata["idempotency_key"].
const (
	// ReasonKeyMissing: InvalidArgument, a covered call without a key
	// under ServerOptions.Required.
	ReasonKeyMissing = "IDEMPOTENCY_KEY_MISSING"
	// ReasonKeyInvalid: InvalidArgument, a key empty, repeated, too long,
	// or refused by the store; Unauthenticated, a scope refused.
	ReasonKeyInvalid = "IDEMPOTENCY_KEY_INVALID"
	// ReasonKeyReused: FailedPrecondition, the key was used for another
	// request (another procedure or another message), done or in flight.
	ReasonKeyReused = "IDEMPOTENCY_KEY_REUSED"
	// ReasonKeyInFlight: Aborted with RetryInfo, a call of the same key is
	// running and did not finish within LockTimeout.
	ReasonKeyInFlight = "IDEMPOTENCY_KEY_IN_FLIGHT"
	// ReasonStoreUnavailable: Unavailable with RetryInfo, the store failed;
	// the handler did not run.
	ReasonStoreUnavailable = "IDEMPOTENCY_STORE_UNAVAILABLE"
	// ReasonRecordDamaged: Internal, the work was done but its record does
	// not decode.
	ReasonRecordDamaged = "IDEMPOTENCY_RECORD_DAMAGED"
	// ReasonResponseNotRecorded: AlreadyExists, on the replay of a call
	// whose response was over MaxResponseBytes: the work was done once.
	ReasonResponseNotRecorded = "IDEMPOTENCY_RESPONSE_NOT_RECORDED"
	// ReasonStreamNotCovered: Unimplemented, a streaming call carrying a
	// key: streams are not covered, and doing the work without the key's
	// protection would break the promise the key makes.
	ReasonStreamNotCovered = "IDEMPOTENCY_STREAM_NOT_COVERED"
)

// DefaultKeep is the default ServerOptions.Keep: it keeps a success (code
// 0) and InvalidArgument, no other code. The rules are the gRPC module's,
// stated once by [github.com/idemgo/idem/rpccode.Keep], whose
// documentation gives each code and why.
//
// A Keep that extends it: func(c connect.Code) bool { return c == connect.CodeAlreadyExists || idemconnect.DefaultKeep(c) }.
func DefaultKeep(c connect.Code) bool { return rpccode.Keep(c) }

// Server is the server interceptor, a connect.Interceptor: give it to a
// handler with connect.WithInterceptors. Its unary calls are covered; a
// streaming call carrying a key is refused; a client's calls pass
// through. Create it with NewServer; it is safe for concurrent use.
type Server struct {
	c *serverConfig
}

var _ connect.Interceptor = (*Server)(nil)

// NewServer returns the interceptor that ServerOptions describe, or an
// error when they hold a mistake: the error names the field at fault and
// the value given (a nil Store, a negative duration or size, a header
// that is the protocols' own or not a token, a credential in
// ReplayHeaders, a procedure that is not /package.Service/Method, a
// MaxResponseBytes the store cannot record), and Scope when neither Scope
// nor SingleTenant is set, or both.
func NewServer(o ServerOptions) (*Server, error) {
	c, err := o.config()
	if err != nil {
		return nil, err
	}
	return &Server{c: c}, nil
}

// covers reports whether a call of spec is the interceptor's: a unary
// handler's call of a covered procedure that may have side effects.
func (s *Server) covers(spec connect.Spec) bool {
	return !spec.IsClient && spec.StreamType == connect.StreamTypeUnary &&
		spec.IdempotencyLevel != connect.IdempotencyNoSideEffects &&
		(s.c.procedures == nil || s.c.procedures[spec.Procedure])
}

// WrapUnary handles one unary call: with a key, the first call of the key
// runs the handler and its answer is recorded (per Keep); a retry of the
// same request gets the recorded answer with HeaderReplayed: true. See
// the package documentation for every answer.
func (s *Server) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if !s.covers(req.Spec()) {
			return next(ctx, req)
		}
		key, keyErr := s.clientKey(ctx, req)
		if keyErr == nil && key == "" && !s.c.Required {
			return next(ctx, req)
		}
		cl := &call{ctx: ctx, req: req, next: next, key: key}
		if s.c.Observer == nil {
			s.serve(cl, keyErr)
		} else {
			s.observe(cl, keyErr)
		}
		if cl.err != nil {
			return nil, cl.err
		}
		return cl.resp, nil
	}
}

// WrapStreamingClient passes a client's streams through: the interceptor
// covers handlers.
func (s *Server) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler passes a streaming call through unless it carries
// a key in ServerOptions.Header (and its procedure is listed, when
// Procedures are): such a call is answered Unimplemented
// (ReasonStreamNotCovered), since a stream's messages cannot be recorded
// and replayed as one answer, and running it unprotected would break the
// promise its key makes.
func (s *Server) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		spec := conn.Spec()
		if (s.c.procedures != nil && !s.c.procedures[spec.Procedure]) || len(conn.RequestHeader().Values(s.c.Header)) == 0 {
			return next(ctx, conn)
		}
		return s.answer(ctx, connect.CodeUnimplemented, ReasonStreamNotCovered, "streaming calls are not covered by the idempotency interceptor; send this call without "+s.c.Header, "", nil)
	}
}

// call is one covered unary call and what the interceptor did with it.
type call struct {
	ctx  context.Context
	req  connect.AnyRequest
	next connect.UnaryFunc
	key  string // the client's key

	resp connect.AnyResponse
	err  error

	header, trailer http.Header // what the handler set, by every means

	storeKey  string
	outcome   idem.Outcome
	layerErr  error // the idempotency layer's error, for the Observer
	handlerOK bool  // the handler ran (for a panic's event)
}

// Errors reported to the Observer for calls refused before any store call.
var (
	errKeyRefused    = fmt.Errorf("%w: the call's key is missing or malformed, or its scope refused", idem.ErrInvalidKey)
	errNotMessage    = fmt.Errorf("%w: the request is not a protobuf message", idem.ErrInvalidKey)
	errRecordDamaged = fmt.Errorf("%w: the recorded response cannot be read", idem.ErrDamaged)
	errPanicked      = errors.New("idemconnect: a Scope func panicked")
)

// observe serves cl and reports it to the Observer as one OpRequest event,
// opening it first when the Observer is an idem.Starter.
func (s *Server) observe(cl *call, keyErr error) {
	start := time.Now()
	if st, ok := s.c.Observer.(idem.Starter); ok {
		cl.ctx = st.Start(cl.ctx, idem.OpRequest)
	}
	done := false
	defer func() {
		e := idem.Event{Op: idem.OpRequest, Outcome: cl.outcome, Items: 1, Took: time.Since(start), Err: cl.layerErr}
		if !done {
			// A panic of the handler is its own failure, not the
			// idempotency layer's; one before it is the Scope func's.
			e.Outcome, e.Err = idem.Claimed, nil
			if !cl.handlerOK {
				e.Outcome, e.Err = 0, errPanicked
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
	c := s.c
	if keyErr != nil {
		cl.err, cl.layerErr = keyErr, errKeyRefused
		return
	}
	if cl.key == "" {
		cl.err = s.answer(cl.ctx, connect.CodeInvalidArgument, ReasonKeyMissing, "the call has no idempotency key in its "+c.Header+" header"+s.fieldWords(), "", nil)
		cl.layerErr = errKeyRefused
		return
	}
	var scope string
	if c.Scope != nil {
		var err error
		if scope, err = c.Scope(cl.ctx, cl.req); err == nil && scope == "" {
			// Every call without a principal would share one scope, and
			// replay each other's responses.
			err = errors.New("idemconnect: Scope returned an empty scope")
		}
		if err != nil {
			if ce := (*connect.Error)(nil); !errors.As(err, &ce) {
				err = s.answer(cl.ctx, connect.CodeUnauthenticated, ReasonKeyInvalid, "the call's tenant could not be determined", "", err)
			}
			cl.err, cl.layerErr = err, errKeyRefused
			return
		}
	}
	m, ok := cl.req.Any().(proto.Message)
	if !ok {
		cl.err = connect.NewError(connect.CodeInternal, fmt.Errorf("idemconnect: the request of %s is a %T, not a protobuf message; the interceptor cannot fingerprint it", cl.req.Spec().Procedure, cl.req.Any()))
		cl.layerErr = errNotMessage
		return
	}
	fp, err := fingerprint(cl.req.Spec().Procedure, m)
	if err != nil {
		cl.err = connect.NewError(connect.CodeInternal, fmt.Errorf("idemconnect: the request of %s does not encode: %v", cl.req.Spec().Procedure, err))
		cl.layerErr = errNotMessage
		return
	}
	cl.storeKey = storeKey(scope, cl.key)
	s.lease(cl, fp)
}

func (s *Server) fieldWords() string {
	if s.c.KeyField == "" {
		return ""
	}
	return " nor in the request's " + s.c.KeyField + " field"
}

// lease claims cl's key and runs the handler under the lease; or replays;
// or waits for the holder.
func (s *Server) lease(cl *call, fp []byte) {
	ctx := cl.ctx
	deadline := time.Now().Add(s.c.LockTimeout)
	wait := 10 * time.Millisecond
	for {
		claim, err := s.claim(ctx, cl.storeKey, fp)
		// A different request under the key is answered at once, in
		// flight or done: waiting would not make it the same request.
		if errors.Is(err, idem.ErrFingerprintMismatch) {
			cl.outcome, cl.layerErr = claim.Outcome, err
			cl.err = s.answer(ctx, connect.CodeFailedPrecondition, ReasonKeyReused, "the idempotency key was used for another request (another procedure or message); use a new key for a new request", cl.key, nil)
			return
		}
		if err != nil {
			cl.layerErr = err
			cl.err = s.storeFailed(cl, err)
			return
		}
		switch claim.Outcome {
		case idem.Claimed:
			cl.outcome = idem.Claimed
			s.run(cl, claim.Lease)
			return
		case idem.Duplicate:
			cl.outcome = idem.Duplicate
			s.replay(cl, claim.Record.Result)
			return
		}
		left := time.Until(deadline)
		if left <= 0 {
			cl.outcome, cl.layerErr = idem.InProgress, idem.ErrInProgress
			cl.err = s.answer(ctx, connect.CodeAborted, ReasonKeyInFlight, "a call with this idempotency key is in flight; retry after the RetryInfo delay", cl.key, idem.ErrInProgress)
			return
		}
		// Jittered, growing waits: many retries of one key do not poll
		// the store in step.
		d := min(wait/2+rand.N(wait), left)
		wait = min(2*wait, 250*time.Millisecond)
		if !sleep(ctx, d) {
			cl.outcome, cl.layerErr = idem.InProgress, context.Cause(ctx)
			cl.err = contextError(ctx)
			return
		}
	}
}

// contextError is the answer to a call whose context ended.
func contextError(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
	}
	return connect.NewError(connect.CodeCanceled, ctx.Err())
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
		return s.answer(cl.ctx, connect.CodeInvalidArgument, ReasonKeyInvalid, "the idempotency key is too long for the store", "", err)
	case cl.ctx.Err() != nil:
		return contextError(cl.ctx)
	}
	return s.answer(cl.ctx, connect.CodeUnavailable, ReasonStoreUnavailable, "the idempotency store is unavailable; the call was not run", "", err)
}

// run runs the handler under l, then records its answer or releases the
// key.
func (s *Server) run(cl *call, l *idem.Lease) {
	work, stop := idem.Hold(cl.ctx, s.c.Store, l)
	done := false
	defer func() {
		if !done {
			// The handler panicked: release the key so that a retry does
			// the work, and let the panic go on.
			s.forget(cl.ctx, l, stop())
		}
	}()
	cl.handlerOK = true
	cl.resp, cl.err = cl.next(work, cl.req)
	done = true
	end := stop() // waits for the renewals
	var code connect.Code
	if cl.err != nil {
		code = connect.CodeOf(cl.err)
	}
	if !s.c.Keep(code) {
		s.forget(cl.ctx, l, end)
		return
	}
	cl.header, cl.trailer = answered(work, cl.resp, cl.err)
	rec, ok := s.encode(cl, false)
	if !ok {
		s.forget(cl.ctx, l, end)
		return
	}
	cl.layerErr = s.confirm(cl, l, end, rec)
}

// encode encodes cl's answer for the store; without the response message
// when omit is set, when it is over MaxResponseBytes, or when the whole
// would be over the store's MaxResultBytes. It reports false for an answer
// it cannot record: a response that is not a protobuf message.
func (s *Server) encode(cl *call, omit bool) ([]byte, bool) {
	if cl.err != nil {
		ce := new(connect.Error)
		if !errors.As(cl.err, &ce) {
			ce = connect.NewError(connect.CodeOf(cl.err), cl.err)
		}
		b := encodeRecord(flagStatus, cl.header, cl.trailer, s.c.replay, "", encodeStatus(ce.Code(), ce.Message(), ce.Details()))
		if s.c.maxResult > 0 && len(b) > s.c.maxResult {
			// Details too large to record: the code and message still
			// say what the same request will be answered.
			b = encodeRecord(flagStatus, cl.header, cl.trailer, s.c.replay, "", encodeStatus(ce.Code(), ce.Message(), nil))
		}
		return b, true
	}
	if cl.resp == nil {
		return nil, false
	}
	m, ok := cl.resp.Any().(proto.Message)
	if !ok {
		s.log(cl.ctx, "idemconnect: the handler's response is not a protobuf message; not recorded, the key released", cl.storeKey, fmt.Errorf("%T", cl.resp.Any()))
		return nil, false
	}
	header, trailer := cl.header, cl.trailer
	name := m.ProtoReflect().Descriptor().FullName()
	if !omit && proto.Size(m) <= s.c.MaxResponseBytes {
		if body, err := proto.Marshal(m); err == nil {
			b := encodeRecord(0, header, trailer, s.c.replay, name, body)
			if s.c.maxResult == 0 || len(b) <= s.c.maxResult {
				return b, true
			}
		}
	}
	return encodeRecord(flagOmitted, header, trailer, s.c.replay, name, nil), true
}

// answered returns the headers and trailers a handler answered with, by
// every means Connect gives it: the response's (or, for an error, its
// Meta), and the handler context's call info (connect.CallInfoForHandlerContext,
// which the simple handler API writes to).
func answered(ctx context.Context, resp connect.AnyResponse, err error) (header, trailer http.Header) {
	header, trailer = http.Header{}, http.Header{}
	if info, ok := connect.CallInfoForHandlerContext(ctx); ok {
		add(header, info.ResponseHeader())
		add(trailer, info.ResponseTrailer())
	}
	if ce := new(connect.Error); errors.As(err, &ce) {
		add(header, ce.Meta())
	} else if err == nil && resp != nil {
		add(header, resp.Header())
		add(trailer, resp.Trailer())
	}
	return header, trailer
}

func add(dst, src http.Header) {
	for k, vs := range src {
		dst[k] = append(dst[k], vs...)
	}
}

// confirm records rec as l's result, on a context detached from the call,
// retrying within RecordTimeout and the lease, which ends at end. A
// result the store finds too large is recorded again without the
// message: the work is done, and must be recorded as done whatever its
// size. It returns the last error when no Confirm succeeded.
func (s *Server) confirm(cl *call, l *idem.Lease, end time.Time, rec []byte) error {
	err := s.record(cl.ctx, end, func(ctx context.Context) error {
		err := s.c.Store.Confirm(ctx, l, rec)
		if errors.Is(err, idem.ErrTooLarge) && cl.err == nil && rec[1]&flagOmitted == 0 {
			rec, _ = s.encode(cl, true)
			err = s.c.Store.Confirm(ctx, l, rec)
		}
		return err
	})
	if errors.Is(err, idem.ErrAlreadyConfirmed) {
		// Another call's answer is the one replayed from now on; this one
		// did the work too, which an operator must hear of, but it is done
		// and its client gets its own answer.
		s.log(cl.ctx, "idemconnect: the work was done twice: another call under the key was recorded first", l.Key, err)
		return nil
	}
	if err != nil {
		// The answer still goes out: the work was done, and a client told
		// otherwise would retry it once the lease runs out.
		s.log(cl.ctx, "idemconnect: the answer could not be recorded; a retry after the lease may run the handler again", l.Key, err)
	}
	return err
}

// forget releases l on a context detached from the call, retrying within
// RecordTimeout and the lease, which ends at end.
func (s *Server) forget(ctx context.Context, l *idem.Lease, end time.Time) {
	err := s.record(ctx, end, func(ctx context.Context) error { return s.c.Store.Forget(ctx, l) })
	if err != nil && !errors.Is(err, idem.ErrLeaseLost) {
		s.log(ctx, "idemconnect: the key could not be released; retries wait for the lease to run out", l.Key, err)
	}
}

// record runs op, a Confirm or Forget of a lease that ends at end, on a
// context detached from the call, retrying until RecordTimeout or the
// lease's end, whichever is first: past the lease's end a retry can only
// find the lease lost, or another call's. A lease already over gets one
// attempt.
func (s *Server) record(ctx context.Context, end time.Time, op func(context.Context) error) error {
	now := time.Now()
	over := !end.After(now)
	deadline := now.Add(s.c.RecordTimeout)
	if !over && end.Before(deadline) {
		deadline = end
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	wait := 5 * time.Millisecond
	for {
		err := op(ctx)
		if err == nil || over || permanent(err) {
			return err
		}
		if !sleep(ctx, wait/2+rand.N(wait)) {
			return errors.Join(err, ctx.Err())
		}
		wait = min(2*wait, 250*time.Millisecond)
	}
}

// permanent reports store errors that no retry fixes.
func permanent(err error) bool {
	for _, p := range [...]error{idem.ErrInvalidKey, idem.ErrTooLarge, idem.ErrInvalidLease, idem.ErrDamaged,
		idem.ErrLeaseLost, idem.ErrFingerprintMismatch, idem.ErrAlreadyConfirmed} {
		if errors.Is(err, p) {
			return true
		}
	}
	return false
}

// replayed is a recorded response message as a handler's response: the
// message of the recorded type, which the protocols' codecs encode as
// they would the handler's own (it is a proto.Message by the one it
// holds).
type replayed struct{ proto.Message }

// replay answers cl with a recorded answer, its headers filtered by
// today's allowlist whatever was recorded.
func (s *Server) replay(cl *call, result []byte) {
	r, err := decodeRecord(result, s.c.replay)
	var (
		m  proto.Message
		ce *connect.Error
	)
	if err == nil {
		switch {
		case r.flags&flagStatus != 0:
			ce, err = r.status()
		case r.flags&flagOmitted == 0:
			m, err = r.message()
		}
	}
	if err != nil {
		cl.layerErr = errRecordDamaged
		cl.err = s.answer(cl.ctx, connect.CodeInternal, ReasonRecordDamaged, "the call was done, but its recorded answer cannot be read", cl.key, err)
		return
	}
	var header, trailer http.Header
	switch {
	case ce != nil:
		cl.err = ce
		header, trailer = ce.Meta(), ce.Meta()
	case m == nil:
		ae := s.answer(cl.ctx, connect.CodeAlreadyExists, ReasonResponseNotRecorded, "the call was done once; its response was over MaxResponseBytes and went to the first call only", cl.key, nil)
		ae.Meta().Set(HeaderResponseOmitted, "true")
		cl.err = ae
		header, trailer = ae.Meta(), ae.Meta()
	default:
		resp := connect.NewResponse(&replayed{m})
		cl.resp = resp
		header, trailer = resp.Header(), resp.Trailer()
	}
	header.Set(HeaderReplayed, "true")
	for k, vs := range r.header {
		header[k] = append(header[k], vs...)
	}
	for k, vs := range r.trailer {
		trailer[k] = append(trailer[k], vs...)
	}
}

// answer builds the interceptor's error answer: code, a message that never
// carries internal error text, and an ErrorInfo (the key in its Metadata
// when given) and, for a retryable code, a RetryInfo. It logs it with
// cause.
func (s *Server) answer(ctx context.Context, code connect.Code, reason, msg, key string, cause error) *connect.Error {
	e := connect.NewError(code, errors.New("idemconnect: "+msg))
	info := &errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}
	if key != "" {
		info.Metadata = map[string]string{"idempotency_key": key}
	}
	if d, err := connect.NewErrorDetail(info); err == nil {
		e.AddDetail(d)
	}
	if code == connect.CodeAborted || code == connect.CodeUnavailable {
		if d, err := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(s.c.RetryDelay)}); err == nil {
			e.AddDetail(d)
		}
	}
	if s.c.Logger != nil {
		// A client error is routine; the operator's attention goes to the
		// service's own failures.
		level := slog.LevelInfo
		if code == connect.CodeUnavailable || code == connect.CodeInternal {
			level = slog.LevelError
		}
		attrs := []slog.Attr{slog.String("code", code.String()), slog.String("reason", reason)}
		if cause != nil {
			attrs = append(attrs, slog.Any("err", cause))
		}
		s.c.Logger.LogAttrs(ctx, level, "idemconnect: answered "+code.String(), attrs...)
	}
	return e
}

func (s *Server) log(ctx context.Context, msg, key string, err error) {
	if s.c.Logger != nil {
		s.c.Logger.ErrorContext(ctx, msg, "key_hash", s.c.KeyHasher.Hash(key), "err", err)
	}
}

// clientKey returns the call's key ("" for none), or the error answering a
// malformed one.
func (s *Server) clientKey(ctx context.Context, req connect.AnyRequest) (string, error) {
	c := s.c
	if c.KeyField != "" {
		if m, ok := req.Any().(proto.Message); ok {
			r := m.ProtoReflect()
			if fd := r.Descriptor().Fields().ByName(protoreflect.Name(c.KeyField)); fd != nil {
				if fd.Kind() != protoreflect.StringKind || fd.Cardinality() == protoreflect.Repeated {
					return "", connect.NewError(connect.CodeInternal, fmt.Errorf("idemconnect: KeyField %s of %s is not a singular string field", c.KeyField, r.Descriptor().FullName()))
				}
				if k := r.Get(fd).String(); k != "" {
					if len(k) > c.MaxKeyBytes {
						return "", s.answer(ctx, connect.CodeInvalidArgument, ReasonKeyInvalid, "the request's "+c.KeyField+" is longer than "+strconv.Itoa(c.MaxKeyBytes)+" bytes", "", nil)
					}
					return k, nil
				}
			}
		}
	}
	vs := req.Header().Values(c.Header)
	switch {
	case len(vs) == 0:
		return "", nil
	case len(vs) > 1:
		return "", s.answer(ctx, connect.CodeInvalidArgument, ReasonKeyInvalid, "the call has more than one "+c.Header, "", nil)
	case vs[0] == "":
		return "", s.answer(ctx, connect.CodeInvalidArgument, ReasonKeyInvalid, "the call's "+c.Header+" is empty", "", nil)
	case len(vs[0]) > c.MaxKeyBytes:
		return "", s.answer(ctx, connect.CodeInvalidArgument, ReasonKeyInvalid, "the call's "+c.Header+" is longer than "+strconv.Itoa(c.MaxKeyBytes)+" bytes", "", nil)
	}
	return vs[0], nil
}

// fingerprint is SHA-256 over the procedure, a NUL (never in a procedure
// name) and the request's deterministic encoding: the gRPC module's, whose
// full method names are Connect's procedures.
func fingerprint(procedure string, m proto.Message) ([]byte, error) {
	bp := fpBuffers.Get().(*[]byte)
	defer fpBuffers.Put(bp)
	b := append((*bp)[:0], procedure...)
	b = append(b, 0)
	b, err := proto.MarshalOptions{Deterministic: true}.MarshalAppend(b, m)
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

// storeKey joins scope and the client's key into the key the store holds:
// "g1", then each length-prefixed ("g15:acme3:abc"), as the gRPC module
// does, so that a service moving between grpc-go and Connect keeps its
// records, and no key meets an HTTP middleware's ("h2...") in a shared
// store. The procedure is not part of it: it is in the fingerprint, so
// that a key reused on another procedure is a FailedPrecondition.
func storeKey(scope, key string) string {
	b := make([]byte, 0, 2+len(scope)+len(key)+2*4)
	b = append(b, "g1"...)
	for _, p := range [...]string{scope, key} {
		b = strconv.AppendInt(b, int64(len(p)), 10)
		b = append(b, ':')
		b = append(b, p...)
	}
	return string(b)
}

// sleep waits d, or returns false when ctx is done first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
