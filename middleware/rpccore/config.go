package rpccore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/badopt"
	"github.com/idemgo/idem/internal/nilcheck"
	"github.com/idemgo/idem/middleware/rpccode"
)

// Defaults of the front doors' options, the same for each.
const (
	DefaultLockTimeout      = 5 * time.Second
	DefaultRetryDelay       = time.Second
	DefaultMaxKeyBytes      = 255
	DefaultMaxResponseBytes = 512 << 10
	DefaultRecordTimeout    = 10 * time.Second
	DefaultMaxAttempts      = 5
	DefaultMaxElapsed       = 30 * time.Second
	DefaultInitialWait      = 100 * time.Millisecond
	DefaultMaxWait          = 5 * time.Second
)

// RecordOverhead is the room a record takes besides the response message:
// its version, flags, the message's type name, and the replayed metadata,
// up to 8 KiB of them. New checks that MaxResponseBytes and RecordOverhead
// fit the store's MaxResultBytes together.
const RecordOverhead = 8 << 10

// Frame is a front door as the core sees it: the words of its messages
// and the names of its options, and what the core needs of its framework.
// A front door fills one in, for its server's Config and its client's
// ClientConfig alike.
type Frame struct {
	// Pkg is the front door's package name, first in every message
	// ("idemgrpc").
	Pkg string
	// KeyOption names the options' field that names the key's metadata
	// ("Metadata", "Header"), DefaultKey its default; KeyWhere says where
	// the key goes, in the answer to a call without one, %s standing for
	// its name ("%s metadata").
	KeyOption, DefaultKey, KeyWhere string
	// Noun is what the framework calls a method ("method", "procedure");
	// MethodsField and ReplayField name the fields of the options that
	// list methods and replayed metadata; MethodName is what an entry of
	// MethodsField must be ("full method name").
	Noun, MethodsField, MethodName, ReplayField string
	// Name checks a metadata name given for field (the key's, a replayed
	// one) and returns it as the front door spells it (lower case for
	// gRPC metadata, canonical for HTTP headers), or the error naming
	// field.
	Name func(field, name string) (string, error)

	// Error turns a Status into the framework's error.
	Error func(*Status) error
	// Status reads the framework's error as a Status: its code, message
	// and details; an error the framework did not make is Unknown, with
	// its text.
	Status func(error) *Status
	// Code is Status's code, without a copy of the details.
	Code func(error) Code
	// IsAnswer reports whether err is already the framework's answer (a
	// gRPC status, a *connect.Error): a Scope's error passed on as it is.
	IsAnswer func(error) bool
	// ContextError is the answer to a call whose context ended: the
	// context's code, with cause's text (ctx.Err() on the server's side).
	ContextError func(ctx context.Context, cause error) error
	// CodeName is a code's name in the framework's words, for logs.
	CodeName func(Code) string
	// Transport reports whether a client's attempt failed in the
	// transport, with no answer of the server (an outcome unknown,
	// retried with the key); nil: none does.
	Transport func(error) bool
	// Proto is the protobuf runtime, for the server's messages.
	Proto Proto
}

// Resolution is Resolution of m, a protobuf message (its full type name
// and encoding, by Proto), for the front doors' Resolution functions. It
// refuses a nil message, which is a mistake, not an answer.
func (f *Frame) Resolution(m any, header, trailer Metadata) (idem.Resolution, error) {
	if nilcheck.Nil(m) {
		return idem.Resolution{}, errors.New(f.Pkg + ": Resolution: a nil message; give the response to replay, an empty one if that is the answer")
	}
	name, _, err := f.Proto.Describe(m)
	var body []byte
	if err == nil {
		body, err = f.Proto.Append(nil, m, false)
	}
	if err != nil {
		return idem.Resolution{}, fmt.Errorf("%s: Resolution: %w", f.Pkg, err)
	}
	return Resolution(name, body, header, trailer)
}

// Config is a server interceptor's options as the core takes them: the
// front door's ServerOptions, field for field, and its Frame. Zero values
// mean the documented defaults of the front doors' ServerOptions (the
// Default constants); the front doors' fields of these names are
// documented here.
type Config struct {
	// Frame is the front door's.
	Frame
	// KeyName names the metadata (the header) that carries the client's
	// key, as ServerOptions.Metadata (Header) gives it: in any case, not
	// one the framework reserves, and not binary. Default: DefaultKey.
	KeyName string

	// Store holds the records: any idem.Store. Required.
	Store idem.Store
	// Scoped says the front door's Scope is set: it names the tenant a
	// call acts for, from its authenticated principal (what an
	// authenticating interceptor put in the context; never what the client
	// merely claims), so that one tenant's key never replays another's
	// response: the record's key is the scope and the client's key. An
	// error the framework's (IsAnswer) is the call's answer; any other, or
	// an empty scope (which every call without a principal would share),
	// answers Unauthenticated, its text never shown. Exactly one of Scoped
	// and SingleTenant.
	Scoped bool
	// SingleTenant states that the service has one tenant: every call
	// shares one scope, and whoever sends a recorded key with the same
	// request receives its recorded response. Default false.
	SingleTenant bool
	// KeyField names a singular string field at the top level of the
	// request message that carries the key, as AIP-155's request_id;
	// where it is unset or empty, the key's metadata is read. Default "":
	// the metadata only.
	KeyField string
	// Methods are the full method names covered ("/package.Service/Method",
	// Connect's procedures), each listed once; others pass through
	// untouched. Default: every unary method.
	Methods []string
	// Required answers InvalidArgument to a covered call without a key
	// instead of passing it through. Default false.
	Required bool
	// LockTimeout bounds the wait for a call of the same key in flight,
	// before Aborted with RetryInfo. Default 5s.
	LockTimeout time.Duration
	// RetryDelay is the RetryInfo delay of an Aborted (key in flight) or
	// Unavailable (store down) answer: a short poll, not the holder's
	// lease end. At most 1h. Default 1s.
	RetryDelay time.Duration
	// MaxKeyBytes bounds the client's key, in bytes; the store's own
	// MaxKeyBytes bounds the record's key (scope and client key). Default
	// 255.
	MaxKeyBytes int
	// MaxResponse (MaxResponseBytes) bounds the encoded response message
	// recorded for replay; a longer one is sent whole and recorded as done
	// without it. New refuses one that does not fit the store's
	// MaxResultBytes (where the store reports it) with RecordOverhead.
	// Default 512 KiB, or less to fit the store's MaxResultBytes with
	// RecordOverhead.
	MaxResponse int
	// Replay are the metadata names the handler sets that are recorded
	// and replayed, each listed once, in any case; never those the
	// framework reserves (Name refuses them), those carrying credentials
	// (authorization, cookie, set-cookie, proxy-authenticate,
	// www-authenticate) nor the interceptor's own (idempotent-*). Default:
	// none.
	Replay []string
	// Keep reports whether an answer with this code is recorded. An answer
	// not kept releases the key, so that a retry runs the handler again:
	// keep only answers that a retry of the same call cannot change.
	// Default: KeepDefault, package rpccode's rules.
	Keep func(Code) bool
	// RecordTimeout bounds the Claim before the handler and the Confirm or
	// Forget after it, retries included: they run detached from the
	// call's cancellation and never retry past the lease's end. Default
	// 10s.
	RecordTimeout time.Duration
	// Logger receives the errors the interceptor answers (level Error for
	// Unavailable and Internal, Info otherwise) and what it cannot tell
	// the client (an answer not recorded, work done twice); keys as their
	// KeyHasher hash, never raw. Default: none.
	Logger *slog.Logger
	// Observer receives one idem.Event, Op idem.OpRequest, per call acted
	// on (see the package documentation); an idem.Starter is started
	// first. Default: none.
	Observer idem.Observer
	// KeyHasher hashes keys for the Logger and the Observer; give it the
	// store's. Default: the process's (idem.KeyHash).
	KeyHasher *idem.KeyHasher
}

// neverReplayed are metadata names that carry credentials or challenges: a
// replay goes to whoever holds the key in the scope.
var neverReplayed = []string{"authorization", "cookie", "set-cookie", "proxy-authenticate", "www-authenticate"}

// Server is the server half of the core: a front door's options checked,
// and what every covered call does (Serve). Create it with New; it is safe
// for concurrent use.
type Server struct {
	c         Config
	methods   map[string]bool // nil: every method
	names     []string        // replayed, as the front door spells them
	lower     []string        // in lower case, as recorded
	canon     []string        // in canonical form
	maxResult int             // the store's MaxResultBytes, 0 when it does not report one
	where     string          // KeyWhere, with the key's name
	panicked  error
}

// New checks c, fills in its defaults and returns the Server, or the error
// naming the ServerOptions field at fault: a key's name that Name refuses
// (reserved, binary, not a name), a nil or typed-nil Store or
// Observer, neither or both of Scope and SingleTenant, a KeyField that is
// not a protobuf name, a negative duration or size, a RetryDelay over 1h,
// a MaxResponseBytes the store cannot record, a method listed twice or
// malformed, a replayed name that is a credential, the interceptor's own
// or listed twice.
func New(c Config) (*Server, error) {
	pkg := c.Pkg
	name, err := c.Name("ServerOptions."+c.KeyOption, cmp.Or(c.KeyName, c.DefaultKey))
	if err != nil {
		return nil, err
	}
	c.KeyName = name
	for _, f := range []struct {
		name string
		v    any
	}{{"Store", c.Store}, {"Observer", c.Observer}} {
		// An interface holding a nil pointer is not == nil: it would pass
		// for set and panic on the first call, far from the mistake.
		if f.v != nil && nilcheck.Nil(f.v) {
			return nil, badopt.Error(pkg, "ServerOptions."+f.name, f.v, "is nil and would panic on the first call")
		}
	}
	switch {
	case c.Store == nil:
		return nil, badopt.Error(pkg, "ServerOptions.Store", nil, "is not a store; set an idem.Store (idem.NewRedisStore, sqlstore.New, idem.NewMemoryStore)")
	case !c.Scoped && !c.SingleTenant:
		// One scope for every call by default would let a client that
		// learns another's key receive its recorded response.
		return nil, badopt.Error(pkg, "ServerOptions.Scope", nil, "while SingleTenant is false; set Scope to name each call's tenant from its authenticated principal, or SingleTenant: true when the service has one tenant")
	case c.Scoped && c.SingleTenant:
		return nil, badopt.Error(pkg, "ServerOptions.SingleTenant", true, "while Scope is set; set one: Scope names each call's tenant, SingleTenant says there is one")
	case c.KeyField != "" && !IsIdent(c.KeyField):
		return nil, badopt.Error(pkg, "ServerOptions.KeyField", c.KeyField, "is not a protobuf field name (a letter or _, then letters, digits or _)")
	}
	for _, d := range []struct {
		name   string
		v, def time.Duration
		max    time.Duration
	}{
		{"LockTimeout", c.LockTimeout, DefaultLockTimeout, 0},
		{"RecordTimeout", c.RecordTimeout, DefaultRecordTimeout, 0},
		{"RetryDelay", c.RetryDelay, DefaultRetryDelay, time.Hour},
	} {
		switch {
		case d.v < 0:
			return nil, badopt.Default(pkg, "ServerOptions."+d.name, d.v, d.def, "is negative")
		case d.max > 0 && d.v > d.max:
			return nil, badopt.Default(pkg, "ServerOptions."+d.name, d.v, d.def, "is over 1h")
		}
	}
	for _, n := range []struct {
		name   string
		v, def int
	}{{"MaxKeyBytes", c.MaxKeyBytes, DefaultMaxKeyBytes}, {"MaxResponseBytes", c.MaxResponse, DefaultMaxResponseBytes}} {
		if n.v < 0 {
			return nil, badopt.Default(pkg, "ServerOptions."+n.name, n.v, n.def, "is negative")
		}
	}
	c.LockTimeout = cmp.Or(c.LockTimeout, DefaultLockTimeout)
	c.RecordTimeout = cmp.Or(c.RecordTimeout, DefaultRecordTimeout)
	c.RetryDelay = cmp.Or(c.RetryDelay, DefaultRetryDelay)
	c.MaxKeyBytes = cmp.Or(c.MaxKeyBytes, DefaultMaxKeyBytes)
	if c.Keep == nil {
		c.Keep = KeepDefault
	}
	s := &Server{panicked: errors.New(pkg + ": a Scope func panicked"), where: strings.ReplaceAll(c.KeyWhere, "%s", name)}
	if s.maxResult, err = c.fitResponse(); err != nil {
		return nil, err
	}
	if s.methods, err = MethodSet(pkg, "ServerOptions."+c.MethodsField, c.MethodName, c.Methods); err != nil {
		return nil, err
	}
	field := "ServerOptions." + c.ReplayField
	for _, k := range c.Replay {
		name, err := c.Name(field, k)
		if err != nil {
			return nil, err
		}
		lower := strings.ToLower(name)
		switch {
		case slices.Contains(neverReplayed, lower):
			return nil, badopt.Error(pkg, field, k, "may not be replayed: it carries credentials")
		case strings.HasPrefix(lower, "idempotent-"):
			return nil, badopt.Error(pkg, field, k, "is the interceptor's own (idempotent-*), set on every replay")
		case slices.Contains(s.lower, lower):
			return nil, badopt.Error(pkg, field, k, "is listed twice")
		}
		s.names, s.lower = append(s.names, name), append(s.lower, lower)
	}
	s.canon = canonical(s.lower)
	s.c = c
	return s, nil
}

// KeepDefault is Keep of package rpccode, the keep rules of every RPC front
// door: OK and InvalidArgument.
func KeepDefault(c Code) bool { return rpccode.Keep(c) }

// KeyName is the name of the key's metadata, as the front door spells it.
func (s *Server) KeyName() string { return s.c.KeyName }

// Covers reports whether calls of method are covered: listed in Methods,
// or Methods empty.
func (s *Server) Covers(method string) bool { return s.methods == nil || s.methods[method] }

// resultLimiter is a store that reports the largest result it records:
// idem.MemoryStore, idem.RedisStore and sqlstore.Store are.
type resultLimiter interface{ MaxResultBytes() int }

// fitResponse sets MaxResponse, when zero, to its default or less, so that
// a message of that size and RecordOverhead fit the store's
// MaxResultBytes, and refuses one set above that. It returns the store's
// MaxResultBytes, 0 when the store does not report it.
func (c *Config) fitResponse() (int, error) {
	l, ok := c.Store.(resultLimiter)
	if !ok {
		c.MaxResponse = cmp.Or(c.MaxResponse, DefaultMaxResponseBytes)
		return 0, nil
	}
	maxResult := l.MaxResultBytes()
	room := maxResult - RecordOverhead
	switch {
	case room <= 0:
		return 0, fmt.Errorf("%s: ServerOptions.Store: %T with MaxResultBytes %d leaves no room for a response beside RecordOverhead %d; give the store a MaxResultBytes above %d", c.Pkg, c.Store, maxResult, RecordOverhead, RecordOverhead)
	case c.MaxResponse == 0:
		c.MaxResponse = min(DefaultMaxResponseBytes, room)
	case c.MaxResponse > room:
		return 0, fmt.Errorf("%s: ServerOptions.MaxResponseBytes: %d exceeds the store's MaxResultBytes %d less RecordOverhead %d; at most %d", c.Pkg, c.MaxResponse, maxResult, RecordOverhead, room)
	}
	return maxResult, nil
}

// MethodSet checks a list of full method names given for field (of
// package pkg; name is what each must be, in its message) and returns them
// as a set, nil for an empty list (every method).
func MethodSet(pkg, field, name string, methods []string) (map[string]bool, error) {
	if len(methods) == 0 {
		return nil, nil
	}
	set := make(map[string]bool, len(methods))
	for _, m := range methods {
		svc, meth, ok := strings.Cut(strings.TrimPrefix(m, "/"), "/")
		switch {
		case !strings.HasPrefix(m, "/") || !ok || svc == "" || meth == "" || strings.Contains(meth, "/"):
			return nil, badopt.Error(pkg, field, m, "is not a %s, /package.Service/Method", name)
		case set[m]:
			return nil, badopt.Error(pkg, field, m, "is listed twice")
		}
		set[m] = true
	}
	return set, nil
}
