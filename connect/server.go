package idemconnect

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/idemgo/idem"
)

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
	takeOver  bool  // the claim took the key over from a lapsed attempt
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
		e := idem.Event{Op: idem.OpRequest, Outcome: cl.outcome, TakeOver: cl.takeOver, Items: 1, Took: time.Since(start), Err: cl.layerErr}
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
		if errors.Is(err, idem.ErrQuarantined) {
			cl.layerErr = err
			cl.err = s.quarantined(cl, claim)
			return
		}
		if err != nil {
			cl.layerErr = err
			cl.err = s.storeFailed(cl, err)
			return
		}
		switch claim.Outcome {
		case idem.Claimed:
			cl.outcome, cl.takeOver = idem.Claimed, claim.TakeOver
			s.run(cl, claim)
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
