// Package idemconnect makes unary Connect procedures
// (connectrpc.com/connect) safe to retry, over the Connect, gRPC and
// gRPC-Web protocols alike: a server interceptor that runs each
// idempotency key's call once and replays its answer, and a client
// interceptor that gives each call one key and retries it with that key.
//
// It is the gRPC module's interceptors ([github.com/idemgo/idem/grpc]) for
// Connect, in a module of its own (github.com/idemgo/idem/connect) so that
// connect-go stays out of idem's own dependencies, and grpc-go out of this
// one's. What both do is the RPC core's
// ([github.com/idemgo/idem/middleware/rpccore]), whose documentation
// gives every answer, the replays and the records; this package adapts
// Connect's interceptor types to it.
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
// (ServerOptions.KeyField: AIP-155's request_id). A procedure declared
// NO_SIDE_EFFECTS passes through: it changes nothing, a retry needs no
// key. Put the interceptor after those that authenticate (inside them, in
// connect.WithInterceptors' order), so that Scope finds the principal in
// the context.
//
// A replay carries the recorded response message, or the recorded error
// with its code, message and details, and the headers and trailers of
// ServerOptions.ReplayHeaders that the handler set (Response.Header,
// Response.Trailer, an error's Meta, or the call info of
// connect.CallInfoForHandlerContext, which the simple handler API uses),
// plus Idempotent-Replayed: true in the header. The message is handed to
// Connect as a *connect.Response whose Any() is a proto.Message wrapping
// it: the protocols' codecs encode it as the handler's own, but an
// interceptor around this one that asserts the concrete type of Any() on
// a replay finds the wrapper.
//
// Records are the gRPC module's, byte for byte. Resolution builds an
// operator's record of the response to settle a quarantined key with. The
// Client gives each covered call one key (none to a NO_SIDE_EFFECTS
// procedure) and retries, with it, what rpccore.Client.Call retries and
// an error of the transport.
package idemconnect
