package idemconnect

import (
	"context"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	"github.com/idemgo/idem/middleware/rpccore"
)

// ClientOptions configure the client interceptor. The zero value of every
// field means its documented default. NewClient refuses a mistake in any
// field with an error that names the field. Each field is the RPC core's
// of its name (rpccore.ClientConfig; Header its KeyName, Procedures its Methods), documented
// there in full.
type ClientOptions struct {
	// Header names the request header that carries the key: a header
	// field name, in any case, not one of the protocols' own. Default
	// "Idempotency-Key".
	Header string
	// Procedures are the procedures the interceptor covers
	// ("/package.Service/Method"). Default: every unary procedure.
	Procedures []string
	// MaxAttempts bounds the attempts of one call, the first included; 1
	// never retries. Default 5.
	MaxAttempts int
	// MaxElapsed bounds the time of one call: no wait starts that would end
	// past it. Default 30s.
	MaxElapsed time.Duration
	// AttemptTimeout bounds each attempt; one that runs out is retried with
	// the key, like a lost connection. Default 0: only the call's context
	// bounds an attempt.
	AttemptTimeout time.Duration
	// InitialWait is the backoff before the second attempt; it grows by half
	// at each further attempt, jittered by ±50%. Default 100ms.
	InitialWait time.Duration
	// MaxWait caps every wait, backoff or RetryInfo. Default 5s.
	MaxWait time.Duration
	// OnAttempt is called after every attempt, on the call's goroutine,
	// before the wait that follows a retried one. Default: none.
	OnAttempt func(Attempt)
}

// Defaults of ClientOptions besides those shared with ServerOptions.
const (
	DefaultMaxAttempts = rpccore.DefaultMaxAttempts
	DefaultMaxElapsed  = rpccore.DefaultMaxElapsed
	DefaultInitialWait = rpccore.DefaultInitialWait
	DefaultMaxWait     = rpccore.DefaultMaxWait
)

// Attempt describes one attempt of a call, for ClientOptions.OnAttempt:
// rpccore.Attempt's fields, the call's procedure in Procedure.
type Attempt struct {
	Procedure string        // the call's procedure
	Key       string        // the call's key; "" for a NO_SIDE_EFFECTS procedure, which needs none
	N         int           // the attempt's number, from 1
	Err       error         // the attempt's error, nil on success
	Retry     bool          // another attempt follows, after Wait
	Wait      time.Duration // the time until the next attempt; 0 when none follows
	Reason    string        // why no attempt follows a retried error: "attempts", "elapsed", "context"
}

// Client is the client interceptor, a connect.Interceptor: give it to a
// client with connect.WithInterceptors. It gives each unary call one
// idempotency key and retries it with that key; a handler's calls and
// streams pass through. Create it with NewClient; it is safe for
// concurrent use.
type Client struct {
	core   *rpccore.Client
	header string
}

var _ connect.Interceptor = (*Client)(nil)

// NewClient returns the interceptor that ClientOptions describe, or an
// error naming the field at fault when they hold a mistake: a negative
// duration or count, a header that is the protocols' own or not a token,
// a procedure that is not /package.Service/Method or is listed twice, an
// InitialWait longer than MaxWait.
func NewClient(o ClientOptions) (*Client, error) {
	var report func(rpccore.Attempt)
	if f := o.OnAttempt; f != nil {
		report = func(a rpccore.Attempt) {
			f(Attempt{Procedure: a.Method, Key: a.Key, N: a.N, Err: a.Err, Retry: a.Retry, Wait: a.Wait, Reason: a.Reason})
		}
	}
	core, err := rpccore.NewClient(rpccore.ClientConfig{
		Frame: frame, KeyName: o.Header, Methods: o.Procedures,
		MaxAttempts: o.MaxAttempts, MaxElapsed: o.MaxElapsed, AttemptTimeout: o.AttemptTimeout,
		InitialWait: o.InitialWait, MaxWait: o.MaxWait, OnAttempt: report,
	})
	if err != nil {
		return nil, err
	}
	return &Client{core: core, header: core.KeyName()}, nil
}

// WrapUnary sends a covered call with its key, a fresh one (a UUID)
// unless the caller set one in the request's header, and sends it again
// with the same key as rpccore.Client.Call says (an error of the
// transport, not sent by the server, is retried too). A key it made is
// removed from the request's header when the call returns, so that the
// request sent again is a new call. A NO_SIDE_EFFECTS procedure is sent
// without a key and retried alike. It returns the last attempt's answer
// as it came; when the call's context ends during a wait, an error of the
// context's code naming the last attempt's error.
func (c *Client) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		spec := req.Spec()
		if !spec.IsClient || !c.core.Covers(spec.Procedure) {
			return next(ctx, req)
		}
		key := req.Header().Get(c.header)
		if key == "" && spec.IdempotencyLevel != connect.IdempotencyNoSideEffects {
			key = uuid.NewString()
			req.Header().Set(c.header, key)
			// The request is the caller's: sent again, it is another
			// logical call, which must get a key of its own, not be
			// answered with this one's replay.
			defer req.Header().Del(c.header)
		}
		var resp connect.AnyResponse
		err := c.core.Call(ctx, spec.Procedure, key, func(ctx context.Context) (err error) {
			resp, err = next(ctx, req)
			return err
		})
		return resp, err
	}
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
