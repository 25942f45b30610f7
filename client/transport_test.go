package client

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fast are Options whose waits keep a test short.
func fast(o Options) Options {
	o.InitialWait = cmpOr(o.InitialWait, time.Millisecond)
	o.MaxWait = cmpOr(o.MaxWait, 20*time.Millisecond)
	return o
}

func cmpOr(v, def time.Duration) time.Duration {
	if v == 0 {
		return def
	}
	return v
}

func mustNew(t testing.TB, o Options) *Transport {
	t.Helper()
	tr, err := New(o)
	if err != nil {
		t.Fatalf("New(%+v) = %v", o, err)
	}
	return tr
}

// seen records what a test server received.
type seen struct {
	mu     sync.Mutex
	keys   []string
	bodies []string
}

func (s *seen) add(r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys = append(s.keys, r.Header.Get("Idempotency-Key"))
	s.bodies = append(s.bodies, string(b))
}

func (s *seen) get() ([]string, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...), append([]string(nil), s.bodies...)
}

// statusServer answers the statuses in turn, then 201.
func statusServer(t *testing.T, s *seen, statuses ...int) *httptest.Server {
	t.Helper()
	srv := unstartedStatusServer(s, statuses...)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

func unstartedStatusServer(s *seen, statuses ...int) *httptest.Server {
	var n atomic.Int64
	return httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.add(r)
		i := int(n.Add(1)) - 1
		if i < len(statuses) {
			w.WriteHeader(statuses[i])
			_, _ = io.WriteString(w, strings.Repeat("x", 1000)) // drained by the transport
			return
		}
		w.WriteHeader(201)
		_, _ = io.WriteString(w, "created")
	}))
}

// roundTripFunc is a RoundTripper made of a func.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestNewRefusesMistakes(t *testing.T) {
	for _, tc := range []struct {
		o     Options
		field string
	}{
		{Options{MaxAttempts: -1}, "MaxAttempts"},
		{Options{MaxElapsed: -time.Second}, "MaxElapsed"},
		{Options{InitialWait: -time.Second}, "InitialWait"},
		{Options{MaxWait: -time.Second}, "MaxWait"},
		{Options{InitialWait: 10 * time.Second}, "InitialWait"}, // longer than the default MaxWait
		{Options{Header: "Idempotency Key"}, "Header"},
		{Options{Methods: []string{"post"}}, "Methods"},
		{Options{Methods: []string{"POST", "POST"}}, "Methods"},
		{Options{Methods: []string{"PO ST"}}, "Methods"},
		{Options{Base: (*http.Transport)(nil)}, "Base"},
		{Options{Base: http.RoundTripper((*http.Transport)(nil))}, "Base"},
		{Options{Base: roundTripFunc(nil)}, "Base"},
	} {
		_, err := New(tc.o)
		if err == nil || !strings.Contains(err.Error(), "client: "+tc.field+":") {
			t.Errorf("New(%+v) = %v; want an error naming %s", tc.o, err, tc.field)
		}
	}
	if _, err := New(Options{}); err != nil {
		t.Errorf("New(Options{}) = %v; want the defaults, Base http.DefaultTransport", err)
	}
	want := "client: Base: (*http.Transport)(nil) is nil and would panic on the first request; leave Base nil for the default, http.DefaultTransport"
	if _, err := New(Options{Base: (*http.Transport)(nil)}); err == nil || err.Error() != want {
		t.Errorf("New with a typed-nil Base = %v; want %q", err, want)
	}
}

// One key per logical request, the same on every attempt, set on a copy:
// the caller's request is untouched, the final response's request has it.
func TestOneKeyPerRequest(t *testing.T) {
	var s seen
	srv := statusServer(t, &s, 503, 500)
	c := &http.Client{Transport: mustNew(t, fast(Options{}))}
	req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(`{"a":1}`))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("Do = %v", err)
	}
	_ = resp.Body.Close()
	keys, bodies := s.get()
	if resp.StatusCode != 201 || len(keys) != 3 || keys[0] == "" || keys[1] != keys[0] || keys[2] != keys[0] {
		t.Fatalf("status %d, keys %q; want 201 after 3 attempts with one key", resp.StatusCode, keys)
	}
	for i, b := range bodies {
		if b != `{"a":1}` {
			t.Errorf("attempt %d body = %q; want the whole body again", i+1, b)
		}
	}
	if got := resp.Request.Header.Get("Idempotency-Key"); got != keys[0] {
		t.Errorf("resp.Request key = %q; want the key sent, %q", got, keys[0])
	}
	if got := req.Header.Get("Idempotency-Key"); got != "" {
		t.Errorf("caller's request key = %q; want it untouched", got)
	}

	// A second logical request gets another key; a caller's key is kept.
	req2, _ := http.NewRequest("POST", srv.URL, strings.NewReader(`{}`))
	resp2, _ := c.Do(req2)
	_ = resp2.Body.Close()
	req3, _ := http.NewRequest("PATCH", srv.URL, nil)
	req3.Header.Set("Idempotency-Key", "mine")
	resp3, _ := c.Do(req3)
	_ = resp3.Body.Close()
	keys, _ = s.get()
	if keys[3] == keys[0] || keys[4] != "mine" || resp3.Request != req3 {
		t.Errorf("keys %q; want a new key for the second request, the caller's \"mine\" for the third, sent on its own request", keys)
	}
}

// Which statuses are retried: those that say "not now", never another 4xx.
func TestStatuses(t *testing.T) {
	for _, tc := range []struct {
		status   int
		attempts int
	}{
		{409, 2}, {429, 2}, {500, 2}, {502, 2}, {503, 2}, {504, 2},
		{400, 1}, {401, 1}, {404, 1}, {413, 1}, {422, 1}, {501, 1},
	} {
		var s seen
		srv := statusServer(t, &s, tc.status)
		c := &http.Client{Transport: mustNew(t, fast(Options{}))}
		resp, err := c.Post(srv.URL, "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatalf("POST (%d) = %v", tc.status, err)
		}
		_ = resp.Body.Close()
		keys, _ := s.get()
		want := tc.status
		if tc.attempts == 2 {
			want = 201
		}
		if len(keys) != tc.attempts || resp.StatusCode != want {
			t.Errorf("first answer %d: %d attempts, final %d; want %d, %d", tc.status, len(keys), resp.StatusCode, tc.attempts, want)
		}
	}
}

// GET and the other uncovered methods pass through: no key, no retry.
func TestUncoveredMethodPassesThrough(t *testing.T) {
	var s seen
	srv := statusServer(t, &s, 503)
	c := &http.Client{Transport: mustNew(t, fast(Options{}))}
	resp, err := c.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if keys, _ := s.get(); resp.StatusCode != 503 || len(keys) != 1 || keys[0] != "" {
		t.Errorf("GET: %d, keys %q; want the 503 of one attempt without a key", resp.StatusCode, keys)
	}
}

// A body without GetBody is sent once, and the error says why.
func TestUnresendableBodySentOnce(t *testing.T) {
	var s seen
	srv := statusServer(t, &s, 503)
	var hooked []Attempt
	c := &http.Client{Transport: mustNew(t, fast(Options{OnAttempt: func(a Attempt) { hooked = append(hooked, a) }}))}
	req, _ := http.NewRequest("POST", srv.URL, io.NopCloser(strings.NewReader(`{"a":1}`)))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if keys, _ := s.get(); resp.StatusCode != 503 || len(keys) != 1 || keys[0] == "" {
		t.Errorf("status %d, keys %q; want the 503 of one attempt, with a key", resp.StatusCode, keys)
	}
	if len(hooked) != 1 || hooked[0].Retry || hooked[0].Reason != "body" {
		t.Errorf("attempts %+v; want one, not retried for reason \"body\"", hooked)
	}
}

// Retry-After is honoured when longer than the backoff, capped by MaxWait.
func TestRetryAfter(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			w.Header().Set("Retry-After", "3600")
			w.WriteHeader(429)
			return
		}
		w.WriteHeader(201)
	}))
	defer srv.Close()
	var waits []time.Duration
	tr := mustNew(t, Options{InitialWait: time.Millisecond, MaxWait: 150 * time.Millisecond,
		OnAttempt: func(a Attempt) { waits = append(waits, a.Wait) }})
	start := time.Now()
	resp, err := (&http.Client{Transport: tr}).Post(srv.URL, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	took := time.Since(start)
	if resp.StatusCode != 201 || len(waits) != 2 || waits[0] != 150*time.Millisecond || took < 150*time.Millisecond || took > 2*time.Second {
		t.Errorf("status %d, waits %v, took %v; want 201 after one wait of MaxWait 150ms (Retry-After 3600 capped)", resp.StatusCode, waits, took)
	}
	if d := retryAfter(&http.Response{Header: http.Header{"Retry-After": {time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)}}}); d < 59*time.Minute {
		t.Errorf("retryAfter(an HTTP date an hour ahead) = %v; want about 1h", d)
	}
}

// Bounded by MaxAttempts, by MaxElapsed and by the context.
func TestBounds(t *testing.T) {
	always := func(status int) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(status) }))
		t.Cleanup(srv.Close)
		return srv
	}
	srv := always(503)
	var n int
	tr := mustNew(t, fast(Options{MaxAttempts: 3, OnAttempt: func(Attempt) { n++ }}))
	resp, err := (&http.Client{Transport: tr}).Post(srv.URL, "", nil)
	if err != nil || resp.StatusCode != 503 || n != 3 {
		t.Errorf("MaxAttempts 3: %v, %d attempts; want the last 503 after 3", err, n)
	}
	if resp != nil {
		_ = resp.Body.Close()
	}

	n = 0
	tr = mustNew(t, Options{MaxAttempts: 100, InitialWait: 40 * time.Millisecond, MaxWait: 40 * time.Millisecond, MaxElapsed: 100 * time.Millisecond,
		OnAttempt: func(Attempt) { n++ }})
	start := time.Now()
	resp, err = (&http.Client{Transport: tr}).Post(srv.URL, "", nil)
	if err != nil || resp.StatusCode != 503 || n < 2 || n > 4 || time.Since(start) > 150*time.Millisecond {
		t.Errorf("MaxElapsed 100ms, waits 20-40ms: %v, %d attempts in %v; want the last 503 within 100ms", err, n, time.Since(start))
	}
	if resp != nil {
		_ = resp.Body.Close()
	}

	ctx, cancel := context.WithCancel(context.Background())
	tr = mustNew(t, Options{MaxWait: time.Hour, InitialWait: time.Hour, MaxElapsed: 2 * time.Hour,
		OnAttempt: func(Attempt) { time.AfterFunc(20*time.Millisecond, cancel) }})
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, nil)
	start = time.Now()
	_, err = tr.RoundTrip(req)
	if !errors.Is(err, context.Canceled) || time.Since(start) > time.Second {
		t.Errorf("context cancelled during an hour's wait: %v after %v; want context.Canceled at once", err, time.Since(start))
	}
}

// A refused connection is retried; the error after the last attempt says
// how many there were and wraps the cause.
func TestTransportErrorRetried(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close() // nothing listens: connection refused
	var n int
	tr := mustNew(t, fast(Options{MaxAttempts: 3, OnAttempt: func(Attempt) { n++ }}))
	req, _ := http.NewRequest("POST", "http://"+addr+"/", strings.NewReader("{}"))
	_, err = tr.RoundTrip(req)
	var op *net.OpError
	if n != 3 || !errors.As(err, &op) || !strings.Contains(err.Error(), "3 attempt") {
		t.Errorf("refused: %d attempts, %v; want 3, the *net.OpError wrapped with the count", n, err)
	}
}

// Retried responses are drained and closed: every attempt reuses one
// connection.
func TestRetriedBodiesDrained(t *testing.T) {
	var s seen
	srv := unstartedStatusServer(&s, 503, 503, 503)
	var conns atomic.Int64
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	c := &http.Client{Transport: mustNew(t, fast(Options{Base: base}))}
	resp, err := c.Post(srv.URL, "", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if n := conns.Load(); resp.StatusCode != 201 || n != 1 {
		t.Errorf("status %d over %d connections; want 201, all 4 attempts on 1 connection", resp.StatusCode, n)
	}
}
