package idemconnect

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/idemgo/idem"
)

// ServerOptions configure the server interceptor. The zero value of every
// field means its documented default; Store must be set, and exactly one
// of Scope and SingleTenant. NewServer refuses a mistake in any field with
// an error that names the field.
type ServerOptions struct {
	// Store holds the records: a call claims its key under a lease, the
	// handler runs under KeepAlive, and its response is confirmed. Any
	// idem.Store. Required.
	Store idem.Store
	// Header names the request header that carries the client's key (gRPC
	// metadata on the gRPC protocols): a header field name, in any case,
	// not one of the protocols' own (Connect-*, Grpc-*, Content-*, ...).
	// Default "Idempotency-Key".
	Header string
	// KeyField names a request field that carries the key, as AIP-155's
	// request_id: a singular string field at the top level of the request
	// message, read by protoreflect. A request whose message has the field
	// set uses it (its header is not read); one whose message lacks the
	// field, or leaves it empty, falls back to Header. Default "": the
	// header only.
	KeyField string
	// Scope names the tenant the call acts for, taken from its
	// authenticated principal (what an authenticating interceptor or HTTP
	// middleware around put in ctx; never what the client merely claims),
	// so that one tenant's key never replays another's response: the
	// record's key is the scope and the client's key. An error that is a
	// *connect.Error is the call's answer; any other, or an empty scope
	// (which every call without a principal would share), answers
	// Unauthenticated, its text never shown. Set Scope or SingleTenant:
	// NewServer refuses neither and both. Default: none.
	Scope func(ctx context.Context, req connect.AnyRequest) (string, error)
	// SingleTenant states that the service has one tenant: every call
	// shares one scope, so that whoever sends a recorded key with the same
	// request receives its recorded response. Only for a service whose
	// callers all act for one party. Set Scope or SingleTenant. Default
	// false.
	SingleTenant bool
	// Procedures are the procedures the interceptor covers
	// ("/package.Service/Method"), each listed once; others pass through
	// untouched. A procedure declared NO_SIDE_EFFECTS (connect's
	// IdempotencyNoSideEffects) is never covered: it changes nothing, so
	// a retry of it is safe without a key. Default: every unary procedure.
	Procedures []string
	// Required answers InvalidArgument to a covered call without a key
	// instead of passing it through. Default false.
	Required bool
	// LockTimeout bounds how long a call waits for another call of the same
	// key in flight before answering Aborted with RetryInfo. Default 5s.
	LockTimeout time.Duration
	// RetryDelay is the RetryInfo delay of an Aborted (the key in flight)
	// and an Unavailable (the store down) answer: a short poll, not the
	// holder's lease end. At most 1h. Default 1s.
	RetryDelay time.Duration
	// MaxKeyBytes bounds the client's key, in bytes; a longer one is
	// InvalidArgument. The store's own MaxKeyBytes bounds the whole record
	// key (scope and client key). Default 255.
	MaxKeyBytes int
	// MaxResponseBytes bounds the encoded response message that is
	// recorded for replay. A longer response is still sent whole and
	// recorded as done without the message: its replays answer
	// AlreadyExists with ErrorInfo reason ReasonResponseNotRecorded. With
	// a store that reports its MaxResultBytes (idem.MemoryStore,
	// idem.RedisStore, sqlstore.Store), NewServer refuses a MaxResponseBytes
	// that would not fit it with RecordOverhead beside. Default 512 KiB, or
	// less to fit the store's MaxResultBytes.
	MaxResponseBytes int
	// ReplayHeaders are the response headers and trailers the handler sets
	// (Response.Header, Response.Trailer, an error's Meta, or the handler
	// context's connect.CallInfo) that are
	// recorded and replayed, each a header field name listed once, in any
	// case. The protocols' own headers, those that carry credentials
	// (Authorization, Cookie, Set-Cookie, Proxy-Authenticate,
	// WWW-Authenticate) and the interceptor's own (Idempotent-*) may not be
	// listed. Default: none.
	ReplayHeaders []string
	// Keep reports whether an answer with this code is recorded; 0 is a
	// success (Connect has no constant for it). An answer not kept
	// releases the key, so that a retry runs the handler again: keep only
	// answers that a retry of the same call cannot change. Default:
	// DefaultKeep, the gRPC module's rules (package rpccode).
	Keep func(connect.Code) bool
	// RecordTimeout bounds the Claim before the handler and the store
	// calls that record (Confirm) or release (Forget) the key after it,
	// retries included; they run detached from the call's cancellation
	// (a Claim cut off may have been applied) and never retry past the
	// lease's end. Default 10s.
	RecordTimeout time.Duration
	// Logger receives one line per error the interceptor answers (level
	// Error for Unavailable and Internal, Info otherwise) and what it
	// cannot tell the client: a response that could not be recorded, a key
	// that could not be released, work done twice. Keys appear as their
	// KeyHasher hash, never raw. Default: none.
	Logger *slog.Logger
	// Observer receives one idem.Event, Op idem.OpRequest, per call the
	// interceptor acts on, after the handler or the replay; an idem.Starter
	// is started first, so that the store's and the handler's spans nest
	// in the call's. See Observing in the package documentation. Default:
	// none, and nothing is measured.
	Observer idem.Observer
	// KeyHasher hashes keys for the Logger and the Observer. Give it the
	// store's (idem.Options.KeyHasher) so that a call's events and log
	// lines correlate with its store operations. Default: the process's
	// (idem.KeyHash).
	KeyHasher *idem.KeyHasher
}

// Defaults of ServerOptions and ClientOptions.
const (
	DefaultHeader           = "Idempotency-Key"
	DefaultLockTimeout      = 5 * time.Second
	DefaultRetryDelay       = time.Second
	DefaultMaxKeyBytes      = 255
	DefaultMaxResponseBytes = 512 << 10
	DefaultRecordTimeout    = 10 * time.Second
)

// RecordOverhead is the room a record takes besides the response message:
// its version, flags, the message's type name, and the replayed headers,
// up to 8 KiB of them. NewServer checks that MaxResponseBytes and
// RecordOverhead fit the store's MaxResultBytes together.
const RecordOverhead = 8 << 10

// neverReplayed are headers that carry credentials or challenges: a replay
// goes to whoever holds the key in the scope.
var neverReplayed = []string{"authorization", "cookie", "set-cookie", "proxy-authenticate", "www-authenticate"}

// serverConfig is ServerOptions validated, with defaults filled in.
type serverConfig struct {
	ServerOptions
	procedures map[string]bool // nil: every procedure
	replay     []string        // lower case, as recorded
	maxResult  int             // the store's MaxResultBytes, 0 when it does not report one
}

func (o ServerOptions) config() (*serverConfig, error) {
	for _, f := range []struct {
		name string
		v    any
	}{{"Store", o.Store}, {"Observer", o.Observer}} {
		// An interface holding a nil pointer is not == nil: it would pass
		// for set and panic on the first call, far from the mistake.
		if f.v != nil && isNil(f.v) {
			return nil, fmt.Errorf("idemconnect: ServerOptions.%s: (%T)(nil) is nil and would panic on the first call", f.name, f.v)
		}
	}
	if o.Store == nil {
		return nil, errors.New("idemconnect: ServerOptions.Store: nil is not a store; set an idem.Store (idem.NewRedisStore, sqlstore.New, idem.NewMemoryStore)")
	}
	switch {
	case o.Scope == nil && !o.SingleTenant:
		// One scope for every call by default would let a client that
		// learns another's key receive its recorded response.
		return nil, errors.New("idemconnect: ServerOptions.Scope: nil while SingleTenant is false; set Scope to name each call's tenant from its authenticated principal, or SingleTenant: true when the service has one tenant")
	case o.Scope != nil && o.SingleTenant:
		return nil, errors.New("idemconnect: ServerOptions.SingleTenant: true while Scope is set; set one: Scope names each call's tenant, SingleTenant says there is one")
	}
	var err error
	if o.Header, err = headerName("ServerOptions.Header", cmp.Or(o.Header, DefaultHeader)); err != nil {
		return nil, err
	}
	if o.KeyField != "" && !isIdent(o.KeyField) {
		return nil, fmt.Errorf("idemconnect: ServerOptions.KeyField: %q is not a protobuf field name (a letter or _, then letters, digits or _)", o.KeyField)
	}
	for _, d := range []struct {
		name   string
		v, def time.Duration
		max    time.Duration
	}{
		{"LockTimeout", o.LockTimeout, DefaultLockTimeout, 0},
		{"RecordTimeout", o.RecordTimeout, DefaultRecordTimeout, 0},
		{"RetryDelay", o.RetryDelay, DefaultRetryDelay, time.Hour},
	} {
		switch {
		case d.v < 0:
			return nil, fmt.Errorf("idemconnect: ServerOptions.%s: %v is negative; 0 means the default, %v", d.name, d.v, d.def)
		case d.max > 0 && d.v > d.max:
			return nil, fmt.Errorf("idemconnect: ServerOptions.%s: %v is over %v; 0 means the default, %v", d.name, d.v, d.max, d.def)
		}
	}
	if o.MaxKeyBytes < 0 {
		return nil, fmt.Errorf("idemconnect: ServerOptions.MaxKeyBytes: %d is negative; 0 means the default, %d", o.MaxKeyBytes, DefaultMaxKeyBytes)
	}
	if o.MaxResponseBytes < 0 {
		return nil, fmt.Errorf("idemconnect: ServerOptions.MaxResponseBytes: %d is negative; 0 means the default, %d", o.MaxResponseBytes, DefaultMaxResponseBytes)
	}
	o.LockTimeout = cmp.Or(o.LockTimeout, DefaultLockTimeout)
	o.RecordTimeout = cmp.Or(o.RecordTimeout, DefaultRecordTimeout)
	o.RetryDelay = cmp.Or(o.RetryDelay, DefaultRetryDelay)
	o.MaxKeyBytes = cmp.Or(o.MaxKeyBytes, DefaultMaxKeyBytes)
	maxResult, err := o.fitResponse()
	if err != nil {
		return nil, err
	}
	if o.Keep == nil {
		o.Keep = DefaultKeep
	}
	c := &serverConfig{maxResult: maxResult}
	if c.procedures, err = procedureSet("ServerOptions.Procedures", o.Procedures); err != nil {
		return nil, err
	}
	for _, k := range o.ReplayHeaders {
		name, err := headerName("ServerOptions.ReplayHeaders", k)
		if err != nil {
			return nil, err
		}
		lower := strings.ToLower(name)
		switch {
		case slices.Contains(neverReplayed, lower):
			return nil, fmt.Errorf("idemconnect: ServerOptions.ReplayHeaders: %q may not be replayed: it carries credentials", k)
		case strings.HasPrefix(lower, "idempotent-"):
			return nil, fmt.Errorf("idemconnect: ServerOptions.ReplayHeaders: %q is the interceptor's own (Idempotent-*), set on every replay", k)
		case slices.Contains(c.replay, lower):
			return nil, fmt.Errorf("idemconnect: ServerOptions.ReplayHeaders: %q is listed twice", k)
		}
		c.replay = append(c.replay, lower)
	}
	c.ServerOptions = o
	return c, nil
}

// resultLimiter is a store that reports the largest result it records:
// idem.MemoryStore, idem.RedisStore and sqlstore.Store are.
type resultLimiter interface{ MaxResultBytes() int }

// fitResponse sets MaxResponseBytes, when zero, to its default or less, so
// that a message of that size and RecordOverhead fit the store's
// MaxResultBytes, and refuses one set above that. It returns the store's
// MaxResultBytes, 0 when the store does not report it.
func (o *ServerOptions) fitResponse() (int, error) {
	l, ok := o.Store.(resultLimiter)
	if !ok {
		o.MaxResponseBytes = cmp.Or(o.MaxResponseBytes, DefaultMaxResponseBytes)
		return 0, nil
	}
	maxResult := l.MaxResultBytes()
	room := maxResult - RecordOverhead
	switch {
	case room <= 0:
		return 0, fmt.Errorf("idemconnect: ServerOptions.Store: %T with MaxResultBytes %d leaves no room for a response beside RecordOverhead %d; give the store a MaxResultBytes above %d", o.Store, maxResult, RecordOverhead, RecordOverhead)
	case o.MaxResponseBytes == 0:
		o.MaxResponseBytes = min(DefaultMaxResponseBytes, room)
	case o.MaxResponseBytes > room:
		return 0, fmt.Errorf("idemconnect: ServerOptions.MaxResponseBytes: %d exceeds the store's MaxResultBytes %d less RecordOverhead %d; at most %d", o.MaxResponseBytes, maxResult, RecordOverhead, room)
	}
	return maxResult, nil
}

// protocolHeaders are prefixes and names the Connect, gRPC and gRPC-Web
// protocols use themselves: a key or a replayed header there would be
// read, or overwritten, by the protocol.
var protocolHeaders = []string{"connect-", "grpc-", "content-", "accept-encoding", "te", "trailer", "transfer-encoding", "host", "user-agent", "x-user-agent", "x-grpc-web"}

// headerName checks a header field name given for field and returns it in
// canonical form.
func headerName(field, k string) (string, error) {
	lower := strings.ToLower(k)
	if lower == "" || strings.Trim(lower, "0123456789abcdefghijklmnopqrstuvwxyz-_.!#$%&'*+^`|~") != "" {
		return "", fmt.Errorf("idemconnect: %s: %q is not a header field name (an RFC 9110 token)", field, k)
	}
	for _, p := range protocolHeaders {
		if lower == p || (strings.HasSuffix(p, "-") && strings.HasPrefix(lower, p)) {
			return "", fmt.Errorf("idemconnect: %s: %q is the protocols' own (%s)", field, k, p)
		}
	}
	if strings.HasSuffix(lower, "-bin") {
		return "", fmt.Errorf("idemconnect: %s: %q is binary metadata (-bin) on the gRPC protocols; a key and its replays are text", field, k)
	}
	return http.CanonicalHeaderKey(k), nil
}

// procedureSet checks a list of procedures given for field and returns
// them as a set, nil for an empty list (every procedure).
func procedureSet(field string, procedures []string) (map[string]bool, error) {
	if len(procedures) == 0 {
		return nil, nil
	}
	set := make(map[string]bool, len(procedures))
	for _, p := range procedures {
		svc, name, ok := strings.Cut(strings.TrimPrefix(p, "/"), "/")
		switch {
		case !strings.HasPrefix(p, "/") || !ok || svc == "" || name == "" || strings.Contains(name, "/"):
			return nil, fmt.Errorf("idemconnect: %s: %q is not a procedure, /package.Service/Method", field, p)
		case set[p]:
			return nil, fmt.Errorf("idemconnect: %s: %q is listed twice", field, p)
		}
		set[p] = true
	}
	return set, nil
}

// isIdent reports whether s is a protobuf identifier.
func isIdent(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return s != ""
}

// isNil reports whether v is nil or an interface holding a nil pointer,
// map, slice, channel or func.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch r := reflect.ValueOf(v); r.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Chan, reflect.Func, reflect.Interface:
		return r.IsNil()
	}
	return false
}
