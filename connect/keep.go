package idemconnect

import (
	"connectrpc.com/connect"

	"github.com/idemgo/idem/middleware/rpccode"
)

// DefaultKeep is the default ServerOptions.Keep: it keeps a success (code
// 0) and InvalidArgument, no other code. The rules are the gRPC module's,
// stated once by [github.com/idemgo/idem/middleware/rpccode.Keep], whose
// documentation gives each code and why.
//
// A Keep that extends it: func(c connect.Code) bool { return c == connect.CodeAlreadyExists || idemconnect.DefaultKeep(c) }.
func DefaultKeep(c connect.Code) bool { return rpccode.Keep(c) }
