package middleware

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testing/testenv"
)

// realRedisStore returns a RedisStore on the real Redis (IDEM_REDIS_ADDR),
// under a prefix no other test uses.
func realRedisStore(t testing.TB) *idem.RedisStore {
	t.Helper()
	st, err := idem.NewRedisStore(testenv.Redis(t), idem.RedisOptions{Prefix: uniqueName("idem-mw-") + ":"})
	if err != nil {
		t.Fatalf("NewRedisStore = %v", err)
	}
	return st
}

// post sends a POST through a real HTTP server.
func post(t *testing.T, url, key, body string) (*http.Response, string) {
	t.Helper()
	r, _ := http.NewRequest("POST", url, strings.NewReader(body))
	r.Header.Set("Idempotency-Key", key)
	r.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatalf("POST %s = %v", url, err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	return resp, string(b)
}

// End to end on the real Redis, through a real HTTP server: first, replay,
// 422, in flight (409, then a waiter's replay), 5xx then retry.
func TestRealRedis(t *testing.T) {
	st := realRedisStore(t)
	var runs atomic.Int64
	release := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		body, _ := io.ReadAll(r.Body)
		switch string(body) {
		case `"slow"`:
			<-release
		case `"fail"`:
			if n == 2 { // the first run of the failing key
				http.Error(w, "down", http.StatusServiceUnavailable)
				return
			}
		}
		w.Header().Set("Set-Cookie", "s=1")
		w.WriteHeader(201)
		_, _ = w.Write([]byte("run " + strconv.FormatInt(n, 10)))
	})
	mw, err := New(Options{SingleTenant: true, Store: st, LockTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(mux))
	defer srv.Close()
	url := srv.URL + "/orders"

	first, b1 := post(t, url, "k1", `{}`)
	again, b2 := post(t, url, `"k1"`, `{}`)
	if first.StatusCode != 201 || again.StatusCode != 201 || b1 != b2 || again.Header.Get(HeaderReplayed) != "true" || again.Header.Get("Set-Cookie") != "" {
		t.Errorf("first %d %q, retry %d %q %v; want 201 twice, the same body, a replay without Set-Cookie",
			first.StatusCode, b1, again.StatusCode, b2, again.Header)
	}
	if resp, _ := post(t, url, "k1", `{"x":1}`); resp.StatusCode != 422 {
		t.Errorf("other body = %d; want 422", resp.StatusCode)
	}
	if resp, body := post(t, url, "k2", `"fail"`); resp.StatusCode != 503 || body != "down\n" {
		t.Errorf("failing run = %d %q; want the handler's 503", resp.StatusCode, body)
	}
	if resp, body := post(t, url, "k2", `"fail"`); resp.StatusCode != 201 || body != "run 3" {
		t.Errorf("retry after 5xx = %d %q; want a new run, 201 \"run 3\"", resp.StatusCode, body)
	}

	slow := make(chan string)
	go func() { _, b := post(t, url, "k3", `"slow"`); slow <- b }()
	for runs.Load() < 4 {
		time.Sleep(5 * time.Millisecond)
	}
	resp, _ := post(t, url, "k3", `"slow"`)
	if resp.StatusCode != 409 || resp.Header.Get("Retry-After") == "" {
		t.Errorf("in flight = %d %v; want 409 with Retry-After", resp.StatusCode, resp.Header)
	}
	if resp, _ := post(t, url, "k3", `"other"`); resp.StatusCode != 422 {
		t.Errorf("in flight, other body = %d; want 422 (wins over 409)", resp.StatusCode)
	}
	close(release)
	want := <-slow
	if resp, body := post(t, url, "k3", `"slow"`); resp.StatusCode != 201 || body != want {
		t.Errorf("after the slow run = %d %q; want a replay of %q", resp.StatusCode, body, want)
	}
	if n := runs.Load(); n != 4 {
		t.Errorf("handler ran %d times; want 4", n)
	}
}

// BenchmarkMiddleware measures, on the real Redis, a bare handler and the
// middleware's first-write and replay paths: the difference of ns/op is
// the latency the middleware adds; allocs/op its allocations per request.
func BenchmarkMiddleware(b *testing.B) {
	st := realRedisStore(b)
	bare := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		_, _ = w.Write([]byte(`{"id":"ord_123","status":"created"}`))
	})
	mw, err := New(Options{SingleTenant: true, Store: st})
	if err != nil {
		b.Fatal(err)
	}
	h := mw(bare)
	const body = `{"amount":1000,"currency":"eur"}`
	serve := func(h http.Handler, key string) int {
		r := httptest.NewRequest("POST", "/orders", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	b.Run("bare", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			serve(bare, "")
		}
	})
	b.Run("first-write", func(b *testing.B) {
		b.ReportAllocs()
		prefix := uniqueName("bench-")
		i := 0
		for b.Loop() {
			i++
			if code := serve(h, prefix+strconv.Itoa(i)); code != 201 {
				b.Fatalf("first write = %d", code)
			}
		}
	})
	b.Run("replay", func(b *testing.B) {
		b.ReportAllocs()
		key := uniqueName("bench-replay-")
		serve(h, key)
		for b.Loop() {
			if code := serve(h, key); code != 201 {
				b.Fatalf("replay = %d", code)
			}
		}
	})
}
