package faultproxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// lineServer is an upstream that answers each line "x\n" with "ok x\n" and
// remembers the lines it was sent, so a test can tell whether a request
// reached the server.
type lineServer struct {
	l    net.Listener
	mu   sync.Mutex
	seen []string
	wg   sync.WaitGroup
}

func startLineServer(t *testing.T) *lineServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &lineServer{l: l}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer func() { _ = c.Close() }()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					s.mu.Lock()
					s.seen = append(s.seen, strings.TrimSuffix(line, "\n"))
					s.mu.Unlock()
					if _, err := io.WriteString(c, "ok "+line); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		s.wg.Wait()
	})
	return s
}

func (s *lineServer) received(line string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.seen {
		if l == line {
			return true
		}
	}
	return false
}

func startProxy(t *testing.T, upstream string) *Proxy {
	t.Helper()
	p, err := Start(upstream)
	if err != nil {
		t.Fatalf("Start(%q) = %v", upstream, err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// client is one connection through the proxy.
type client struct {
	c net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, p *Proxy) *client {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatalf("dial %s: %v", p.Addr(), err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &client{c: c, r: bufio.NewReader(c)}
}

// call sends line and returns the answer, or the error that ended the wait.
func (c *client) call(line string, timeout time.Duration) (string, error) {
	_ = c.c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c.c, line+"\n"); err != nil {
		return "", err
	}
	got, err := c.r.ReadString('\n')
	return strings.TrimSuffix(got, "\n"), err
}

func TestForwards(t *testing.T) {
	srv := startLineServer(t)
	p := startProxy(t, srv.l.Addr().String())
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", p.Addr())
			if err != nil {
				errs <- err
				return
			}
			defer func() { _ = c.Close() }()
			cl := &client{c: c, r: bufio.NewReader(c)}
			for j := range 20 {
				req := strings.Repeat("x", i) + string(rune('a'+j))
				if got, err := cl.call(req, 5*time.Second); err != nil || got != "ok "+req {
					errs <- errors.New("call(" + req + ") = " + got)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if st := p.Stats(); st.Accepted != 8 || st.DroppedReplies != 0 || st.Resets != 0 || st.Held != 0 {
		t.Errorf("Stats() = %+v; want 8 connections accepted and no faults", st)
	}
}

func TestLatency(t *testing.T) {
	srv := startLineServer(t)
	p := startProxy(t, srv.l.Addr().String())
	c := dial(t, p)
	const d = 50 * time.Millisecond
	p.SetLatency(d)
	start := time.Now()
	if got, err := c.call("slow", 5*time.Second); err != nil || got != "ok slow" {
		t.Fatalf("call(slow) = %q, %v; want %q", got, err, "ok slow")
	}
	if took := time.Since(start); took < 2*d {
		t.Errorf("a round trip with latency %v took %v; want at least %v", d, took, 2*d)
	}
	p.SetLatency(0)
	start = time.Now()
	if got, err := c.call("fast", 5*time.Second); err != nil || got != "ok fast" {
		t.Fatalf("call(fast) = %q, %v; want %q", got, err, "ok fast")
	}
	if took := time.Since(start); took >= 2*d {
		t.Errorf("a round trip without latency took %v; want well under %v", took, 2*d)
	}
}

func TestDropNextReply(t *testing.T) {
	srv := startLineServer(t)
	p := startProxy(t, srv.l.Addr().String())
	c := dial(t, p)
	p.DropNextReply(func(req []byte) bool { return bytes.Contains(req, []byte("pay")) })
	// A request that does not match goes through.
	if got, err := c.call("look", 5*time.Second); err != nil || got != "ok look" {
		t.Fatalf("call(look) = %q, %v; want %q", got, err, "ok look")
	}
	if n := p.Pending(); n != 1 {
		t.Fatalf("Pending() = %d after a request that does not match; want 1", n)
	}
	got, err := c.call("pay 1", 5*time.Second)
	if !errors.Is(err, io.EOF) || got != "" {
		t.Errorf("call(pay 1) with its reply dropped = %q, %v; want no answer and EOF", got, err)
	}
	if !srv.received("pay 1") {
		t.Errorf("the server never received %q; want it forwarded before the reply was lost", "pay 1")
	}
	if st := p.Stats(); st.DroppedReplies != 1 || p.Pending() != 0 {
		t.Errorf("Stats() = %+v, Pending() = %d; want 1 reply dropped, nothing pending", st, p.Pending())
	}
	// One reply only: a new connection works.
	c2 := dial(t, p)
	if got, err := c2.call("pay 2", 5*time.Second); err != nil || got != "ok pay 2" {
		t.Errorf("call(pay 2) on a new connection = %q, %v; want %q", got, err, "ok pay 2")
	}
}

func TestResetNext(t *testing.T) {
	srv := startLineServer(t)
	p := startProxy(t, srv.l.Addr().String())
	c := dial(t, p)
	other := dial(t, p)
	if got, err := other.call("warm", 5*time.Second); err != nil || got != "ok warm" {
		t.Fatalf("call(warm) = %q, %v", got, err)
	}
	p.ResetNext(nil, false)
	_, err := c.call("boom", 5*time.Second)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("call(boom) on a reset connection = %v; want ECONNRESET", err)
	}
	// Not forwarded: the server never sees it. (Give a forwarded one time
	// to arrive, so that this could fail.)
	forwarded := dial(t, p)
	p.ResetNext(func(req []byte) bool { return bytes.Contains(req, []byte("sent")) }, true)
	if _, err := forwarded.call("sent", 5*time.Second); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("call(sent) on a connection reset after forwarding = %v; want ECONNRESET", err)
	}
	time.Sleep(50 * time.Millisecond)
	if st := p.Stats(); st.Resets != 2 {
		t.Errorf("Stats().Resets = %d; want 2", st.Resets)
	}
	if srv.received("boom") {
		t.Errorf("the server received %q; want a request reset before forwarding never to reach it", "boom")
	}
	// Only that connection was reset.
	if got, err := other.call("still", 5*time.Second); err != nil || got != "ok still" {
		t.Errorf("call(still) on another connection = %q, %v; want %q", got, err, "ok still")
	}
	// The server answers at once, yet its answer never beats the reset.
	for i := range 50 {
		p.ResetNext(nil, true)
		if got, err := dial(t, p).call("race", 5*time.Second); err == nil {
			t.Fatalf("call %d on a connection reset mid-command = %q, nil error; want the reply lost", i, got)
		}
	}
}

func TestResetAll(t *testing.T) {
	srv := startLineServer(t)
	p := startProxy(t, srv.l.Addr().String())
	cs := []*client{dial(t, p), dial(t, p), dial(t, p)}
	for _, c := range cs {
		if _, err := c.call("hi", 5*time.Second); err != nil {
			t.Fatalf("call(hi) = %v", err)
		}
	}
	if n := p.ResetAll(); n != 3 {
		t.Errorf("ResetAll() = %d; want 3 connections", n)
	}
	for i, c := range cs {
		_ = c.c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.r.ReadByte(); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("connection %d after ResetAll: read = %v; want ECONNRESET", i, err)
		}
	}
	if got, err := dial(t, p).call("again", 5*time.Second); err != nil || got != "ok again" {
		t.Errorf("call(again) on a new connection = %q, %v; want %q", got, err, "ok again")
	}
}

func TestBlackhole(t *testing.T) {
	srv := startLineServer(t)
	p := startProxy(t, srv.l.Addr().String())
	c := dial(t, p)
	if _, err := c.call("before", 5*time.Second); err != nil {
		t.Fatalf("call(before) = %v", err)
	}
	// Long enough that a loaded machine still makes both calls within it.
	const d = time.Second
	start := time.Now()
	p.Blackhole(d)
	// Nothing comes back while it lasts, on an old or a new connection.
	if got, err := c.call("held", 150*time.Millisecond); !isTimeout(err) {
		t.Errorf("call(held) during a blackhole = %q, %v; want a timeout", got, err)
	}
	fresh := dial(t, p) // still accepted
	if got, err := fresh.call("new", 150*time.Millisecond); !isTimeout(err) {
		t.Errorf("call(new) during a blackhole = %q, %v; want a timeout", got, err)
	}
	if srv.received("held") || srv.received("new") {
		t.Errorf("the server received a request during the blackhole; want nothing forwarded")
	}
	// Afterwards what was held goes through, in order.
	_ = c.c.SetDeadline(time.Now().Add(5 * time.Second))
	got, err := c.r.ReadString('\n')
	if err != nil || got != "ok held\n" {
		t.Errorf("after the blackhole: %q, %v; want the held request answered", got, err)
	}
	if took := time.Since(start); took < d {
		t.Errorf("the held request was answered after %v; want after the blackhole's %v", took, d)
	}
	if got, err := c.call("after", 5*time.Second); err != nil || got != "ok after" {
		t.Errorf("call(after) = %q, %v; want %q", got, err, "ok after")
	}
	if st := p.Stats(); st.Held < 2 {
		t.Errorf("Stats().Held = %d; want at least the 2 requests held", st.Held)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestClose(t *testing.T) {
	srv := startLineServer(t)
	p, err := Start(srv.l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, p)
	if _, err := c.call("hi", 5*time.Second); err != nil {
		t.Fatalf("call(hi) = %v", err)
	}
	p.Blackhole(time.Hour) // Close must not wait for it
	done := make(chan error, 1)
	go func() { done <- p.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Close() = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close() did not return within 5s")
	}
	if _, err := c.call("gone", 5*time.Second); err == nil {
		t.Errorf("call on a closed proxy's connection succeeded; want an error")
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Errorf("dial after Close succeeded; want the port closed")
	}
}

func TestStartBadUpstream(t *testing.T) {
	if _, err := Start("no-port"); err == nil {
		t.Errorf("Start(%q) = nil error; want one", "no-port")
	}
	// An upstream nobody listens on: the client's connection is closed.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	p := startProxy(t, addr)
	if _, err := dial(t, p).call("x", 5*time.Second); err == nil {
		t.Errorf("call through a proxy whose upstream is down succeeded; want an error")
	}
}
