package idemconnect

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/middleware/rpccode"
	"github.com/idemgo/idem/middleware/rpccore"
)

// ServerOptions configure the server interceptor. The zero value of every
// field means its documented default; Store must be set, and exactly one
// of Scope and SingleTenant. NewServer refuses a mistake in any field with
// an error that names the field. Each field is the RPC core's of its name
// (rpccore.Config; Scope its Scoped, Header its KeyName, Procedures its
// Methods, ReplayHeaders its Replay), documented there in full: the gRPC
// module's options are the same.
type ServerOptions struct {
	// Store holds the records. Any idem.Store. Required.
	Store idem.Store
	// Header names the request header that carries the client's key (gRPC
	// metadata on the gRPC protocols): a header field name, in any case,
	// not one of the protocols' own (Connect-*, Grpc-*, Content-*, ...).
	// Default "Idempotency-Key".
	Header string
	// KeyField names a singular string field at the top level of the request
	// message that carries the key, as AIP-155's request_id. Default "":
	// Header only.
	KeyField string
	// Scope names the tenant the call acts for, from its authenticated
	// principal (what an authenticating interceptor or HTTP middleware
	// around put in ctx; never what the client merely claims), so that one
	// tenant's key never replays another's response; an error that is a
	// *connect.Error is the call's answer. Set Scope or SingleTenant.
	// Default: none.
	Scope func(ctx context.Context, req connect.AnyRequest) (string, error)
	// SingleTenant states that the service has one tenant: every call shares
	// one scope. Default false.
	SingleTenant bool
	// Procedures are the procedures the interceptor covers
	// ("/package.Service/Method"). A procedure declared NO_SIDE_EFFECTS
	// (connect's IdempotencyNoSideEffects) is never covered: it changes
	// nothing, so a retry of it is safe without a key. Default: every
	// unary procedure.
	Procedures []string
	// Required answers InvalidArgument to a covered call without a key.
	// Default false.
	Required bool
	// LockTimeout bounds the wait for a call of the same key in flight.
	// Default 5s.
	LockTimeout time.Duration
	// RetryDelay is the RetryInfo delay of an Aborted or Unavailable answer.
	// At most 1h. Default 1s.
	RetryDelay time.Duration
	// MaxKeyBytes bounds the client's key, in bytes. Default 255.
	MaxKeyBytes int
	// MaxResponseBytes bounds the encoded response message recorded for
	// replay; a longer one is sent whole and recorded as done without it.
	// Default 512 KiB, or less to fit the store's MaxResultBytes.
	MaxResponseBytes int
	// ReplayHeaders are the response headers and trailers the handler sets
	// (Response.Header, Response.Trailer, an error's Meta, or the handler
	// context's connect.CallInfo) that are recorded and replayed; not the
	// protocols' own, nor carrying credentials. Default: none.
	ReplayHeaders []string
	// Keep reports whether an answer with this code is recorded; 0 is a
	// success (Connect has no constant for it). Keep only answers that a
	// retry of the same call cannot change. Default: DefaultKeep.
	Keep func(connect.Code) bool
	// RecordTimeout bounds the Claim before the handler and the Confirm or
	// Forget after it, retries included. Default 10s.
	RecordTimeout time.Duration
	// Logger receives the errors the interceptor answers and what it cannot
	// tell the client. Default: none.
	Logger *slog.Logger
	// Observer receives one idem.Event per call the interceptor acts on.
	// Default: none.
	Observer idem.Observer
	// KeyHasher hashes keys for the Logger and the Observer; give it the
	// store's. Default: the process's (idem.KeyHash).
	KeyHasher *idem.KeyHasher
}

// Defaults of ServerOptions and ClientOptions, the RPC core's.
const (
	DefaultHeader           = "Idempotency-Key"
	DefaultLockTimeout      = rpccore.DefaultLockTimeout
	DefaultRetryDelay       = rpccore.DefaultRetryDelay
	DefaultMaxKeyBytes      = rpccore.DefaultMaxKeyBytes
	DefaultMaxResponseBytes = rpccore.DefaultMaxResponseBytes
	DefaultRecordTimeout    = rpccore.DefaultRecordTimeout
)

// RecordOverhead is the room a record takes besides the response message:
// its version, flags, the message's type name, and the replayed headers,
// up to 8 KiB of them. NewServer checks that MaxResponseBytes and
// RecordOverhead fit the store's MaxResultBytes together.
const RecordOverhead = rpccore.RecordOverhead

// DefaultKeep is the default ServerOptions.Keep: it keeps a success (code
// 0) and InvalidArgument, no other code. The rules are the gRPC module's,
// stated once by [github.com/idemgo/idem/middleware/rpccode.Keep], whose
// documentation gives each code and why.
//
// A Keep that extends it: func(c connect.Code) bool { return c == connect.CodeAlreadyExists || idemconnect.DefaultKeep(c) }.
func DefaultKeep(c connect.Code) bool { return rpccode.Keep(c) }

// core is o as the RPC core takes it.
func (o ServerOptions) core() rpccore.Config {
	c := rpccore.Config{
		Frame: frame, KeyName: o.Header,
		Store: o.Store, Scoped: o.Scope != nil, SingleTenant: o.SingleTenant, KeyField: o.KeyField,
		Methods: o.Procedures, Required: o.Required, LockTimeout: o.LockTimeout, RetryDelay: o.RetryDelay,
		MaxKeyBytes: o.MaxKeyBytes, MaxResponse: o.MaxResponseBytes, Replay: o.ReplayHeaders,
		RecordTimeout: o.RecordTimeout, Logger: o.Logger, Observer: o.Observer, KeyHasher: o.KeyHasher,
	}
	if keep := o.Keep; keep != nil {
		c.Keep = func(c rpccore.Code) bool { return keep(connect.Code(c)) }
	}
	return c
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
