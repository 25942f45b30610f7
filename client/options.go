package client

import (
	"cmp"
	"net/http"
	"net/textproto"
	"strings"
	"time"

	"github.com/idemgo/idem/internal/badopt"
	"github.com/idemgo/idem/internal/nilcheck"
)

// Options configure a Transport. The zero value of every field means its
// documented default. New refuses a mistake in any field with an error that
// names the field.
type Options struct {
	// Base sends each attempt. A typed nil (a nil *http.Transport) is
	// refused: it would panic on the first request. Default
	// http.DefaultTransport.
	Base http.RoundTripper
	// Header names the request header that carries the key: a header
	// field name, in any case. Default "Idempotency-Key".
	Header string
	// Methods are the request methods the transport covers (a key and
	// retries), each an upper-case token listed once; other methods pass
	// through to Base untouched. Default POST and PATCH.
	Methods []string
	// MaxAttempts bounds the attempts of one RoundTrip, the first
	// included; 1 never retries. Default 5.
	MaxAttempts int
	// MaxElapsed bounds the time of one RoundTrip: no wait starts that
	// would end past it. An attempt under way is bounded by the request's
	// context and Base (http.Transport.ResponseHeaderTimeout), not by
	// MaxElapsed. Default 30s.
	MaxElapsed time.Duration
	// InitialWait is the backoff before the second attempt; it grows by
	// half at each further attempt, jittered by ±50%. Default 100ms.
	InitialWait time.Duration
	// MaxWait caps every wait, backoff or Retry-After: a server asking
	// for longer is retried after MaxWait. Default 5s.
	MaxWait time.Duration
	// OnAttempt is called after every attempt, on the RoundTrip's
	// goroutine, before the wait that follows a retried one. It must not
	// read or close Attempt.Response's body. Default: none.
	OnAttempt func(Attempt)
}

// Defaults of Options.
const (
	DefaultHeader      = "Idempotency-Key"
	DefaultMaxAttempts = 5
	DefaultMaxElapsed  = 30 * time.Second
	DefaultInitialWait = 100 * time.Millisecond
	DefaultMaxWait     = 5 * time.Second
)

// Attempt describes one attempt of a RoundTrip, for Options.OnAttempt.
type Attempt struct {
	// Request is the request sent, the key on it.
	Request *http.Request
	// N is the attempt's number, from 1.
	N int
	// Response is the attempt's response, nil on an error.
	Response *http.Response
	// Err is the attempt's error, nil when a response came back.
	Err error
	// Retry reports whether another attempt follows, after Wait.
	Retry bool
	// Wait is the time until the next attempt; 0 when none follows.
	Wait time.Duration
	// Reason says why no attempt follows when the status or error was one
	// that is retried: "attempts" (MaxAttempts reached), "elapsed"
	// (MaxElapsed or the request's deadline would pass during the wait),
	// "body" (a body that cannot be resent), "context" (the request's
	// context ended). Empty otherwise.
	Reason string
}

// config is Options validated, with defaults filled in.
type config struct {
	Options
	methods map[string]bool
}

func (o Options) config() (*config, error) {
	o.Header = cmp.Or(o.Header, DefaultHeader)
	if !isToken(o.Header) {
		return nil, badopt.Error("client", "Header", o.Header, "is not a header field name (an RFC 9110 token)")
	}
	o.Header = textproto.CanonicalMIMEHeaderKey(o.Header)
	for _, f := range []struct {
		name string
		v    time.Duration
		def  time.Duration
	}{{"MaxElapsed", o.MaxElapsed, DefaultMaxElapsed}, {"InitialWait", o.InitialWait, DefaultInitialWait}, {"MaxWait", o.MaxWait, DefaultMaxWait}} {
		if f.v < 0 {
			return nil, badopt.Default("client", f.name, f.v, f.def, "is negative")
		}
	}
	if o.MaxAttempts < 0 {
		return nil, badopt.Default("client", "MaxAttempts", o.MaxAttempts, DefaultMaxAttempts, "is negative")
	}
	o.MaxAttempts = cmp.Or(o.MaxAttempts, DefaultMaxAttempts)
	o.MaxElapsed = cmp.Or(o.MaxElapsed, DefaultMaxElapsed)
	o.InitialWait = cmp.Or(o.InitialWait, DefaultInitialWait)
	o.MaxWait = cmp.Or(o.MaxWait, DefaultMaxWait)
	if o.InitialWait > o.MaxWait {
		return nil, badopt.Error("client", "InitialWait", o.InitialWait, "is longer than MaxWait %v, which caps every wait", o.MaxWait)
	}
	if o.Base == nil {
		o.Base = http.DefaultTransport
	} else if nilcheck.Nil(o.Base) {
		return nil, badopt.Error("client", "Base", o.Base, "is nil and would panic on the first request; leave Base nil for the default, http.DefaultTransport")
	}
	methods := o.Methods
	if len(methods) == 0 {
		methods = []string{http.MethodPost, http.MethodPatch}
	}
	set := make(map[string]bool, len(methods))
	for _, m := range methods {
		switch {
		case !isToken(m):
			return nil, badopt.Error("client", "Methods", m, "is not a method (an RFC 9110 token)")
		case strings.ToUpper(m) != m:
			// Methods are case-sensitive and requests carry the standard
			// ones in upper case: "post" would cover nothing.
			return nil, badopt.Error("client", "Methods", m, "never matches a request; HTTP methods are case-sensitive, use %q", strings.ToUpper(m))
		case set[m]:
			return nil, badopt.Error("client", "Methods", m, "is listed twice")
		}
		set[m] = true
	}
	return &config{Options: o, methods: set}, nil
}

// isToken reports whether s is an RFC 9110 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
