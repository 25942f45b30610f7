// Package idemgrpc makes unary gRPC methods safe to retry: a server
// interceptor that runs each idempotency key's call once and replays its
// answer, and a client interceptor that gives each call one key and
// retries it with that key.
//
// It is the HTTP middleware and client of package
// [github.com/idemgo/idem/middleware] and [github.com/idemgo/idem/client]
// one layer over, in a module of its own (github.com/idemgo/idem/grpc) so
// that grpc-go stays out of idem's own dependencies.
//
//	s, err := idemgrpc.NewServer(idemgrpc.ServerOptions{
//		Store: store, // any idem.Store
//		Scope: func(ctx context.Context, method string) (string, error) {
//			return accountFrom(ctx) // the tenant, from the authenticated principal
//		},
//	})
//	...
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(s.Unary), grpc.ChainStreamInterceptor(s.Stream))
//
//	c, err := idemgrpc.NewClient(idemgrpc.ClientOptions{})
//	...
//	conn, err := grpc.NewClient(target, grpc.WithChainUnaryInterceptor(c.Unary), ...)
//
// The key is the request metadata idempotency-key (ServerOptions.Metadata),
// or a request field (ServerOptions.KeyField: AIP-155's request_id, read by
// protoreflect, so no generated code of this package is needed). The
// fingerprint that tells two requests under one key apart is SHA-256 over
// the full method name and the request's deterministic protobuf encoding,
// made by the server: clients in any language agree on it.
//
// NewServer asks for a decision on tenants: a Scope, or SingleTenant: true
// for a service with one. A recorded answer goes only to the tenant it
// belongs to.
//
// # Answers
//
//	situation                                         answer
//	no key (metadata or KeyField)                     pass through; InvalidArgument when ServerOptions.Required
//	key empty, repeated, over MaxKeyBytes             InvalidArgument, before any store call
//	first call                                        the handler runs under the key's lease; its answer is recorded (per Keep), then sent
//	same key, same request, done                      the recorded answer, header idempotent-replayed: true
//	same key, another request (method or message)     FailedPrecondition, done or in flight; no RetryInfo
//	same key while the first is in flight             wait up to LockTimeout, then replay, or Aborted + RetryInfo
//	store unavailable                                 Unavailable + RetryInfo; the handler does not run (fail closed)
//	key quarantined: its calls crashed the server     FailedPrecondition, ReasonKeyQuarantined + PreconditionFailure; no RetryInfo;
//	  more than MaxTakeOvers times in a row             the handler does not run until an operator settles the key (idem resolve)
//	a call that took the key over from a crashed one  the handler runs with the take-over in its context (idem.TakeOverFrom)
//	handler answers a code Keep does not keep         nothing recorded, key released: a retry runs the handler
//	handler panics                                    nothing recorded, key released; the panic goes on
//	streaming call carrying a key                     Unimplemented: streams are not covered
//
// Every error the interceptor itself answers carries an
// errdetails.ErrorInfo (Domain ErrorDomain, Reason one of the Reason
// constants, and the client's key in Metadata["idempotency_key"] where it
// is well-formed) and never internal error text.
//
// In flight is Aborted, not Unavailable: gRPC's guide to the codes keeps
// Unavailable for a service that is down, and the call's key is not down
// but busy, a concurrency conflict such as Spanner answers Aborted with
// RetryInfo. Dashboards and alerts on Unavailable then see only the store
// failing. Both are retried by the Client and by retry policies, and both
// carry RetryInfo (ServerOptions.RetryDelay, a short poll rather than the
// holder's lease end). A key reused for another request is
// FailedPrecondition, not InvalidArgument: the request itself may be
// valid; what refuses it is the key's state, bound to another request for
// the store's retention, and no retry of it will succeed.
//
// # Keep rules
//
// An answer is recorded, and replayed to every retry of its key for the
// store's retention, only when a retry of the same call could not change
// it (DefaultKeep, ServerOptions.Keep), as the HTTP middleware's rules:
// by default OK and InvalidArgument, no other code. Recording any other
// answer would poison the key: the client's retries would get the same
// refusal for the whole retention. The rules are stated once for every
// RPC front door of idem, this module's and the Connect module's, by
// package [github.com/idemgo/idem/middleware/rpccode], whose documentation gives each
// code and why.
//
// A Keep of one's own may record more: a payment declined for good, say.
//
// # Replays
//
// A replay carries the recorded response message, or the recorded error
// status with its details, and the header and trailer metadata of
// ServerOptions.ReplayMetadata that the handler set (grpc.SetHeader,
// grpc.SendHeader, grpc.SetTrailer), plus idempotent-replayed: true in the
// header. Credentials (authorization, cookie, set-cookie, ...) are never
// replayed: a replay goes to whoever holds the key in the scope. The
// response message is decoded into a new message of the recorded type from
// protoregistry.GlobalTypes, where generated code registers every message
// type.
//
// A response message over MaxResponseBytes is sent whole and recorded as
// done without it: its replays answer AlreadyExists with ErrorInfo reason
// ReasonResponseNotRecorded and idempotent-response-omitted: true, never a
// second run and never an empty message that could pass for the real one.
//
// Where clients retry often, give ServerOptions.Store an idem.Cache around
// the store (idem.NewCache): replays of a recorded response are then
// answered from memory, without a round trip. It is not built by default,
// because a cache answers a record deleted by hand for up to its MaxAge.
//
// # Lease
//
// The handler runs with the key's lease renewed by idem.KeepAlive and
// available from idem.LeaseFrom (its Token is a fencing token). Claim,
// Confirm and Forget run on contexts detached from the call's
// cancellation, bounded by RecordTimeout (and, for Confirm and Forget, the
// lease's end): a client that hangs up must neither leave the key claimed
// nor make a done call look undone. A record that cannot be written in
// time is logged, and the client still gets the handler's answer.
//
// # Observing
//
// ServerOptions.Observer receives one idem.Event, Op idem.OpRequest, per
// covered call that carries a key (or none, under Required), after it
// ends: Outcome is the claim's (Claimed: the handler ran; Duplicate: a
// replay; InProgress: another call held the key); KeyHash the hash of the
// store key (scope and client key) by ServerOptions.KeyHasher; Err the
// idempotency layer's error, not the handler's (nil when it did its part,
// whatever the handler answered; idem.ErrInvalidKey for a call refused
// before any store call; idem.ErrFingerprintMismatch or idem.ErrInProgress
// for a FailedPrecondition or an Aborted; the store's error for an
// Unavailable or an answer that could not be recorded). An idem.Starter is
// started before the first store call, and its context is the handler's.
//
// # Client
//
// The Client gives each covered call one key, a UUID unless the caller put
// one in the outgoing metadata, sends it with every attempt, and retries
// Unavailable (also gRPC's answer for a connection lost mid-call, whose
// outcome is unknown), ResourceExhausted, Aborted, and an attempt that ran
// out of ClientOptions.AttemptTimeout, never another code. It waits a
// jittered backoff (cenkalti/backoff, as the HTTP client) or the server's
// RetryInfo delay, whichever is longer, capped by MaxWait, within
// MaxAttempts, MaxElapsed and the call's context. Only for servers that
// honour the key: against one that does not, a retried call repeats.
//
// # Records
//
// An answer is stored as the store's result bytes, version 1:
//
//	byte     version (1)
//	byte     flags: bit 0 message omitted (over MaxResponseBytes), bit 1 an error status
//	uvarint  number of header pairs, then each: uvarint length and bytes of the key, of the value
//	uvarint  number of trailer pairs, the same way
//	uvarint  length and bytes of the message's full type name ("" for a status)
//	rest     the message's encoding, or the google.rpc.Status's
//
// Store keys are "g1" and the length-prefixed scope and client key
// ("g15:acme3:abc"), apart from the HTTP middleware's. A record that does
// not decode is answered Internal (ReasonRecordDamaged), never a panic and
// never a second run. The Connect module
// ([github.com/idemgo/idem/connect]) writes the same records, keys and
// fingerprints, byte for byte (its tests hold records this package
// wrote): change this format only with it.
package idemgrpc
