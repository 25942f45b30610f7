// Package idemgrpc makes unary gRPC methods safe to retry: a server
// interceptor that runs each idempotency key's call once and replays its
// answer, and a client interceptor that gives each call one key and
// retries it with that key.
//
// It is the HTTP middleware and client of package
// [github.com/idemgo/idem/middleware] and [github.com/idemgo/idem/client]
// one layer over, in a module of its own (github.com/idemgo/idem/grpc) so
// that grpc-go stays out of idem's own dependencies. What it does is the
// RPC core's ([github.com/idemgo/idem/middleware/rpccore], shared with the
// Connect module), whose documentation gives every answer, the replays
// and the records; this package adapts gRPC's interceptor types to it.
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
// made by the server: clients in any language agree on it. NewServer asks
// for a decision on tenants: a Scope, or SingleTenant: true for a service
// with one. A recorded answer goes only to the tenant it belongs to.
//
// Every error the interceptor answers itself carries an
// errdetails.ErrorInfo (Domain ErrorDomain, a Reason constant). Answers
// are recorded per DefaultKeep (OK and InvalidArgument: package
// [github.com/idemgo/idem/middleware/rpccode]); a replay carries the
// response message or error status and the metadata of
// ServerOptions.ReplayMetadata the handler set (grpc.SetHeader,
// grpc.SendHeader, grpc.SetTrailer), plus idempotent-replayed: true. Where
// clients retry often, give ServerOptions.Store an idem.Cache (not built by
// default: a cache answers a record deleted by hand for up to its MaxAge).
// Resolution builds an operator's record of the response to settle a
// quarantined key with.
//
// The Client gives each covered call one key, a UUID unless the caller put
// one in the outgoing metadata, and retries Unavailable (also gRPC's answer
// for a connection lost mid-call), ResourceExhausted, Aborted, and an
// attempt that ran out of ClientOptions.AttemptTimeout, never another code.
// Only for servers that honour the key: against one that does not, a
// retried call repeats.
package idemgrpc
