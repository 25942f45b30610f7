// Package lossy is a loopback TCP proxy for chaos tests of RPC clients and
// servers (the gRPC and Connect modules' chaos tests, idem-grpc-demo): it
// forwards every connection to one upstream, byte for byte, and on demand
// resets every open connection (RST, as a crashed middlebox would) or holds
// all traffic for a while (a blackhole that heals: what was sent meanwhile
// is delivered afterwards). It knows nothing of HTTP/2 or TLS: a reset
// loses whatever answers were on the wire, after or before their handler
// ran. It is public, not internal, because the nested modules that use it
// may not import another module's internal packages.
package lossy

import (
	"net"
	"sync"
	"time"
)

// Proxy forwards loopback connections to one upstream. Create it with
// Start, stop it with Close. It is safe for concurrent use.
type Proxy struct {
	l        net.Listener
	upstream string

	mu        sync.Mutex
	conns     map[net.Conn]net.Conn // client side -> upstream side
	holdUntil time.Time
	resets    int
	wg        sync.WaitGroup
}

// Start listens on a free loopback port and forwards every connection to
// upstream (host:port), dialed when the client connects.
func Start(upstream string) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{l: l, upstream: upstream, conns: map[net.Conn]net.Conn{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the host:port clients connect to.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c] = up
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pump(c, up, c)
		go p.pump(up, c, c)
	}
}

// pump copies from src to dst, chunk by chunk, waiting out a blackhole
// before each chunk, until either side ends; then it closes both.
func (p *Proxy) pump(src, dst, client net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.hold()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if err != nil {
			p.drop(client, false)
			return
		}
	}
}

// hold waits while a blackhole lasts.
func (p *Proxy) hold() {
	for {
		p.mu.Lock()
		left := time.Until(p.holdUntil)
		p.mu.Unlock()
		if left <= 0 {
			return
		}
		time.Sleep(min(left, 5*time.Millisecond))
	}
}

// drop closes client's connection pair, with RST when rst is set.
func (p *Proxy) drop(client net.Conn, rst bool) bool {
	p.mu.Lock()
	up, ok := p.conns[client]
	delete(p.conns, client)
	p.mu.Unlock()
	if !ok {
		return false
	}
	for _, c := range []net.Conn{client, up} {
		if tc, isTCP := c.(*net.TCPConn); isTCP && rst {
			_ = tc.SetLinger(0) // close sends RST, discarding what is unsent
		}
		_ = c.Close()
	}
	return true
}

// ResetAll resets every open connection and returns how many there were.
func (p *Proxy) ResetAll() int {
	p.mu.Lock()
	clients := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		clients = append(clients, c)
	}
	p.mu.Unlock()
	n := 0
	for _, c := range clients {
		if p.drop(c, true) {
			n++
		}
	}
	p.mu.Lock()
	p.resets += n
	p.mu.Unlock()
	return n
}

// Blackhole holds all traffic, on every connection, for d from now; new
// connections are still accepted.
func (p *Proxy) Blackhole(d time.Duration) {
	p.mu.Lock()
	p.holdUntil = time.Now().Add(d)
	p.mu.Unlock()
}

// Resets counts the connections ResetAll reset.
func (p *Proxy) Resets() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.resets
}

// Close stops listening, resets every connection and waits for the
// proxy's goroutines to end.
func (p *Proxy) Close() error {
	err := p.l.Close()
	p.mu.Lock()
	p.holdUntil = time.Time{}
	p.mu.Unlock()
	p.ResetAll()
	p.wg.Wait()
	return err
}
