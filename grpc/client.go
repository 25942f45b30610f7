package idemgrpc

import (
	"context"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/idemgo/idem/middleware/rpccore"
)

// ClientOptions configure the client interceptor. The zero value of every
// field means its documented default. NewClient refuses a mistake in any
// field with an error that names the field. Each field is the RPC core's
// of its name (rpccore.ClientConfig; Metadata its KeyName), documented
// there in full.
type ClientOptions struct {
	// Metadata names the request metadata that carries the key: a
	// metadata key, in any case, not reserved by gRPC ("grpc-") and not
	// binary ("-bin"). Default "idempotency-key".
	Metadata string
	// Methods are the full method names the interceptor covers
	// ("/package.Service/Method"). Default: every unary method.
	Methods []string
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
// its Method is the call's full method name.
type Attempt = rpccore.Attempt

// Client is the client interceptor: its Unary method is a
// grpc.UnaryClientInterceptor that gives each call one idempotency key and
// retries it with that key. Create it with NewClient; it is safe for
// concurrent use.
type Client struct {
	core     *rpccore.Client
	metadata string
}

// NewClient returns the interceptor that ClientOptions describe, or an
// error naming the field at fault when they hold a mistake: a negative
// duration or count, a metadata key that is reserved, binary or not a key,
// a method name that is not /package.Service/Method or is listed twice, an
// InitialWait longer than MaxWait.
func NewClient(o ClientOptions) (*Client, error) {
	core, err := rpccore.NewClient(rpccore.ClientConfig{
		Frame: frame, KeyName: o.Metadata, Methods: o.Methods,
		MaxAttempts: o.MaxAttempts, MaxElapsed: o.MaxElapsed, AttemptTimeout: o.AttemptTimeout,
		InitialWait: o.InitialWait, MaxWait: o.MaxWait, OnAttempt: o.OnAttempt,
	})
	if err != nil {
		return nil, err
	}
	return &Client{core: core, metadata: core.KeyName()}, nil
}

// Unary sends a covered call with its key, a fresh one unless the caller
// put one in the outgoing metadata, and sends it again with the same key
// as rpccore.Client.Call says. It returns nil or the last attempt's error
// as it came (a status error, its details intact); when the call's
// context ends during a wait, a status of the context's code naming the
// last attempt's error.
func (c *Client) Unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if !c.core.Covers(method) {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	var key string
	if md, ok := metadata.FromOutgoingContext(ctx); ok && len(md[c.metadata]) > 0 {
		key = md[c.metadata][0]
	} else {
		key = uuid.NewString()
		ctx = metadata.AppendToOutgoingContext(ctx, c.metadata, key)
	}
	return c.core.Call(ctx, method, key, func(ctx context.Context) error {
		return invoker(ctx, method, req, reply, cc, opts...)
	})
}
