// Package lossy is the RPC core's lossy link (package
// github.com/idemgo/idem/middleware/rpccore/lossy) under the name this
// module's tests used before the core was shared, so that a test written
// against it still builds. New code imports the core's package.
package lossy

import "github.com/idemgo/idem/middleware/rpccore/lossy"

// Proxy is lossy.Proxy.
type Proxy = lossy.Proxy

// Start is lossy.Start.
func Start(upstream string) (*Proxy, error) { return lossy.Start(upstream) }
