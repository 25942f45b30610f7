package testenv

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// LossyDialer dials real connections that can lose one reply: once armed,
// the first connection that writes a command containing the armed pattern
// reads the reply for real (so the server has run the command), throws it
// away, closes the connection and returns io.EOF, an error go-redis retries
// on a new connection (shouldRetry).
type LossyDialer struct {
	mu      sync.Mutex
	pattern []byte // counted in every write; nil: nothing counted
	armed   bool   // the next matching write loses its reply
	lines   int    // CRLF-terminated lines in the reply to read before dropping it
	writes  int    // writes that carried pattern
	lost    []byte // the reply that was thrown away
	dials   int
	// OnLoss, when set, is called after a reply was thrown away and before
	// the client is told: a test moves the server's clock there, as time
	// passing between a command and its retry.
	OnLoss func()
}

// Dial is a go-redis Options.Dialer.
func (d *LossyDialer) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.dials++
	d.mu.Unlock()
	return &lossyConn{Conn: c, d: d}, nil
}

// Arm makes the next command containing pattern lose a reply of lines lines.
func (d *LossyDialer) Arm(pattern string, lines int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pattern, d.armed, d.lines, d.writes, d.lost = []byte(pattern), true, lines, 0, nil
}

// Result reports the writes that carried the pattern, the reply lost, and
// whether the dialer is still armed.
func (d *LossyDialer) Result() (writes int, lost string, stillArmed bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.writes, string(d.lost), d.armed
}

type lossyConn struct {
	net.Conn
	d     *LossyDialer
	lines atomic.Int32 // >0: lose the next reply, of this many lines
}

func (c *lossyConn) Write(p []byte) (int, error) {
	d := c.d
	d.mu.Lock()
	if d.pattern != nil && bytes.Contains(p, d.pattern) {
		d.writes++
		if d.armed {
			d.armed = false
			c.lines.Store(int32(d.lines))
		}
	}
	d.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *lossyConn) Read(p []byte) (int, error) {
	lines := int(c.lines.Swap(0))
	if lines == 0 {
		return c.Conn.Read(p)
	}
	// Read the whole reply first: the server has run the command and
	// answered, and only then is the answer lost.
	var reply []byte
	buf := make([]byte, 512)
	_ = c.Conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	for bytes.Count(reply, []byte("\r\n")) < lines {
		n, err := c.Conn.Read(buf)
		reply = append(reply, buf[:n]...)
		if err != nil {
			break
		}
	}
	c.d.mu.Lock()
	c.d.lost = reply
	onLoss := c.d.OnLoss
	c.d.mu.Unlock()
	if onLoss != nil {
		onLoss()
	}
	_ = c.Conn.Close()
	return 0, io.EOF
}

// Dials is how many connections the dialer has made.
func (d *LossyDialer) Dials() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dials
}
