// Package idemconnect makes unary Connect procedures
// (connectrpc.com/connect) safe to retry, over the Connect, gRPC and
// gRPC-Web protocols alike: a server interceptor that runs each
// idempotency key's call once and replays its answer, and a client
// interceptor that gives each call one key and retries it with that key.
//
// It is the gRPC module's interceptors ([github.com/idemgo/idem/grpc]) for
// Connect, with the same answers, keep rules and records, in a module of
// its own (github.com/idemgo/idem/connect) so that connect-go stays out of
// idem's own dependencies, and grpc-go out of this one's.
//
//	s, err := idemconnect.NewServer(idemconnect.ServerOptions{
//		Store: store, // any idem.Store
//		Scope: func(ctx context.Context, req connect.AnyRequest) (string, error) {
//			return accountFrom(ctx) // the tenant, from the authenticated principal
//		},
//	})
//	...
//	mux.Handle(ordersv1connect.NewOrdersHandler(svc, connect.WithInterceptors(auth, s)))
//
//	c, err := idemconnect.NewClient(idemconnect.ClientOptions{})
//	...
//	client := ordersv1connect.NewOrdersClient(http.DefaultClient, url, connect.WithInterceptors(c))
//
// The key is the request header Idempotency-Key (ServerOptions.Header;
// gRPC metadata on the gRPC protocols), or a request field
// (ServerOptions.KeyField: AIP-155's request_id, read by protoreflect).
// The fingerprint that tells two requests under one key apart is SHA-256
// over the procedure and the request's deterministic protobuf encoding,
// made by the server: clients in any language, and on any of the three
// protocols, agree on it.
//
// NewServer asks for a decision on tenants: a Scope, or SingleTenant: true
// for a service with one. A recorded answer goes only to the tenant it
// belongs to. Put the interceptor after those that authenticate (inside
// them, in connect.WithInterceptors' order), so that Scope finds the
// principal in the context.
//
// # Answers
//
//	situation                                          answer
//	no key (header or KeyField)                        pass through; InvalidArgument when ServerOptions.Required
//	procedure declared NO_SIDE_EFFECTS                 pass through: it changes nothing, a retry needs no key
//	key empty, repeated, over MaxKeyBytes              InvalidArgument, before any store call
//	first call                                         the handler runs under the key's lease; its answer is recorded (per Keep), then sent
//	same key, same request, done                       the recorded answer, header Idempotent-Replayed: true
//	same key, another request (procedure or message)   FailedPrecondition, done or in flight; no RetryInfo
//	same key while the first is in flight              wait up to LockTimeout, then replay, or Aborted + RetryInfo
//	store unavailable                                  Unavailable + RetryInfo; the handler does not run (fail closed)
//	key quarantined: its calls crashed the server      FailedPrecondition, ReasonKeyQuarantined + PreconditionFailure; no RetryInfo;
//	  more than MaxTakeOvers times in a row              the handler does not run until an operator settles the key (idem resolve)
//	a call that took the key over from a crashed one   the handler runs with the take-over in its context (idem.TakeOverFrom)
//	handler answers a code Keep does not keep          nothing recorded, key released: a retry runs the handler
//	handler panics                                     nothing recorded, key released; the panic goes on
//	streaming call carrying a key                      Unimplemented: streams are not covered
//
// Every error the interceptor itself answers carries an
// errdetails.ErrorInfo (Domain ErrorDomain, Reason one of the Reason
// constants, and the client's key in Metadata["idempotency_key"] where it
// is well-formed) and never internal error text. Aborted and Unavailable
// carry an errdetails.RetryInfo (ServerOptions.RetryDelay). Why these
// codes: see the gRPC module's documentation, whose choices these are.
//
// # Keep rules
//
// An answer is recorded, and replayed to every retry of its key for the
// store's retention, only when a retry of the same call could not change
// it (DefaultKeep, ServerOptions.Keep): by default a success and
// InvalidArgument, no other code. The rules are the gRPC module's, stated
// once for both by package [github.com/idemgo/idem/middleware/rpccode], whose
// documentation gives each code and why.
//
// # Replays
//
// A replay carries the recorded response message, or the recorded error
// with its code, message and details, and the headers and trailers of
// ServerOptions.ReplayHeaders that the handler set (Response.Header,
// Response.Trailer, an error's Meta, or the call info of
// connect.CallInfoForHandlerContext, which the simple handler API uses),
// plus Idempotent-Replayed: true in the header. Credentials (Authorization, Cookie, Set-Cookie, ...) are
// never replayed. The response message is decoded into a new message of
// the recorded type from protoregistry.GlobalTypes, where generated code
// registers every message type, and handed to Connect as a
// *connect.Response whose Any() is a proto.Message wrapping it: the
// protocols' codecs encode it as the handler's own, but an interceptor
// around this one that asserts the concrete type of Any() on a replay
// finds the wrapper. A response over MaxResponseBytes is sent whole and
// recorded as done without it: its replays answer AlreadyExists with
// ErrorInfo reason ReasonResponseNotRecorded and
// Idempotent-Response-Omitted: true, never a second run.
//
// Where clients retry often, give ServerOptions.Store an idem.Cache around
// the store (idem.NewCache): replays of a recorded response are then
// answered from memory, without a round trip. It is not built by default,
// because a cache answers a record deleted by hand for up to its MaxAge.
//
// # Lease
//
// The handler runs with the key's lease renewed by idem.KeepAlive and
// available from idem.LeaseFrom(ctx) (its Token is a fencing token).
// Claim, Confirm and Forget run on contexts detached from the call's
// cancellation, bounded by RecordTimeout (and, for Confirm and Forget, the
// lease's end): a client that hangs up must neither leave the key claimed
// nor make a done call look undone.
//
// # Observing
//
// ServerOptions.Observer receives one idem.Event, Op idem.OpRequest, per
// covered call that carries a key (or none, under Required), after it
// ends, as the gRPC module's: Outcome is the claim's, KeyHash the hash of
// the store key, Err the idempotency layer's error, not the handler's.
//
// # Client
//
// The Client gives each covered call one key, a UUID unless the caller set
// one in the request's header, sends it with every attempt, and retries
// Unavailable (also Connect's answer for a connection lost mid-call, whose
// outcome is unknown), ResourceExhausted, Aborted, and an attempt that ran
// out of ClientOptions.AttemptTimeout, never another code (rpccode.Retried
// states them for both modules). It waits a jittered backoff
// (cenkalti/backoff) or the server's RetryInfo delay, whichever is longer,
// capped by MaxWait, within MaxAttempts, MaxElapsed and the call's
// context. A NO_SIDE_EFFECTS procedure gets no key and is retried alike.
// Only for servers that honour the key: against one that does not, a
// retried call repeats.
//
// # Records
//
// Records are the gRPC module's, byte for byte: the same store key ("g1"
// and the length-prefixed scope and client key), the same fingerprint
// (Connect's procedure is gRPC's full method name), and the same format
// (header names in lower case, an error as a google.rpc.Status). A
// service moving between grpc-go and Connect, or serving a method with
// both on one store, keeps its records: a retry that spans the move is
// replayed. A record that does not decode is answered Internal
// (ReasonRecordDamaged), never a panic and never a second run.
package idemconnect
