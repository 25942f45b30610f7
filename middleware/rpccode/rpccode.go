// Package rpccode states, once for every RPC front door of idem (the gRPC
// module's interceptors and the Connect module's), what a status code
// means to idempotency: which answers are recorded and replayed (Keep),
// and which a client retries with the call's key (Retried).
//
// The codes are the canonical ones of google.rpc.Code, shared by gRPC
// (google.golang.org/grpc/codes.Code) and Connect (connectrpc.com/connect.Code):
// both are uint32 with the same numbers, so each function takes either.
// 0 is OK, a success (Connect has no constant for it: a nil error).
//
// # Keep rules
//
// An answer is recorded, and replayed to every retry of its key for the
// store's retention, only when a retry of the same call could not change
// it, as the HTTP middleware's rules. Recording any other answer would
// poison the key: the client's retries would get the same refusal for the
// whole retention.
//
//	code                kept  why
//	OK                  yes   the work was done: its response is the one to replay
//	InvalidArgument     yes   the request itself is at fault, whatever the system's state (HTTP 400, 422)
//	Canceled            no    the caller went away; the work may not have happened
//	Unknown, Internal   no    the server failed (HTTP 500): a retry runs the handler
//	DeadlineExceeded    no    timing: the same call may finish in time later
//	NotFound            no    the resource may exist later (HTTP 404): nothing was done
//	AlreadyExists       no    the state of the resource decides (HTTP 409), not the request
//	PermissionDenied    no    credentials: access may be granted (HTTP 403)
//	Unauthenticated     no    credentials: the client may sign in again (HTTP 401)
//	ResourceExhausted   no    a quota that refills (HTTP 429); clients retry it
//	FailedPrecondition  no    the system's state; gRPC: retry once the state is fixed (HTTP 412)
//	Aborted             no    a concurrency conflict (HTTP 409); clients retry it
//	OutOfRange          no    past a range that may grow; gRPC: may be fixed by the system's state (HTTP 416)
//	Unimplemented       no    no handler acts on it (HTTP 405, 501); a deploy may add one
//	Unavailable         no    down for now (HTTP 503); clients retry it
//	DataLoss            no    the server failed
//	others              no    a meaning idem does not know
//
// A Keep of one's own (the interceptors' Keep option) may record more: a
// payment declined for good, say.
package rpccode

// The codes this package names, as google.rpc.Code numbers them.
const (
	OK                 = 0
	InvalidArgument    = 3
	ResourceExhausted  = 8
	FailedPrecondition = 9
	Aborted            = 10
	Unavailable        = 14
)

// Keep reports whether an answer with code c is one that a retry of the
// same call cannot change, and is therefore recorded and replayed: OK (the
// work was done: its response is the one to replay) and InvalidArgument
// (the request itself is at fault, "regardless of the state of the
// system" in gRPC's words: the same request gets the same answer). It
// keeps no answer that says the work did not happen and may happen on a
// later try, nor one that depends on the state of something besides the
// request, nor a code of unknown meaning. None of the codes Retried
// reports is kept. The package documentation gives each code and why.
func Keep[C ~uint32](c C) bool {
	return c == OK || c == InvalidArgument
}

// Retried reports whether a client retries an answer with code c, with
// the call's key: Unavailable (also what a connection lost mid-call
// becomes, whose outcome is unknown: the key makes the retry safe),
// Aborted (the interceptors' answer for a key in flight) and
// ResourceExhausted (a quota that may refill). No other code: the others
// say the call was answered, or will be answered the same.
func Retried[C ~uint32](c C) bool {
	return c == Unavailable || c == ResourceExhausted || c == Aborted
}
