package rpccore

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/idemgo/idem/internal/backoff"
	"github.com/idemgo/idem/internal/badopt"
	"github.com/idemgo/idem/middleware/rpccode"
)

// ClientConfig is a client interceptor's options as the core takes them:
// the front door's ClientOptions, field for field, and its Frame. Zero
// values mean the Default constants; the front doors' fields of these
// names are documented here.
type ClientConfig struct {
	// Frame is the front door's.
	Frame
	// KeyName names the metadata (the header) that carries the key, as
	// ClientOptions.Metadata (Header) gives it, checked as Config.KeyName.
	// Default: DefaultKey.
	KeyName string
	// Methods are the full method names covered ("/package.Service/Method",
	// Connect's procedures), each listed once; others pass through
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

// Attempt describes one attempt of a call, as the front doors' OnAttempt
// receive it.
type Attempt struct {
	Method string        // the call's full method name (Connect: its procedure)
	Key    string        // the call's key, sent with every attempt
	N      int           // the attempt's number, from 1
	Err    error         // the attempt's error, nil on success
	Retry  bool          // another attempt follows, after Wait
	Wait   time.Duration // the time until the next attempt; 0 when none follows
	// Reason says why no attempt follows an error that is retried:
	// "attempts" (MaxAttempts reached), "elapsed" (MaxElapsed or the
	// call's deadline would pass during the wait), "context" (the call's
	// context ended). Empty otherwise.
	Reason string
}

// Client is the client half of the core: the retry loop that sends one
// call's attempts with one key. Create it with NewClient; it is safe for
// concurrent use.
type Client struct {
	c       ClientConfig
	methods map[string]bool
}

// NewClient checks c, fills in its defaults and returns the Client, or the
// error naming the ClientOptions field at fault: a key's name that Name
// refuses, a negative duration or count, a method that is malformed or
// listed twice, an InitialWait longer than MaxWait.
func NewClient(c ClientConfig) (*Client, error) {
	pkg := c.Pkg
	name, err := c.Name("ClientOptions."+c.KeyOption, cmp.Or(c.KeyName, c.DefaultKey))
	if err != nil {
		return nil, err
	}
	c.KeyName = name
	for _, f := range []struct {
		name   string
		v, def time.Duration
	}{{"MaxElapsed", c.MaxElapsed, DefaultMaxElapsed}, {"InitialWait", c.InitialWait, DefaultInitialWait}, {"MaxWait", c.MaxWait, DefaultMaxWait}} {
		if f.v < 0 {
			return nil, badopt.Default(pkg, "ClientOptions."+f.name, f.v, f.def, "is negative")
		}
	}
	if c.AttemptTimeout < 0 {
		return nil, badopt.Default(pkg, "ClientOptions.AttemptTimeout", c.AttemptTimeout, "none", "is negative")
	}
	if c.MaxAttempts < 0 {
		return nil, badopt.Default(pkg, "ClientOptions.MaxAttempts", c.MaxAttempts, DefaultMaxAttempts, "is negative")
	}
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.MaxElapsed = cmp.Or(c.MaxElapsed, DefaultMaxElapsed)
	c.InitialWait = cmp.Or(c.InitialWait, DefaultInitialWait)
	c.MaxWait = cmp.Or(c.MaxWait, DefaultMaxWait)
	if c.InitialWait > c.MaxWait {
		return nil, badopt.Error(pkg, "ClientOptions.InitialWait", c.InitialWait, "is longer than MaxWait %v, which caps every wait", c.MaxWait)
	}
	methods, err := MethodSet(pkg, "ClientOptions."+c.MethodsField, c.MethodName, c.Methods)
	if err != nil {
		return nil, err
	}
	return &Client{c: c, methods: methods}, nil
}

// KeyName is the name of the key's metadata, as the front door spells it.
func (c *Client) KeyName() string { return c.c.KeyName }

// Covers reports whether calls of method are covered.
func (c *Client) Covers(method string) bool { return c.methods == nil || c.methods[method] }

// Call sends a call of method by try, with key, and sends it again while
// the attempt's error is one that is retried and the bounds allow: a code
// rpccode.Retried names (Unavailable, ResourceExhausted, Aborted), an
// error of the transport, and an attempt that ran out of AttemptTimeout.
// Between attempts it waits a jittered backoff or the server's RetryInfo
// delay, whichever is longer, capped by MaxWait, within MaxAttempts,
// MaxElapsed and ctx. It returns nil or the last attempt's error as it
// came; when ctx ends during a wait, Frame.ContextError's, naming the last
// attempt's error.
func (c *Client) Call(ctx context.Context, method, key string, try func(context.Context) error) error {
	o := &c.c
	start := time.Now()
	var bo *backoff.Backoff // only once a retry is needed
	for n := 1; ; n++ {
		timedOut, err := c.attempt(ctx, try)
		a := Attempt{Method: method, Key: key, N: n, Err: err}
		if err == nil || !(timedOut || c.retried(ctx, err)) {
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
				bo = &backoff.Backoff{First: o.InitialWait, Most: o.MaxWait, Growth: 1.5}
			}
			delay, _ := RetryDelay(o.Status(err).Details)
			a.Wait = min(max(bo.Next(), delay), o.MaxWait)
			if time.Now().Add(a.Wait).After(c.deadline(ctx, start)) {
				a.Reason, a.Wait = "elapsed", 0
			}
		}
		a.Retry = a.Reason == ""
		c.report(a)
		if !a.Retry {
			return err
		}
		if !backoff.Sleep(ctx, a.Wait) {
			return o.ContextError(ctx, fmt.Errorf("%s: %s: %w while waiting to retry; attempt %d: %v", o.Pkg, method, ctx.Err(), n, err))
		}
	}
}

// attempt sends one attempt, bounded by AttemptTimeout; timedOut reports
// that it ran out of it while the call's context goes on.
func (c *Client) attempt(ctx context.Context, try func(context.Context) error) (timedOut bool, err error) {
	if c.c.AttemptTimeout <= 0 {
		return false, try(ctx)
	}
	actx, cancel := context.WithTimeout(ctx, c.c.AttemptTimeout)
	defer cancel()
	err = try(actx)
	if err == nil || ctx.Err() != nil || c.c.Code(err) != DeadlineExceeded {
		return false, err
	}
	// The server, given the attempt's deadline (grpc-timeout, a Connect
	// timeout header), may answer DeadlineExceeded before the attempt's
	// own timer fires: the attempt's bound it is, unless the call's
	// deadline was the nearer one.
	ad, _ := actx.Deadline()
	cd, ok := ctx.Deadline()
	return !ok || ad.Before(cd), err
}

// retried reports whether an attempt's error is retried with the key: a
// code rpccode.Retried names, or an error of the transport while the
// call's own context goes on (its outcome is unknown, as for a lost
// connection, and the key makes the retry safe).
func (c *Client) retried(ctx context.Context, err error) bool {
	return rpccode.Retried(c.c.Code(err)) || (c.c.Transport != nil && c.c.Transport(err) && ctx.Err() == nil)
}

func (c *Client) report(a Attempt) {
	if c.c.OnAttempt != nil {
		c.c.OnAttempt(a)
	}
}

// deadline is when no wait may end past: MaxElapsed from start, or the
// call's deadline when that is sooner.
func (c *Client) deadline(ctx context.Context, start time.Time) time.Time {
	d := start.Add(c.c.MaxElapsed)
	if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
		return cd
	}
	return d
}
