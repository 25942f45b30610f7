package client

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/faultproxy"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/idemgo/idem/middleware"
)

// rig is the real middleware on the real Redis store, served over HTTP
// behind a fault proxy: the client talks to the proxy.
type rig struct {
	proxy *faultproxy.Proxy
	url   string
	// hold, when set, is called by the handler after the order's effect
	// and before its response.
	hold func(key string)

	mu   sync.Mutex
	runs map[string]int // handler runs per client key
}

func newRig(t *testing.T, mo middleware.Options) *rig {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	st, err := idem.NewRedisStore(testenv.Redis(t), idem.RedisOptions{Prefix: "idem-client-" + hex.EncodeToString(b[:]) + ":"})
	if err != nil {
		t.Fatalf("NewRedisStore = %v", err)
	}
	mo.Store, mo.SingleTenant = st, true
	mw, err := middleware.New(mo)
	if err != nil {
		t.Fatalf("middleware.New = %v", err)
	}
	r := &rig{runs: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		key := req.Header.Get("Idempotency-Key")
		r.mu.Lock()
		r.runs[key]++
		n := r.runs[key]
		r.mu.Unlock()
		if r.hold != nil {
			r.hold(key)
		}
		w.WriteHeader(201)
		fmt.Fprintf(w, "order %s, run %d", body, n)
	})
	srv := httptest.NewServer(mw(mux))
	t.Cleanup(srv.Close)
	p, err := faultproxy.Start(srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	r.proxy, r.url = p, "http://"+p.Addr()+"/orders"
	return r
}

func (r *rig) runsOf(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs[key]
}

// isPOST matches a request chunk that starts a POST.
func isPOST(b []byte) bool { return bytes.HasPrefix(b, []byte("POST ")) }

// log collects a transport's attempts.
type log struct {
	mu sync.Mutex
	a  []Attempt
}

func (l *log) add(a Attempt) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a.Response = nil // its body belongs to the transport
	l.a = append(l.a, a)
}

// attempts counts the attempts that carried key.
func (l *log) attempts(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, a := range l.a {
		if a.Request.Header.Get("Idempotency-Key") == key {
			n++
		}
	}
	return n
}

func (l *log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var s []string
	for _, a := range l.a {
		what := fmt.Sprint(a.Err)
		if a.Err == nil {
			what = "ok"
		}
		s = append(s, fmt.Sprintf("#%d %s retry=%v wait=%v %s", a.N, what, a.Retry, a.Wait, a.Reason))
	}
	return strings.Join(s, "; ")
}

// order POSTs body through tr and returns the status, the body and the key
// sent.
func order(t *testing.T, tr http.RoundTripper, url, key, body string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatalf("POST %s = %v", body, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Request.Header.Get("Idempotency-Key")
}

// checkOnce checks that an order was answered by its one run.
func checkOnce(t *testing.T, r *rig, status int, body, key, want string, l *log) {
	t.Helper()
	if status != 201 || body != "order "+want+", run 1" || r.runsOf(key) != 1 {
		t.Errorf("order %s: %d %q, %d runs of key %q; want 201 \"order %s, run 1\" from its one run (attempts: %v)",
			want, status, body, r.runsOf(key), key, want, l)
	}
}

// A response lost after the handler ran: the retry with the key gets the
// replay, the order runs once.
func TestDroppedResponses(t *testing.T) {
	r := newRig(t, middleware.Options{})
	var l log
	// net/http resends a request with an Idempotency-Key once by itself
	// when a reused connection closes before the response: fresh
	// connections leave every retry to the transport under test.
	base := &http.Transport{DisableKeepAlives: true}
	tr := mustNew(t, fast(Options{Base: base, OnAttempt: l.add}))
	for i := range 10 {
		r.proxy.DropNextReply(isPOST)
		body := fmt.Sprintf(`{"n":%d}`, i)
		status, got, key := order(t, tr, r.url, "", body)
		checkOnce(t, r, status, got, key, body, &l)
		if n := l.attempts(key); n != 2 {
			t.Errorf("order %s: %d attempts; want 2, the lost one and its retry (%v)", body, n, &l)
		}
	}
	if st := r.proxy.Stats(); st.DroppedReplies != 10 {
		t.Errorf("proxy dropped %d replies; want 10", st.DroppedReplies)
	}
}

// A connection reset after the handler ran, before its response: the
// outcome is unknown to the client, the retry replays.
func TestResetAfterHandlerRan(t *testing.T) {
	r := newRig(t, middleware.Options{})
	var once sync.Once
	r.hold = func(string) {
		once.Do(func() {
			if n := r.proxy.ResetAll(); n == 0 {
				t.Errorf("ResetAll reset no connection")
			}
		})
	}
	var l log
	base := &http.Transport{DisableKeepAlives: true} // see TestDroppedResponses
	tr := mustNew(t, fast(Options{Base: base, OnAttempt: l.add}))
	status, got, key := order(t, tr, r.url, "", `{"reset":1}`)
	checkOnce(t, r, status, got, key, `{"reset":1}`, &l)
	if n := l.attempts(key); n < 2 {
		t.Errorf("reset after the handler: %d attempts; want a retry (%v)", n, &l)
	}

	// And a reset right after the request was forwarded: the server may or
	// may not have run it.
	r.proxy.ResetNext(isPOST, true)
	status, got, key = order(t, tr, r.url, "", `{"reset":2}`)
	checkOnce(t, r, status, got, key, `{"reset":2}`, &l)
	if n := l.attempts(key); n < 2 {
		t.Errorf("reset after forwarding: %d attempts; want a retry (%v)", n, &l)
	}
	if st := r.proxy.Stats(); st.Resets < 2 {
		t.Errorf("proxy reset %d connections; want 2", st.Resets)
	}
}

// A response delayed past the client's timeout: the retry, on a fresh
// connection, gets the one run's response.
func TestDelayedPastTimeout(t *testing.T) {
	r := newRig(t, middleware.Options{})
	r.proxy.SetLatency(150 * time.Millisecond) // 300ms a round trip
	var l log
	base := &http.Transport{ResponseHeaderTimeout: 100 * time.Millisecond}
	defer base.CloseIdleConnections()
	tr := mustNew(t, fast(Options{Base: base, OnAttempt: func(a Attempt) {
		l.add(a)
		r.proxy.SetLatency(0)
	}}))
	status, got, key := order(t, tr, r.url, "", `{"slow":1}`)
	checkOnce(t, r, status, got, key, `{"slow":1}`, &l)
	var ne net.Error
	if len(l.a) < 2 || !errors.As(l.a[0].Err, &ne) || !ne.Timeout() {
		t.Errorf("attempts %v; want a timeout first, then a retry", &l)
	}
}

// A blackhole that heals: every attempt during it times out; the requests
// held in it reach the server when it heals, with the retry's; the order
// runs once.
func TestBlackholeHeals(t *testing.T) {
	r := newRig(t, middleware.Options{})
	var l log
	base := &http.Transport{ResponseHeaderTimeout: 100 * time.Millisecond}
	defer base.CloseIdleConnections()
	tr := mustNew(t, Options{Base: base, MaxAttempts: 20, InitialWait: 20 * time.Millisecond, MaxWait: 100 * time.Millisecond, OnAttempt: l.add})
	r.proxy.Blackhole(500 * time.Millisecond)
	status, got, key := order(t, tr, r.url, "", `{"partition":1}`)
	time.Sleep(200 * time.Millisecond) // let the held requests reach the server
	checkOnce(t, r, status, got, key, `{"partition":1}`, &l)
	if st := r.proxy.Stats(); len(l.a) < 3 || st.Held == 0 {
		t.Errorf("%d attempts, %d chunks held; want several attempts through the blackhole (%v)", len(l.a), st.Held, &l)
	}
}

// The first attempt times out while its handler still runs; the retry
// gets 409, waits, and gets the replay.
func TestInProgressThenReplay(t *testing.T) {
	r := newRig(t, middleware.Options{LockTimeout: 50 * time.Millisecond})
	release := make(chan struct{})
	var once sync.Once
	r.hold = func(string) { <-release }
	var l log
	base := &http.Transport{ResponseHeaderTimeout: 100 * time.Millisecond}
	defer base.CloseIdleConnections()
	tr := mustNew(t, fast(Options{Base: base, MaxWait: 300 * time.Millisecond, OnAttempt: func(a Attempt) {
		if a.Response != nil && a.Response.StatusCode == 409 {
			once.Do(func() { close(release) })
		}
		l.add(a)
	}}))
	defer once.Do(func() { close(release) })
	status, got, key := order(t, tr, r.url, "", `{"long":1}`)
	checkOnce(t, r, status, got, key, `{"long":1}`, &l)
	var saw409 bool
	for _, a := range l.a {
		saw409 = saw409 || a.Err == nil && a.Retry && a.Wait == 300*time.Millisecond
	}
	if !saw409 {
		t.Errorf("attempts %v; want a 409 waited MaxWait (its Retry-After, the lease, is longer)", &l)
	}
}

// 422 (the key reused for another body) and 400 (a key over the server's
// bound) are answered once, never retried.
func TestClientErrorsNotRetried(t *testing.T) {
	r := newRig(t, middleware.Options{})
	var l log
	tr := mustNew(t, fast(Options{OnAttempt: l.add}))
	if status, _, _ := order(t, tr, r.url, "k-422", `{"a":1}`); status != 201 {
		t.Fatalf("first = %d; want 201", status)
	}
	l.a = nil
	if status, _, _ := order(t, tr, r.url, "k-422", `{"a":2}`); status != 422 || len(l.a) != 1 {
		t.Errorf("same key, other body: %d after %d attempts; want 422 after 1", status, len(l.a))
	}
	l.a = nil
	if status, _, _ := order(t, tr, r.url, strings.Repeat("k", 300), `{}`); status != 400 || len(l.a) != 1 {
		t.Errorf("key over 255 bytes: %d after %d attempts; want 400 after 1", status, len(l.a))
	}
}

// A body that cannot be resent is sent once: its lost response is the
// caller's to resolve, with the key on the error's request.
func TestUnresendableBodyLost(t *testing.T) {
	r := newRig(t, middleware.Options{})
	var l log
	tr := mustNew(t, fast(Options{OnAttempt: l.add}))
	r.proxy.DropNextReply(isPOST)
	req, _ := http.NewRequest("POST", r.url, io.NopCloser(strings.NewReader(`{"once":1}`)))
	// A known length keeps the request one chunk for the proxy (a chunked
	// body is written after the headers, and the proxy's fault follows the
	// last chunk of a request).
	req.ContentLength = int64(len(`{"once":1}`))
	_, err := tr.RoundTrip(req)
	if err == nil || !strings.Contains(err.Error(), "not retried (body)") || len(l.a) != 1 {
		t.Fatalf("RoundTrip = %v after %d attempts; want the error, not retried (body), after 1", err, len(l.a))
	}
	key := l.a[0].Request.Header.Get("Idempotency-Key")
	if n := r.runsOf(key); n != 1 {
		t.Errorf("handler ran %d times for key %q; want 1", n, key)
	}
}
