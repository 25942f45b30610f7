package idemgrpc

import (
	"google.golang.org/grpc/codes"

	"github.com/idemgo/idem/middleware/rpccode"
)

// DefaultKeep is the default ServerOptions.Keep: it reports whether an
// answer with this code is one that a retry of the same call cannot
// change, and is therefore recorded and replayed. It keeps OK (the work was
// done: its response is the one to replay) and InvalidArgument (the request
// itself is at fault, "regardless of the state of the system" in gRPC's
// words: the same request gets the same answer). It keeps no answer that
// says the work did not happen and may happen on a later try, nor one that
// depends on the state of something besides the request, nor a code of
// unknown meaning. None of the codes the Client retries (Unavailable,
// ResourceExhausted, Aborted) is kept. The rules are
// [github.com/idemgo/idem/middleware/rpccode.Keep]'s, the same for the Connect
// module; its documentation gives each code and why.
//
// A Keep that extends it: func(c codes.Code) bool { return c == codes.AlreadyExists || idemgrpc.DefaultKeep(c) }.
func DefaultKeep(c codes.Code) bool {
	return rpccode.Keep(c)
}
