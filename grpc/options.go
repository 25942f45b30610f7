package idemgrpc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/idemgo/idem"
	"google.golang.org/grpc/codes"
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
	// Metadata names the request metadata that carries the client's key:
	// a metadata key, in any case (gRPC sends keys in lower case), not
	// reserved by gRPC ("grpc-") and not binary ("-bin"). Default
	// "idempotency-key".
	Metadata string
	// KeyField names a request field that carries the key, as AIP-155's
	// request_id: a singular string field at the top level of the request
	// message, read by protoreflect. A request whose message has the field
	// set uses it (its metadata key is not read); one whose message lacks
	// the field, or leaves it empty, falls back to Metadata. Default "":
	// metadata only.
	KeyField string
	// Scope names the tenant the call acts for, taken from its
	// authenticated principal (a TLS client certificate, a verified token;
	// never from what the client merely claims), so that one tenant's key
	// never replays another's response: the record's key is the scope and
	// the client's key. An error that is a gRPC status is the call's
	// answer; any other, or an empty scope (which every call without a
	// principal would share), answers Unauthenticated, its text never
	// shown.
	// Set Scope or SingleTenant: NewServer refuses neither and both.
	// Default: none.
	Scope func(ctx context.Context, fullMethod string) (string, error)
	// SingleTenant states that the service has one tenant: every call
	// shares one scope, so that whoever sends a recorded key with the same
	// request receives its recorded response. Only for a service whose
	// callers all act for one party. Set Scope or SingleTenant. Default
	// false.
	SingleTenant bool
	// Methods are the full method names the interceptor covers
	// ("/package.Service/Method"), each listed once; others pass through
	// untouched. Default: every unary method.
	Methods []string
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
	// AlreadyExists with ErrorInfo reason ReasonResponseNotRecorded (the
	// work was done once; see Replays in the package documentation). With
	// a store that reports its MaxResultBytes (idem.MemoryStore,
	// idem.RedisStore, sqlstore.Store), NewServer refuses a MaxResponseBytes
	// that would not fit it with RecordOverhead beside. Default 512 KiB, or
	// less to fit the store's MaxResultBytes.
	MaxResponseBytes int
	// ReplayMetadata are the header and trailer metadata keys the handler
	// sets (grpc.SetHeader, grpc.SendHeader, grpc.SetTrailer) that are
	// recorded and replayed, each a metadata key listed once, in any case.
	// Keys reserved by gRPC ("grpc-"), those that carry credentials
	// (authorization, cookie, set-cookie, proxy-authenticate,
	// www-authenticate) and the interceptor's own (idempotent-*) may not be
	// listed. Default: none.
	ReplayMetadata []string
	// Keep reports whether an answer with this code is recorded. An answer
	// not kept releases the key, so that a retry runs the handler again:
	// keep only answers that a retry of the same call cannot change (see
	// Keep rules in the package documentation). Default: DefaultKeep.
	Keep func(codes.Code) bool
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
	DefaultMetadata         = "idempotency-key"
	DefaultLockTimeout      = 5 * time.Second
	DefaultRetryDelay       = time.Second
	DefaultMaxKeyBytes      = 255
	DefaultMaxResponseBytes = 512 << 10
	DefaultRecordTimeout    = 10 * time.Second
)

// RecordOverhead is the room a record takes besides the response message:
// its version, flags, the message's type name, and the replayed metadata,
// up to 8 KiB of them. NewServer checks that MaxResponseBytes and
// RecordOverhead fit the store's MaxResultBytes together. A response whose
// replayed metadata is larger still is recorded without its message when
// the whole would not fit.
const RecordOverhead = 8 << 10

// neverReplayed are metadata keys that carry credentials or challenges: a
// replay goes to whoever holds the key in the scope.
var neverReplayed = []string{"authorization", "cookie", "set-cookie", "proxy-authenticate", "www-authenticate"}

// serverConfig is ServerOptions validated, with defaults filled in.
type serverConfig struct {
	ServerOptions
	methods   map[string]bool // nil: every method
	replay    []string        // lower case
	maxResult int             // the store's MaxResultBytes, 0 when it does not report one
}

func (o ServerOptions) config() (*serverConfig, error) {
	for _, f := range []struct {
		name string
		v    any
	}{{"Store", o.Store}, {"Observer", o.Observer}} {
		// An interface holding a nil pointer is not == nil: it would pass
		// for set and panic on the first call, far from the mistake.
		if f.v != nil && isNil(f.v) {
			return nil, fmt.Errorf("idemgrpc: ServerOptions.%s: (%T)(nil) is nil and would panic on the first call", f.name, f.v)
		}
	}
	if o.Store == nil {
		return nil, errors.New("idemgrpc: ServerOptions.Store: nil is not a store; set an idem.Store (idem.NewRedisStore, sqlstore.New, idem.NewMemoryStore)")
	}
	switch {
	case o.Scope == nil && !o.SingleTenant:
		// One scope for every call by default would let a client that
		// learns another's key receive its recorded response.
		return nil, errors.New("idemgrpc: ServerOptions.Scope: nil while SingleTenant is false; set Scope to name each call's tenant from its authenticated principal, or SingleTenant: true when the service has one tenant")
	case o.Scope != nil && o.SingleTenant:
		return nil, errors.New("idemgrpc: ServerOptions.SingleTenant: true while Scope is set; set one: Scope names each call's tenant, SingleTenant says there is one")
	}
	var err error
	if o.Metadata, err = metadataName("ServerOptions.Metadata", cmp.Or(o.Metadata, DefaultMetadata)); err != nil {
		return nil, err
	}
	if o.KeyField != "" && !isIdent(o.KeyField) {
		return nil, fmt.Errorf("idemgrpc: ServerOptions.KeyField: %q is not a protobuf field name (a letter or _, then letters, digits or _)", o.KeyField)
	}
	for _, d := range []struct {
		name     string
		v, def   time.Duration
		max      time.Duration
		maxWords string
	}{
		{"LockTimeout", o.LockTimeout, DefaultLockTimeout, 0, ""},
		{"RecordTimeout", o.RecordTimeout, DefaultRecordTimeout, 0, ""},
		{"RetryDelay", o.RetryDelay, DefaultRetryDelay, time.Hour, "1h"},
	} {
		if d.v < 0 || (d.max > 0 && d.v > d.max) {
			rule := "is negative"
			if d.v >= 0 {
				rule = "is over " + d.maxWords
			}
			return nil, fmt.Errorf("idemgrpc: ServerOptions.%s: %v %s; 0 means the default, %v", d.name, d.v, rule, d.def)
		}
	}
	if o.MaxKeyBytes < 0 {
		return nil, fmt.Errorf("idemgrpc: ServerOptions.MaxKeyBytes: %d is negative; 0 means the default, %d", o.MaxKeyBytes, DefaultMaxKeyBytes)
	}
	if o.MaxResponseBytes < 0 {
		return nil, fmt.Errorf("idemgrpc: ServerOptions.MaxResponseBytes: %d is negative; 0 means the default, %d", o.MaxResponseBytes, DefaultMaxResponseBytes)
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
	if c.methods, err = methodSet("ServerOptions.Methods", o.Methods); err != nil {
		return nil, err
	}
	for _, k := range o.ReplayMetadata {
		name, err := metadataName("ServerOptions.ReplayMetadata", k)
		if err != nil {
			return nil, err
		}
		switch {
		case slices.Contains(neverReplayed, name):
			return nil, fmt.Errorf("idemgrpc: ServerOptions.ReplayMetadata: %q may not be replayed: it carries credentials", k)
		case strings.HasPrefix(name, "idempotent-"):
			return nil, fmt.Errorf("idemgrpc: ServerOptions.ReplayMetadata: %q is the interceptor's own (idempotent-*), set on every replay", k)
		case slices.Contains(c.replay, name):
			return nil, fmt.Errorf("idemgrpc: ServerOptions.ReplayMetadata: %q is listed twice", k)
		}
		c.replay = append(c.replay, name)
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
		return 0, fmt.Errorf("idemgrpc: ServerOptions.Store: %T with MaxResultBytes %d leaves no room for a response beside RecordOverhead %d; give the store a MaxResultBytes above %d", o.Store, maxResult, RecordOverhead, RecordOverhead)
	case o.MaxResponseBytes == 0:
		o.MaxResponseBytes = min(DefaultMaxResponseBytes, room)
	case o.MaxResponseBytes > room:
		return 0, fmt.Errorf("idemgrpc: ServerOptions.MaxResponseBytes: %d exceeds the store's MaxResultBytes %d less RecordOverhead %d; at most %d", o.MaxResponseBytes, maxResult, RecordOverhead, room)
	}
	return maxResult, nil
}

// metadataName checks a metadata key given for field and returns it in
// lower case, as gRPC sends it.
func metadataName(field, k string) (string, error) {
	name := strings.ToLower(k)
	switch {
	case name == "" || strings.Trim(name, "0123456789abcdefghijklmnopqrstuvwxyz-_.") != "":
		return "", fmt.Errorf("idemgrpc: %s: %q is not a metadata key (letters, digits, '-', '_' and '.')", field, k)
	case strings.HasPrefix(name, "grpc-"):
		return "", fmt.Errorf("idemgrpc: %s: %q is reserved by gRPC (grpc-*)", field, k)
	case strings.HasSuffix(name, "-bin"):
		return "", fmt.Errorf("idemgrpc: %s: %q is a binary metadata key (-bin); a key and its replays are text", field, k)
	}
	return name, nil
}

// methodSet checks a list of full method names given for field and
// returns them as a set, nil for an empty list (every method).
func methodSet(field string, methods []string) (map[string]bool, error) {
	if len(methods) == 0 {
		return nil, nil
	}
	set := make(map[string]bool, len(methods))
	for _, m := range methods {
		svc, name, ok := strings.Cut(strings.TrimPrefix(m, "/"), "/")
		switch {
		case !strings.HasPrefix(m, "/") || !ok || svc == "" || name == "" || strings.Contains(name, "/"):
			return nil, fmt.Errorf("idemgrpc: %s: %q is not a full method name, /package.Service/Method", field, m)
		case set[m]:
			return nil, fmt.Errorf("idemgrpc: %s: %q is listed twice", field, m)
		}
		set[m] = true
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
