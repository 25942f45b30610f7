package idemgrpc

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/google/uuid"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemgo/idem/middleware/rpccode"
)

// ClientOptions configure the client interceptor. The zero value of every
// field means its documented default. NewClient refuses a mistake in any
// field with an error that names the field.
type ClientOptions struct {
	// Metadata names the request metadata that carries the key: a
	// metadata key, in any case, not reserved by gRPC ("grpc-") and not
	// binary ("-bin"). Default "idempotency-key".
	Metadata string
	// Methods are the full method names the interceptor covers
	// ("/package.Service/Method"), each listed once; others pass through
	// untouched. Default: every unary method.
	Methods []string
	// MaxAttempts bounds the attempts of one call, the first included; 1
	// never retries. Default 5.
	MaxAttempts int
	// MaxElapsed bounds the time of one call: no wait starts that would
	// end past it. An attempt under way is bounded by the call's context
	// and AttemptTimeout, not by MaxElapsed. Default 30s.
	MaxElapsed time.Duration
	// AttemptTimeout bounds each attempt; an attempt that runs out is an
	// unknown outcome, retried with the key like a lost connection (its
	// answer, had it come, is what the retry gets replayed). It lets a
	// call through a network that went silent (a blackhole) move to a
	// fresh attempt rather than wait for the call's deadline. Default 0:
	// only the call's context bounds an attempt.
	AttemptTimeout time.Duration
	// InitialWait is the backoff before the second attempt; it grows by
	// half at each further attempt, jittered by ±50%. Default 100ms.
	InitialWait time.Duration
	// MaxWait caps every wait, backoff or RetryInfo: a server asking for
	// longer is retried after MaxWait. Default 5s.
	MaxWait time.Duration
	// OnAttempt is called after every attempt, on the call's goroutine,
	// before the wait that follows a retried one. Default: none.
	OnAttempt func(Attempt)
}

// Defaults of ClientOptions besides those shared with ServerOptions.
const (
	DefaultMaxAttempts = 5
	DefaultMaxElapsed  = 30 * time.Second
	DefaultInitialWait = 100 * time.Millisecond
	DefaultMaxWait     = 5 * time.Second
)

// Attempt describes one attempt of a call, for ClientOptions.OnAttempt.
type Attempt struct {
	// Method is the call's full method name.
	Method string
	// Key is the call's idempotency key, sent with every attempt.
	Key string
	// N is the attempt's number, from 1.
	N int
	// Err is the attempt's error, nil on success.
	Err error
	// Retry reports whether another attempt follows, after Wait.
	Retry bool
	// Wait is the time until the next attempt; 0 when none follows.
	Wait time.Duration
	// Reason says why no attempt follows when the error was one that is
	// retried: "attempts" (MaxAttempts reached), "elapsed" (MaxElapsed or
	// the call's deadline would pass during the wait), "context" (the
	// call's context ended). Empty otherwise.
	Reason string
}

// Client is the client interceptor: its Unary method is a
// grpc.UnaryClientInterceptor that gives each call one idempotency key and
// retries it with that key. Create it with NewClient; it is safe for
// concurrent use.
type Client struct {
	o       ClientOptions
	methods map[string]bool
}

// NewClient returns the interceptor that ClientOptions describe, or an
// error naming the field at fault when they hold a mistake: a negative
// duration or count, a metadata key that is reserved, binary or not a key,
// a method name that is not /package.Service/Method or is listed twice, an
// InitialWait longer than MaxWait.
func NewClient(o ClientOptions) (*Client, error) {
	var err error
	if o.Metadata, err = metadataName("ClientOptions.Metadata", cmp.Or(o.Metadata, DefaultMetadata)); err != nil {
		return nil, err
	}
	for _, f := range []struct {
		name   string
		v, def time.Duration
	}{{"MaxElapsed", o.MaxElapsed, DefaultMaxElapsed}, {"InitialWait", o.InitialWait, DefaultInitialWait}, {"MaxWait", o.MaxWait, DefaultMaxWait}} {
		if f.v < 0 {
			return nil, fmt.Errorf("idemgrpc: ClientOptions.%s: %v is negative; 0 means the default, %v", f.name, f.v, f.def)
		}
	}
	if o.AttemptTimeout < 0 {
		return nil, fmt.Errorf("idemgrpc: ClientOptions.AttemptTimeout: %v is negative; 0 means the default, none", o.AttemptTimeout)
	}
	if o.MaxAttempts < 0 {
		return nil, fmt.Errorf("idemgrpc: ClientOptions.MaxAttempts: %d is negative; 0 means the default, %d", o.MaxAttempts, DefaultMaxAttempts)
	}
	o.MaxAttempts = cmp.Or(o.MaxAttempts, DefaultMaxAttempts)
	o.MaxElapsed = cmp.Or(o.MaxElapsed, DefaultMaxElapsed)
	o.InitialWait = cmp.Or(o.InitialWait, DefaultInitialWait)
	o.MaxWait = cmp.Or(o.MaxWait, DefaultMaxWait)
	if o.InitialWait > o.MaxWait {
		return nil, fmt.Errorf("idemgrpc: ClientOptions.InitialWait: %v is longer than MaxWait %v, which caps every wait", o.InitialWait, o.MaxWait)
	}
	methods, err := methodSet("ClientOptions.Methods", o.Methods)
	if err != nil {
		return nil, err
	}
	return &Client{o: o, methods: methods}, nil
}

// Unary sends a covered call with its key, a fresh one unless the caller
// put one in the outgoing metadata, and sends it again with the same key
// while the attempt's error is one that is retried (Unavailable,
// ResourceExhausted, Aborted, and an attempt that ran out of
// AttemptTimeout) and the bounds allow, waiting a jittered backoff or the
// server's RetryInfo delay, whichever is longer, capped by MaxWait. It
// returns nil or the last attempt's error as it came (a status error, its
// details intact); when the call's context ends during a wait, a status of
// the context's code naming the last attempt's error.
func (c *Client) Unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if c.methods != nil && !c.methods[method] {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	o := &c.o
	var key string
	if md, ok := metadata.FromOutgoingContext(ctx); ok && len(md[o.Metadata]) > 0 {
		key = md[o.Metadata][0]
	} else {
		key = uuid.NewString()
		ctx = metadata.AppendToOutgoingContext(ctx, o.Metadata, key)
	}
	start := time.Now()
	var bo *backoff.ExponentialBackOff // only once a retry is needed
	for n := 1; ; n++ {
		timedOut, err := c.attempt(ctx, method, req, reply, cc, invoker, opts)
		a := Attempt{Method: method, Key: key, N: n, Err: err}
		if err == nil || !(timedOut || retried(status.Code(err))) {
			c.report(a)
			return err
		}
		switch {
		case ctx.Err() != nil:
			a.Reason = "context"
		case n >= o.MaxAttempts:
			a.Reason = "attempts"
		default:
			if bo == nil {
				bo = &backoff.ExponentialBackOff{InitialInterval: o.InitialWait, RandomizationFactor: 0.5, Multiplier: 1.5, MaxInterval: o.MaxWait}
				bo.Reset()
			}
			a.Wait = min(max(bo.NextBackOff(), retryDelay(err)), o.MaxWait)
			if time.Now().Add(a.Wait).After(c.deadline(ctx, start)) {
				a.Reason, a.Wait = "elapsed", 0
			}
		}
		a.Retry = a.Reason == ""
		c.report(a)
		if !a.Retry {
			return err
		}
		if !sleep(ctx, a.Wait) {
			return status.Errorf(status.FromContextError(ctx.Err()).Code(), "idemgrpc: %s: %v while waiting to retry; attempt %d: %v", method, ctx.Err(), n, err)
		}
	}
}

// attempt sends one attempt, bounded by AttemptTimeout; timedOut reports
// that it ran out of it while the call's context goes on.
func (c *Client) attempt(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption) (timedOut bool, err error) {
	if c.o.AttemptTimeout <= 0 {
		return false, invoker(ctx, method, req, reply, cc, opts...)
	}
	actx, cancel := context.WithTimeout(ctx, c.o.AttemptTimeout)
	defer cancel()
	err = invoker(actx, method, req, reply, cc, opts...)
	if err == nil || ctx.Err() != nil || status.Code(err) != codes.DeadlineExceeded {
		return false, err
	}
	// The server, given the attempt's deadline (grpc-timeout), may answer
	// DeadlineExceeded before the attempt's own timer fires: the attempt's
	// bound it is, unless the call's deadline was the nearer one.
	ad, _ := actx.Deadline()
	cd, ok := ctx.Deadline()
	return !ok || ad.Before(cd), err
}

func (c *Client) report(a Attempt) {
	if c.o.OnAttempt != nil {
		c.o.OnAttempt(a)
	}
}

// deadline is when no wait may end past: MaxElapsed from start, or the
// call's deadline when that is sooner.
func (c *Client) deadline(ctx context.Context, start time.Time) time.Time {
	d := start.Add(c.o.MaxElapsed)
	if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
		return cd
	}
	return d
}

// retried reports the codes that are retried with the key, as
// rpccode.Retried states them for every RPC front door: Unavailable (also
// what gRPC answers for a connection lost mid-call, whose outcome is
// unknown: the key makes the retry safe), Aborted (the server
// interceptor's answer for a key in flight) and ResourceExhausted (a
// quota that may refill).
func retried(c codes.Code) bool {
	return rpccode.Retried(c)
}

// retryDelay returns the delay of err's RetryInfo, 0 when it has none.
func retryDelay(err error) time.Duration {
	st, ok := status.FromError(err)
	if !ok {
		return 0
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return max(min(ri.GetRetryDelay().AsDuration(), time.Hour), 0)
		}
	}
	return 0
}
