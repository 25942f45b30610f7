// Package faultproxy is a TCP proxy for tests that puts network faults
// between a client and a server (Redis, Postgres) while they talk.
//
// A Proxy listens on a loopback port and forwards each connection it
// accepts to one upstream address, byte for byte: it knows nothing of the
// protocol. What it forwards is a chunk: whatever one read returned. A
// request-response client (go-redis, pgx) writes one command, or one
// pipeline, per chunk and waits for the reply before it writes again, so
// "the next request" and "its reply" are well defined for them.
//
// At any time a test can:
//
//   - delay every chunk (SetLatency);
//   - lose the reply of the next request after the server ran it
//     (DropNextReply): the request is forwarded, the reply read and thrown
//     away, and the client's connection closed, so the client cannot tell
//     whether the command ran;
//   - reset the connection of the next request mid-command (ResetNext):
//     both sides are reset (RST) before any reply, after the request was
//     forwarded (the server may have run it) or before (it never ran);
//   - reset every open connection at once (ResetAll), as a server restart
//     or a middlebox would;
//   - blackhole everything for a while (Blackhole): connections are still
//     accepted and kept, but nothing is forwarded until the time is up.
//
// A Proxy is safe for concurrent use.
package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Stats counts what a Proxy did since it started.
type Stats struct {
	Accepted       int // client connections accepted
	DroppedReplies int // replies read from upstream and thrown away (DropNextReply)
	Resets         int // connections reset, by ResetNext or ResetAll
	Held           int // chunks that waited for a blackhole to end
}

// Proxy forwards loopback connections to an upstream address and injects
// faults into them. Create it with Start; stop it with Close.
type Proxy struct {
	l        net.Listener
	upstream string

	mu        sync.Mutex
	links     map[*link]struct{}
	latency   time.Duration
	holdUntil time.Time
	pending   []fault // one-shot faults, in the order they were asked for
	stats     Stats
	closed    bool

	wg sync.WaitGroup
}

type faultKind uint8

const (
	dropReply faultKind = iota + 1
	resetConn
)

// fault is a one-shot fault waiting for the first request that matches.
type fault struct {
	kind    faultKind
	match   func([]byte) bool // nil: any request; called under Proxy.mu
	forward bool              // resetConn: forward the request before the reset
}

// link is one proxied connection: the client's side and the upstream's.
type link struct {
	client, up net.Conn
	once       sync.Once
	// hurt is set by the request side, under Proxy.mu, before it forwards
	// a request whose reply must not reach the client: dropReply (the
	// reply side throws the reply away and closes the link) or resetConn
	// (the reply side throws away anything that comes back before the
	// request side's reset).
	hurt faultKind
}

// Start listens on a free loopback port and forwards every connection it
// accepts to upstream (host:port). The upstream is dialed per connection,
// when the client connects; an upstream that cannot be reached closes the
// client's connection.
func Start(upstream string) (*Proxy, error) {
	if _, _, err := net.SplitHostPort(upstream); err != nil {
		return nil, fmt.Errorf("faultproxy: upstream %q: %w", upstream, err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	p := &Proxy{l: l, upstream: upstream, links: make(map[*link]struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the host:port clients connect to.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// Stats returns the counts so far.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// SetLatency delays every chunk by d before it is forwarded, in each
// direction: a request and its reply gain 2d. Zero turns it off.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = d
}

// DropNextReply loses the reply of the next request for which match
// returns true (any request when match is nil), on whichever connection
// sends it: the
// request is forwarded, the first chunk of its reply is read from upstream
// (so the server has run it) and thrown away, and both sides are closed.
// The client sees its connection close without an answer. Each call loses
// one reply; calls queue up.
func (p *Proxy) DropNextReply(match func(request []byte) bool) {
	p.arm(fault{kind: dropReply, match: match})
}

// ResetNext resets the connection of the next request for which match
// returns true (any request when match is nil): both the client's and the
// upstream's connection are closed with a TCP RST, and no reply reaches
// the client. With forward, the request is forwarded first, so the server
// may or may not have run it; without, the server never sees it. Each call
// resets one connection; calls queue up.
func (p *Proxy) ResetNext(match func(request []byte) bool, forward bool) {
	p.arm(fault{kind: resetConn, match: match, forward: forward})
}

func (p *Proxy) arm(f fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pending = append(p.pending, f)
}

// Pending returns how many one-shot faults (DropNextReply, ResetNext) have
// not met their request yet.
func (p *Proxy) Pending() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pending)
}

// ResetAll resets every open connection with a TCP RST and returns how
// many there were. New connections are accepted as before.
func (p *Proxy) ResetAll() int {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.stats.Resets += len(links)
	p.mu.Unlock()
	for _, l := range links {
		l.close(true)
	}
	return len(links)
}

// Blackhole stops all forwarding, in both directions and on every
// connection, for d from now; new connections are still accepted. What a
// side sent meanwhile is held and forwarded when the time is up, as after a
// network partition heals, unless its connection was reset or the proxy
// closed first. A later call replaces the end time.
func (p *Proxy) Blackhole(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holdUntil = time.Now().Add(d)
}

// Close stops listening, closes every connection and waits for the proxy's
// goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	err := p.l.Close()
	for _, l := range links {
		l.close(false)
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return // closed
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// serve dials the upstream for client c and pumps both directions until
// either side ends.
func (p *Proxy) serve(c net.Conn) {
	defer p.wg.Done()
	up, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
	if err != nil {
		_ = c.Close()
		return
	}
	l := &link{client: c, up: up}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		l.close(false)
		return
	}
	p.links[l] = struct{}{}
	p.stats.Accepted++
	p.mu.Unlock()

	done := make(chan struct{})
	go func() {
		defer close(done)
		p.pump(l, true)
	}()
	p.pump(l, false)
	<-done
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// pump copies chunks one way: client to upstream when request is set,
// upstream to client otherwise. Whichever direction ends first closes the
// link, which ends the other.
func (p *Proxy) pump(l *link, request bool) {
	from, to := l.up, l.client
	if request {
		from, to = l.client, l.up
	}
	halfClosed := false
	defer func() {
		if !halfClosed {
			l.close(false)
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			p.wait()
			if request {
				if !p.forwardRequest(l, chunk) {
					return
				}
			} else {
				p.mu.Lock()
				hurt := l.hurt
				if hurt == dropReply {
					p.stats.DroppedReplies++
				}
				p.mu.Unlock()
				switch hurt {
				case dropReply:
					// The server ran the request and answered; the
					// client never hears of it.
					return
				case resetConn:
					continue
				}
				if _, err := to.Write(chunk); err != nil {
					return
				}
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) && request {
				// The client is done sending: pass that on, and let
				// the reply side end the link when the upstream, having
				// answered what it was sent, closes too.
				halfClosed = closeWrite(to)
			}
			return
		}
	}
}

// forwardRequest forwards one request chunk, applying the first pending
// one-shot fault it matches. It reports whether the link is still up.
func (p *Proxy) forwardRequest(l *link, chunk []byte) bool {
	p.mu.Lock()
	var f fault
	for i, pf := range p.pending {
		if pf.match == nil || pf.match(chunk) {
			f = pf
			p.pending = append(p.pending[:i], p.pending[i+1:]...)
			break
		}
	}
	l.hurt = f.kind
	if f.kind == resetConn {
		p.stats.Resets++
	}
	p.mu.Unlock()
	if f.kind == resetConn && !f.forward {
		l.close(true)
		return false
	}
	if _, err := l.up.Write(chunk); err != nil {
		return false
	}
	if f.kind == resetConn {
		l.close(true)
		return false
	}
	return true
}

// wait holds the caller for the latency, and while a blackhole lasts.
func (p *Proxy) wait() {
	p.mu.Lock()
	d, until := p.latency, p.holdUntil
	held := time.Now().Before(until)
	if held {
		p.stats.Held++
	}
	p.mu.Unlock()
	if d > 0 {
		time.Sleep(d)
	}
	for held {
		time.Sleep(min(time.Until(until), 10*time.Millisecond))
		p.mu.Lock()
		until, closed := p.holdUntil, p.closed
		p.mu.Unlock()
		held = !closed && time.Now().Before(until)
	}
}

// close ends both sides of the link once; with rst, each side with a TCP RST
// rather than an orderly FIN.
func (l *link) close(rst bool) {
	l.once.Do(func() {
		for _, c := range []net.Conn{l.client, l.up} {
			if tc, ok := c.(*net.TCPConn); ok && rst {
				_ = tc.SetLinger(0) // close sends RST and discards unsent data
			}
			_ = c.Close()
		}
	})
}

// closeWrite half-closes c and reports whether it could.
func closeWrite(c net.Conn) bool {
	tc, ok := c.(*net.TCPConn)
	return ok && tc.CloseWrite() == nil
}
