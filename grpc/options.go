package idemgrpc

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/middleware/rpccode"
	"github.com/idemgo/idem/middleware/rpccore"
	"google.golang.org/grpc/codes"
)

// ServerOptions configure the server interceptor. The zero value of every
// field means its documented default; Store must be set, and exactly one
// of Scope and SingleTenant. NewServer refuses a mistake in any field with
// an error that names the field. Each field is the RPC core's of its name
// (rpccore.Config; Scope its Scoped, Metadata its KeyName,
// ReplayMetadata its Replay), documented there in full: the Connect
// module's options are the same.
type ServerOptions struct {
	// Store holds the records. Any idem.Store. Required.
	Store idem.Store
	// Metadata names the request metadata that carries the client's key:
	// a metadata key, in any case (gRPC sends keys in lower case), not
	// reserved by gRPC ("grpc-") and not binary ("-bin"). Default
	// "idempotency-key".
	Metadata string
	// KeyField names a singular string field at the top level of the request
	// message that carries the key, as AIP-155's request_id. Default "":
	// Metadata only.
	KeyField string
	// Scope names the tenant the call acts for, from its authenticated
	// principal (a TLS client certificate, a verified token; never what the
	// client merely claims), so that one tenant's key never replays
	// another's response; an error that is a gRPC status is the call's
	// answer. Set Scope or SingleTenant. Default: none.
	Scope func(ctx context.Context, fullMethod string) (string, error)
	// SingleTenant states that the service has one tenant: every call shares
	// one scope. Default false.
	SingleTenant bool
	// Methods are the full method names the interceptor covers
	// ("/package.Service/Method"). Default: every unary method.
	Methods []string
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
	// ReplayMetadata are the header and trailer metadata keys the handler
	// sets (grpc.SetHeader, grpc.SendHeader, grpc.SetTrailer) that are
	// recorded and replayed; not reserved by gRPC ("grpc-"), nor carrying
	// credentials. Default: none.
	ReplayMetadata []string
	// Keep reports whether an answer with this code is recorded; keep only
	// answers that a retry of the same call cannot change. Default:
	// DefaultKeep.
	Keep func(codes.Code) bool
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
	DefaultMetadata         = "idempotency-key"
	DefaultLockTimeout      = rpccore.DefaultLockTimeout
	DefaultRetryDelay       = rpccore.DefaultRetryDelay
	DefaultMaxKeyBytes      = rpccore.DefaultMaxKeyBytes
	DefaultMaxResponseBytes = rpccore.DefaultMaxResponseBytes
	DefaultRecordTimeout    = rpccore.DefaultRecordTimeout
)

// RecordOverhead is the room a record takes besides the response message:
// its version, flags, the message's type name, and the replayed metadata,
// up to 8 KiB of them. NewServer checks that MaxResponseBytes and
// RecordOverhead fit the store's MaxResultBytes together. A response whose
// replayed metadata is larger still is recorded without its message when
// the whole would not fit.
const RecordOverhead = rpccore.RecordOverhead

// DefaultKeep is the default ServerOptions.Keep: it keeps OK and
// InvalidArgument, the answers a retry of the same call cannot change, and
// no other code. The rules are
// [github.com/idemgo/idem/middleware/rpccode.Keep]'s, the same for the
// Connect module; its documentation gives each code and why.
//
// A Keep that extends it: func(c codes.Code) bool { return c == codes.AlreadyExists || idemgrpc.DefaultKeep(c) }.
func DefaultKeep(c codes.Code) bool { return rpccode.Keep(c) }

// core is o as the RPC core takes it.
func (o ServerOptions) core() rpccore.Config {
	c := rpccore.Config{
		Frame: frame, KeyName: o.Metadata,
		Store: o.Store, Scoped: o.Scope != nil, SingleTenant: o.SingleTenant, KeyField: o.KeyField,
		Methods: o.Methods, Required: o.Required, LockTimeout: o.LockTimeout, RetryDelay: o.RetryDelay,
		MaxKeyBytes: o.MaxKeyBytes, MaxResponse: o.MaxResponseBytes, Replay: o.ReplayMetadata,
		RecordTimeout: o.RecordTimeout, Logger: o.Logger, Observer: o.Observer, KeyHasher: o.KeyHasher,
	}
	if keep := o.Keep; keep != nil {
		c.Keep = func(c rpccore.Code) bool { return keep(codes.Code(c)) }
	}
	return c
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
