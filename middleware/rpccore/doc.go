// Package rpccore is the one core under idem's RPC front doors, the gRPC
// module's interceptors ([github.com/idemgo/idem/grpc]) and the Connect
// module's ([github.com/idemgo/idem/connect]): what they do alike is
// written here once, and each module is an adapter from its framework's
// interceptor types to it. A third RPC framework would be a third adapter.
//
// It depends on no gRPC, Connect or protobuf package: it works on encoded
// messages and on Metadata, the type under gRPC's metadata.MD and
// net/http's Header; the adapters hand it protobuf's runtime, written once
// in the module [github.com/idemgo/idem/middleware/rpcproto]. That is why it can
// live in the root module, which both modules require already: a user of
// one framework downloads nothing of the other, and the idem command can
// build the records (Resolution) without protobuf. Package
// [github.com/idemgo/idem/middleware/rpccore/lossy], the lossy link of the
// chaos tests, is public for the same reason: the nested modules may not
// import the root's internal packages.
//
// # What the core holds
//
//   - the options, their documentation, checks and defaults (Config,
//     ClientConfig; New, NewClient), in the words of the front door's
//     Frame, which also turns its framework's errors to and from a Status
//     and hands over protobuf's runtime (Proto);
//   - the key: metadata (a header) or a request field (AIP-155's
//     request_id), its checks (Server.Key), the fingerprint (Fingerprint)
//     and the store key (StoreKey);
//   - one call's path (Server.Serve): claim, run the handler under the
//     lease (Handler), record its answer per the keep rules of package
//     [github.com/idemgo/idem/middleware/rpccode], or replay a record, or
//     wait for the holder; Confirm and Forget retried within RecordTimeout
//     and the lease;
//   - the interceptors' own answers (Server.Answer), as a google.rpc.Status
//     with an ErrorInfo (ErrorDomain, a Reason), a RetryInfo where a retry
//     helps, a PreconditionFailure for a quarantined key;
//   - the record of an answer and its replay (EncodeRecord, DecodeRecord),
//     and an operator's record of a response (Resolution, and
//     Frame.Resolution from a message);
//   - the client's retry loop, one key per call (Client.Call).
//
// # Answers
//
//	situation                                     answer
//	no key (metadata or KeyField)                 pass through; InvalidArgument when Required
//	key empty, repeated, over MaxKeyBytes         InvalidArgument, before any store call
//	first call                                    the handler runs under the key's lease; its answer is recorded (per Keep), then sent
//	same key, same request, done                  the recorded answer, marked idempotent-replayed: true
//	same key, another request (method or message) FailedPrecondition, done or in flight; no RetryInfo
//	same key while the first is in flight         wait up to LockTimeout, then replay, or Aborted + RetryInfo
//	store unavailable                             Unavailable + RetryInfo; the handler does not run (fail closed)
//	key quarantined: its calls crashed the        FailedPrecondition, ReasonKeyQuarantined + PreconditionFailure; no
//	  server more than MaxTakeOvers times in a row  RetryInfo; the handler does not run until an operator settles it
//	a call that took the key over from a crash    the handler runs with the take-over in its context (idem.TakeOverFrom)
//	handler answers a code Keep does not keep     nothing recorded, key released: a retry runs the handler
//	handler panics                                nothing recorded, key released; the panic goes on
//	response over MaxResponseBytes                sent whole, recorded as done without it: replays answer AlreadyExists
//	                                                (ReasonResponseNotRecorded, idempotent-response-omitted: true)
//	streaming call carrying a key                 Unimplemented: streams are not covered
//
// Every error the interceptors answer themselves carries an ErrorInfo and
// never internal error text. In flight is Aborted, not Unavailable: gRPC's
// guide to the codes keeps Unavailable for a service that is down, and the
// call's key is not down but busy, a concurrency conflict such as Spanner
// answers Aborted with RetryInfo; dashboards on Unavailable then see only
// the store failing. A key reused for another request is
// FailedPrecondition, not InvalidArgument: the request itself may be
// valid; what refuses it is the key's state, and no retry will succeed.
//
// A replay carries the recorded message or error status and the metadata
// of the allowlist (never credentials: a replay goes to whoever holds the
// key in the scope). The message is decoded into a new message of the
// recorded type from protobuf's global registry. The handler runs with the
// key's lease kept alive (idem.LeaseFrom, its fencing token); Claim,
// Confirm and Forget run detached from the call's cancellation, bounded by
// RecordTimeout and the lease's end: a client that hangs up must neither
// leave the key claimed nor make a done call look undone. The Observer
// receives one idem.OpRequest event per covered call with a key: the
// claim's Outcome, the store key's hash, and the idempotency layer's
// error, never the handler's.
//
// # Records
//
// An answer is stored as the store's result bytes (EncodeRecord gives the
// format), under StoreKey's key, fingerprinted by Fingerprint: the gRPC and
// Connect front doors write the same records byte for byte, so a service
// moving between grpc-go and Connect, or serving a method with both on one
// store, keeps its records. A record that does not decode is answered
// Internal (ReasonRecordDamaged), never a panic and never a second run.
//
// An operator settles a quarantined key as done with a Resolution: the
// record of the response the key's calls are then answered with.
package rpccore
