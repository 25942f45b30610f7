package idemconnect

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"github.com/cenkalti/backoff/v5"
	"github.com/google/uuid"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/idemgo/idem/middleware/rpccode"
)

// ClientOptions configure the client interceptor. The zero value of every
// field means its documented default. NewClient refuses a mistake in any
// field with an error that names the field.
type ClientOptions struct {
	// Header names the request header that carries the key: a header
	// field name, in any case, not one of the protocols' own. Default
	// "Idempotency-Key".
	Header string
	// Procedures are the procedures the interceptor covers
	// ("/package.Service/Method"), each listed once; others pass through
	// untouched. Default: every unary procedure.
	Procedures []string
	// MaxAttempts bounds the attempts of one call, the first included; 1
	// never retries. Default 5.
	MaxAttempts int
	// MaxElapsed bounds the time of one call: no wait starts that would
	// end past it. An attempt under way is bounded by the call's context
	// and AttemptTimeout, not by MaxElapsed. Default 30s.
	MaxElapsed time.Duration
	// AttemptTimeout bounds each attempt; an attempt that runs out is an
	// unknown outcome, retried with the key like a lost connection. It
	// lets a call through a network that went silent move to a fresh
	// attempt rather than wait for the call's deadline. Default 0: only
	// the call's context bounds an attempt.
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
	// Procedure is the call's procedure.
	Procedure string
	// Key is the call's idempotency key, sent with every attempt; "" for
	// a NO_SIDE_EFFECTS procedure, which needs none.
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

// Client is the client interceptor, a connect.Interceptor: give it to a
// client with connect.WithInterceptors. It gives each unary call one
// idempotency key and retries it with that key; a handler's calls and
// streams pass through. Create it with NewClient; it is safe for
// concurrent use.
type Client struct {
	o          ClientOptions
	procedures map[string]bool
}

var _ connect.Interceptor = (*Client)(nil)

// NewClient returns the interceptor that ClientOptions describe, or an
// error naming the field at fault when they hold a mistake: a negative
// duration or count, a header that is the protocols' own or not a token,
// a procedure that is not /package.Service/Method or is listed twice, an
// InitialWait longer than MaxWait.
func NewClient(o ClientOptions) (*Client, error) {
	var err error
	if o.Header, err = headerName("ClientOptions.Header", cmp.Or(o.Header, DefaultHeader)); err != nil {
		return nil, err
	}
	for _, f := range []struct {
		name   string
		v, def time.Duration
	}{{"MaxElapsed", o.MaxElapsed, DefaultMaxElapsed}, {"InitialWait", o.InitialWait, DefaultInitialWait}, {"MaxWait", o.MaxWait, DefaultMaxWait}} {
		if f.v < 0 {
			return nil, fmt.Errorf("idemconnect: ClientOptions.%s: %v is negative; 0 means the default, %v", f.name, f.v, f.def)
		}
	}
	if o.AttemptTimeout < 0 {
		return nil, fmt.Errorf("idemconnect: ClientOptions.AttemptTimeout: %v is negative; 0 means the default, none", o.AttemptTimeout)
	}
	if o.MaxAttempts < 0 {
		return nil, fmt.Errorf("idemconnect: ClientOptions.MaxAttempts: %d is negative; 0 means the default, %d", o.MaxAttempts, DefaultMaxAttempts)
	}
	o.MaxAttempts = cmp.Or(o.MaxAttempts, DefaultMaxAttempts)
	o.MaxElapsed = cmp.Or(o.MaxElapsed, DefaultMaxElapsed)
	o.InitialWait = cmp.Or(o.InitialWait, DefaultInitialWait)
	o.MaxWait = cmp.Or(o.MaxWait, DefaultMaxWait)
	if o.InitialWait > o.MaxWait {
		return nil, fmt.Errorf("idemconnect: ClientOptions.InitialWait: %v is longer than MaxWait %v, which caps every wait", o.InitialWait, o.MaxWait)
	}
	procedures, err := procedureSet("ClientOptions.Procedures", o.Procedures)
	if err != nil {
		return nil, err
	}
	return &Client{o: o, procedures: procedures}, nil
}

// WrapUnary sends a covered call with its key, a fresh one (a UUID)
// unless the caller set one in the request's header, and sends it again
// with the same key while the attempt's error is one that is retried
// (rpccode.Retried: Unavailable, ResourceExhausted, Aborted; an error of
// the transport, not sent by the server; and an attempt that ran out of
// AttemptTimeout) and the bounds allow, waiting a
// jittered backoff or the server's RetryInfo delay, whichever is longer,
// capped by MaxWait. A key it made is removed from the request's header
// when the call returns, so that the request sent again is a new call. A
// NO_SIDE_EFFECTS procedure is sent without a key and retried alike: it
// changes nothing. It returns the last attempt's answer
// as it came; when the call's context ends during a wait, an error of the
// context's code naming the last attempt's error.
func (c *Client) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		spec := req.Spec()
		if !spec.IsClient || (c.procedures != nil && !c.procedures[spec.Procedure]) {
			return next(ctx, req)
		}
		o := &c.o
		key := req.Header().Get(o.Header)
		if key == "" && spec.IdempotencyLevel != connect.IdempotencyNoSideEffects {
			key = uuid.NewString()
			req.Header().Set(o.Header, key)
			// The request is the caller's: sent again, it is another
			// logical call, which must get a key of its own, not be
			// answered with this one's replay.
			defer req.Header().Del(o.Header)
		}
		start := time.Now()
		var bo *backoff.ExponentialBackOff // only once a retry is needed
		for n := 1; ; n++ {
			timedOut, resp, err := c.attempt(ctx, next, req)
			a := Attempt{Procedure: spec.Procedure, Key: key, N: n, Err: err}
			if err == nil || !(timedOut || c.retried(ctx, err)) {
				c.report(a)
				return resp, err
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
				return resp, err
			}
			if !sleep(ctx, a.Wait) {
				code := connect.CodeCanceled
				if errors.Is(ctx.Err(), context.DeadlineExceeded) {
					code = connect.CodeDeadlineExceeded
				}
				return nil, connect.NewError(code, fmt.Errorf("idemconnect: %s: %w while waiting to retry; attempt %d: %v", spec.Procedure, ctx.Err(), n, err))
			}
		}
	}
}

// attempt sends one attempt, bounded by AttemptTimeout; timedOut reports
// that it ran out of it while the call's context goes on.
func (c *Client) attempt(ctx context.Context, next connect.UnaryFunc, req connect.AnyRequest) (timedOut bool, resp connect.AnyResponse, err error) {
	if c.o.AttemptTimeout <= 0 {
		resp, err = next(ctx, req)
		return false, resp, err
	}
	actx, cancel := context.WithTimeout(ctx, c.o.AttemptTimeout)
	defer cancel()
	resp, err = next(actx, req)
	if err == nil || ctx.Err() != nil || connect.CodeOf(err) != connect.CodeDeadlineExceeded {
		return false, resp, err
	}
	// The server, given the attempt's deadline (a timeout header), may
	// answer DeadlineExceeded before the attempt's own timer fires: the
	// attempt's bound it is, unless the call's deadline was the nearer
	// one.
	ad, _ := actx.Deadline()
	cd, ok := ctx.Deadline()
	return !ok || ad.Before(cd), resp, err
}

// WrapStreamingClient passes streams through: only unary calls are
// covered.
func (c *Client) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler passes a handler's streams through: the interceptor
// covers clients.
func (c *Client) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// retried reports whether an attempt's error is retried with the key: a
// code rpccode.Retried names, or any error the server did not send
// (connect.IsWireError false) while the call's own context goes on. Those
// are the transport's: connect-go reports a connection reset by the peer
// as Canceled, a response cut short as Unknown ("unexpected EOF"); the
// call's outcome is unknown, as for a lost connection, and the key makes
// the retry safe.
func (c *Client) retried(ctx context.Context, err error) bool {
	return rpccode.Retried(connect.CodeOf(err)) || (!connect.IsWireError(err) && ctx.Err() == nil)
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

// retryDelay returns the delay of err's RetryInfo, 0 when it has none.
func retryDelay(err error) time.Duration {
	ce := new(connect.Error)
	if !errors.As(err, &ce) {
		return 0
	}
	for _, d := range ce.Details() {
		v, err := d.Value()
		if err != nil {
			continue
		}
		if ri, ok := v.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return max(min(ri.GetRetryDelay().AsDuration(), time.Hour), 0)
		}
	}
	return 0
}
