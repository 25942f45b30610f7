package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemgo/idem"
)

// Server is the server interceptor: its Unary method is a
// grpc.UnaryServerInterceptor, its Stream method a
// grpc.StreamServerInterceptor that refuses keyed streams. Create it with
// NewServer; it is safe for concurrent use.
type Server struct {
	c *serverConfig
}

// NewServer returns the interceptor that ServerOptions describe, or an
// error when they hold a mistake: the error names the field at fault and
// the value given (a nil Store, a negative duration or size, a metadata key
// that is reserved, binary or not a key, a credential in ReplayMetadata, a
// method name that is not /package.Service/Method, a MaxResponseBytes the
// store cannot record), and Scope when neither Scope nor SingleTenant is
// set, or both.
func NewServer(o ServerOptions) (*Server, error) {
	c, err := o.config()
	if err != nil {
		return nil, err
	}
	return &Server{c: c}, nil
}

// Unary handles one unary call: with a key, the first call of the key runs
// the handler and its answer is recorded (per Keep); a retry of the same
// request gets the recorded answer with MetadataReplayed: true. See the
// package documentation for every answer.
func (s *Server) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	c := s.c
	if c.methods != nil && !c.methods[info.FullMethod] {
		return handler(ctx, req)
	}
	key, keyErr := s.clientKey(ctx, req)
	if keyErr == nil && key == "" && !c.Required {
		return handler(ctx, req)
	}
	cl := &call{ctx: ctx, method: info.FullMethod, req: req, handler: handler, key: key}
	if c.Observer == nil {
		s.serve(cl, keyErr)
		return cl.resp, cl.err
	}
	s.observe(cl, keyErr)
	return cl.resp, cl.err
}

// Stream passes a streaming call through unless it carries a key in
// ServerOptions.Metadata (and its method is covered): such a call is
// answered Unimplemented (ReasonStreamNotCovered), since a stream's
// messages cannot be recorded and replayed as one answer, and running it
// unprotected would break the promise its key makes.
func (s *Server) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if s.c.methods != nil && !s.c.methods[info.FullMethod] {
		return handler(srv, ss)
	}
	md, _ := metadata.FromIncomingContext(ss.Context())
	if len(md[s.c.Metadata]) == 0 {
		return handler(srv, ss)
	}
	return s.answer(ss.Context(), codes.Unimplemented, ReasonStreamNotCovered, "streaming calls are not covered by the idempotency interceptor; send this call without "+s.c.Metadata, "", nil)
}

// call is one covered unary call and what the interceptor did with it.
type call struct {
	ctx     context.Context
	method  string
	req     any
	handler grpc.UnaryHandler
	key     string // the client's key

	resp any   // the call's answer
	err  error // the call's error answer

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
	errPanicked      = errors.New("idemgrpc: a Scope func panicked")
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
		cl.err = s.answer(cl.ctx, codes.InvalidArgument, ReasonKeyMissing, "the call has no idempotency key in "+c.Metadata+" metadata"+s.fieldWords(), "", nil)
		cl.layerErr = errKeyRefused
		return
	}
	var scope string
	if c.Scope != nil {
		var err error
		if scope, err = c.Scope(cl.ctx, cl.method); err == nil && scope == "" {
			// Every call without a principal would share one scope, and
			// replay each other's responses.
			err = errors.New("idemgrpc: Scope returned an empty scope")
		}
		if err != nil {
			if _, ok := status.FromError(err); !ok {
				err = s.answer(cl.ctx, codes.Unauthenticated, ReasonKeyInvalid, "the call's tenant could not be determined", "", err)
			}
			cl.err, cl.layerErr = err, errKeyRefused
			return
		}
	}
	m, ok := cl.req.(proto.Message)
	if !ok {
		cl.err = status.Errorf(codes.Internal, "idemgrpc: the request of %s is a %T, not a protobuf message; the interceptor cannot fingerprint it", cl.method, cl.req)
		cl.layerErr = errNotMessage
		return
	}
	fp, err := fingerprint(cl.method, m)
	if err != nil {
		cl.err = status.Errorf(codes.Internal, "idemgrpc: the request of %s does not encode: %v", cl.method, err)
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
			cl.err = s.answer(ctx, codes.FailedPrecondition, ReasonKeyReused, "the idempotency key was used for another request (another method or message); use a new key for a new request", cl.key, nil)
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
			cl.err = s.answer(ctx, codes.Aborted, ReasonKeyInFlight, "a call with this idempotency key is in flight; retry after the RetryInfo delay", cl.key, idem.ErrInProgress)
			return
		}
		// Jittered, growing waits: many retries of one key do not poll
		// the store in step.
		d := min(wait/2+rand.N(wait), left)
		wait = min(2*wait, 250*time.Millisecond)
		if !sleep(ctx, d) {
			cl.outcome, cl.layerErr = idem.InProgress, context.Cause(ctx)
			cl.err = status.FromContextError(ctx.Err()).Err()
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
		return s.answer(cl.ctx, codes.InvalidArgument, ReasonKeyInvalid, "the idempotency key is too long for the store", "", err)
	case cl.ctx.Err() != nil:
		return status.FromContextError(cl.ctx.Err()).Err()
	}
	return s.answer(cl.ctx, codes.Unavailable, ReasonStoreUnavailable, "the idempotency store is unavailable; the call was not run", "", err)
}

// run runs the handler under claim's lease, with the take-over in its
// context when claim took the key over, then records its answer or
// releases the key.
func (s *Server) run(cl *call, claim idem.Claim) {
	l := claim.Lease
	// After a crash, the handler is told: idem.TakeOverFrom(ctx).
	work, stop := idem.Hold(idem.ContextWithTakeOver(cl.ctx, idem.TakeOverOf(claim)), s.c.Store, l)
	cp := &capture{ServerTransportStream: grpc.ServerTransportStreamFromContext(cl.ctx), method: cl.method}
	work = grpc.NewContextWithServerTransportStream(work, cp)
	done := false
	defer func() {
		if !done {
			// The handler panicked: release the key so that a retry does
			// the work, and let the panic go on.
			s.forget(cl.ctx, l, stop())
		}
	}()
	cl.handlerOK = true
	cl.resp, cl.err = cl.handler(work, cl.req)
	done = true
	end := stop() // waits for the renewals
	if !s.c.Keep(status.Code(cl.err)) {
		s.forget(cl.ctx, l, end)
		return
	}
	header, trailer := cp.kept()
	rec, ok := s.encode(cl, header, trailer, false)
	if !ok {
		s.forget(cl.ctx, l, end)
		return
	}
	cl.layerErr = s.confirm(cl, l, end, header, trailer, rec)
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
