// Package lossy is a loopback TCP proxy for chaos tests of RPC clients and
// servers (the gRPC and Connect modules' chaos tests, idem-grpc-demo): it
// forwards every connection to one upstream, byte for byte, and on demand
// resets every open connection (RST, as a crashed middlebox would) or holds
// all traffic for a while (a blackhole that heals: what was sent meanwhile
// is delivered afterwards). It knows nothing of HTTP/2 or TLS: a reset
// loses whatever answers were on the wire, after or before their handler
// ran. It is the idem demo's and the fault tests' proxy (the root
// module's internal/faultproxy), made public for the nested modules, which
// may not import another module's internal packages.
package lossy

import (
	"time"

	"github.com/idemgo/idem/internal/faultproxy"
)

// Proxy forwards loopback connections to one upstream. Create it with
// Start, stop it with Close. It is safe for concurrent use.
type Proxy struct{ p *faultproxy.Proxy }

// Start listens on a free loopback port and forwards every connection to
// upstream (host:port), dialed when the client connects.
func Start(upstream string) (*Proxy, error) {
	p, err := faultproxy.Start(upstream)
	if err != nil {
		return nil, err
	}
	return &Proxy{p}, nil
}

// Addr is the host:port clients connect to.
func (p *Proxy) Addr() string { return p.p.Addr() }

// ResetAll resets every open connection and returns how many there were.
func (p *Proxy) ResetAll() int { return p.p.ResetAll() }

// Blackhole holds all traffic, on every connection, for d from now; new
// connections are still accepted.
func (p *Proxy) Blackhole(d time.Duration) { p.p.Blackhole(d) }

// Resets counts the connections ResetAll reset.
func (p *Proxy) Resets() int { return p.p.Stats().Resets }

// Close stops listening, resets every connection and waits for the
// proxy's goroutines to end.
func (p *Proxy) Close() error {
	p.p.ResetAll()
	return p.p.Close()
}
