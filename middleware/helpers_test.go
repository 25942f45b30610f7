package middleware

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemgo/idem"
	"github.com/redis/go-redis/v9"
)

// countingStore wraps a Store, counting calls, and can be made to fail.
type countingStore struct {
	idem.Store
	calls      atomic.Int64
	claimErr   error        // returned by Claim when set
	confirmErr atomic.Int64 // Confirm fails this many times first
	mu         sync.Mutex
	keys       []string // keys Claim was called with
}

var errStoreDown = errors.New("dial tcp 10.0.0.7:6379: connect: connection refused (secret internals)")

func (s *countingStore) Claim(ctx context.Context, key string, fp []byte) (idem.Claim, error) {
	s.calls.Add(1)
	s.mu.Lock()
	s.keys = append(s.keys, key)
	s.mu.Unlock()
	if s.claimErr != nil {
		return idem.Claim{}, s.claimErr
	}
	return s.Store.Claim(ctx, key, fp)
}

func (s *countingStore) Confirm(ctx context.Context, l *idem.Lease, result []byte) error {
	s.calls.Add(1)
	if s.confirmErr.Add(-1) >= 0 {
		return errStoreDown
	}
	return s.Store.Confirm(ctx, l, result)
}

func (s *countingStore) Forget(ctx context.Context, l *idem.Lease) error {
	s.calls.Add(1)
	return s.Store.Forget(ctx, l)
}

func (s *countingStore) Renew(ctx context.Context, l *idem.Lease) error {
	s.calls.Add(1)
	return s.Store.Renew(ctx, l)
}

func (s *countingStore) Lookup(ctx context.Context, key string) (*idem.Record, error) {
	s.calls.Add(1)
	return s.Store.Lookup(ctx, key)
}

func (s *countingStore) claimedKeys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...)
}

// newCounting returns a countingStore over a fresh MemoryStore.
func newCounting() *countingStore {
	return &countingStore{Store: memStore(idem.Options{})}
}

// newMiniredisStore returns a RedisStore on a fresh miniredis.
func newMiniredisStore(t testing.TB) (*idem.RedisStore, *miniredis.Miniredis) {
	t.Helper()
	srv := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	st, err := idem.NewRedisStore(c, idem.RedisOptions{})
	if err != nil {
		t.Fatalf("NewRedisStore = %v", err)
	}
	return st, srv
}

// counter is a handler that counts its runs and answers 201 with the run
// number, a Location, a cookie and a header that is not replayed.
type counter struct{ runs atomic.Int64 }

func (c *counter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := c.runs.Add(1)
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/17")
	w.Header().Set("Set-Cookie", "session=s3cret")
	w.Header().Set("X-Run", "private")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(map[string]any{"run": n, "body": string(body)})
}

// mustNew is New that fails t on an error.
func mustNew(t testing.TB, o Options, next http.Handler) http.Handler {
	t.Helper()
	mw, err := New(o)
	if err != nil {
		t.Fatalf("New(%+v) = %v", o, err)
	}
	return mw(next)
}

// req is one request of a sequence.
type req struct {
	method, path, key, body string
	keys                    []string // several header fields, when set
	header                  map[string]string
}

func (q req) build() *http.Request {
	method := q.method
	if method == "" {
		method = http.MethodPost
	}
	path := q.path
	if path == "" {
		path = "/orders"
	}
	r := httptest.NewRequest(method, path, strings.NewReader(q.body))
	r.Header.Set("Content-Type", "application/json")
	if q.key != "" {
		r.Header.Set("Idempotency-Key", q.key)
	}
	for _, k := range q.keys {
		r.Header.Add("Idempotency-Key", k)
	}
	for k, v := range q.header {
		r.Header.Set(k, v)
	}
	return r
}

// do sends q through h and returns the response.
func do(h http.Handler, q req) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, q.build())
	return w
}

// wantProblem checks that w is a problem+json of type typ and status.
func wantProblem(t *testing.T, w *httptest.ResponseRecorder, status int, typ string) {
	t.Helper()
	if w.Code != status {
		t.Errorf("status = %d; want %d (body %s)", w.Code, status, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type = %q; want application/problem+json", ct)
	}
	var p Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q does not decode: %v", w.Body, err)
	}
	if p.Type != typ || p.Status != status || p.Title == "" {
		t.Errorf("problem = %+v; want type %s, status %d and a title", p, typ, status)
	}
	if strings.Contains(w.Body.String(), "secret") || strings.Contains(w.Body.String(), "idem:") {
		t.Errorf("problem body %q shows internal error text", w.Body)
	}
}

// memStore is idem.NewMemoryStore for tests, whose options are valid.
func memStore(o idem.Options) *idem.MemoryStore {
	return must(idem.NewMemoryStore(o))
}

// must returns v, or panics with err: for constructors given options a
// test knows are valid.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
