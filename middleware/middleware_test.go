package middleware

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
)

// eachStore runs f on a counting wrapper of every unit-test backend: the
// memory store and RedisStore on miniredis.
func eachStore(t *testing.T, f func(t *testing.T, s *countingStore)) {
	t.Run("memory", func(t *testing.T) { f(t, newCounting()) })
	t.Run("miniredis", func(t *testing.T) {
		st, _ := newMiniredisStore(t)
		f(t, &countingStore{Store: st})
	})
}

// runOf returns the run number a counter's response carries.
func runOf(t *testing.T, body string) int {
	t.Helper()
	var v struct{ Run int }
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("body %q does not decode: %v", body, err)
	}
	return v.Run
}

// §6: a covered method without the header passes through; so does an
// uncovered method with one.
func TestPassThroughWithoutKey(t *testing.T) {
	eachStore(t, func(t *testing.T, s *countingStore) {
		var c counter
		h := mustNew(t, Options{SingleTenant: true, Store: s}, &c)
		for i := range 2 {
			w := do(h, req{body: `{}`})
			if w.Code != 201 || w.Header().Get(HeaderReplayed) != "" {
				t.Errorf("request %d without key: %d %v; want 201 not replayed", i, w.Code, w.Header())
			}
		}
		w := do(h, req{method: http.MethodPut, key: "k", body: `{}`})
		if w.Code != 201 {
			t.Errorf("PUT with key = %d; want 201 (not covered)", w.Code)
		}
		if n := c.runs.Load(); n != 3 {
			t.Errorf("handler ran %d times; want 3", n)
		}
		if n := s.calls.Load(); n != 0 {
			t.Errorf("store calls = %d; want 0 for requests the middleware does not cover", n)
		}
	})
}

// §6: Required answers 400 without the header, before the store and the
// handler.
func TestRequiredKeyMissing(t *testing.T) {
	s := newCounting()
	var c counter
	h := mustNew(t, Options{SingleTenant: true, Store: s, Required: true}, &c)
	wantProblem(t, do(h, req{body: `{}`}), 400, TypeKeyMissing)
	if c.runs.Load() != 0 || s.calls.Load() != 0 {
		t.Errorf("handler runs %d, store calls %d; want 0 and 0", c.runs.Load(), s.calls.Load())
	}
}

// §6: a malformed, empty, over-long or repeated key is 400 before any store
// call.
func TestInvalidKeyBeforeStore(t *testing.T) {
	for name, q := range map[string]req{
		"empty quoted":     {key: `""`},
		"blank":            {keys: []string{" "}},
		"space":            {key: "a b"},
		"comma (folded)":   {key: "a, b"},
		"unterminated":     {key: `"abc`},
		"after the string": {key: `"abc";p=1`},
		"bad escape":       {key: `"a\nb"`},
		"control char":     {key: "\"a\x01\""},
		"non-ASCII":        {key: "\"caf\xc3\xa9\""},
		"quote in token":   {key: `ab"c`},
		"256 bytes":        {key: strings.Repeat("k", 256)},
		"256 bytes quoted": {key: `"` + strings.Repeat("k", 256) + `"`},
		"two fields":       {keys: []string{"a", "b"}},
		"two equal fields": {keys: []string{"a", "a"}},
	} {
		t.Run(name, func(t *testing.T) {
			s := newCounting()
			var c counter
			h := mustNew(t, Options{SingleTenant: true, Store: s}, &c)
			q.body = `{}`
			wantProblem(t, do(h, q), 400, TypeKeyInvalid)
			if c.runs.Load() != 0 || s.calls.Load() != 0 {
				t.Errorf("handler runs %d, store calls %d; want 0 and 0", c.runs.Load(), s.calls.Load())
			}
		})
	}
}

// §6: the first request runs and is recorded; a retry replays the status,
// the allowlisted headers and the body, and the handler does not run.
func TestFirstThenReplay(t *testing.T) {
	eachStore(t, func(t *testing.T, s *countingStore) {
		var c counter
		h := mustNew(t, Options{SingleTenant: true, Store: s}, &c)
		first := do(h, req{key: "order-1", body: `{"amount":5}`})
		if first.Code != 201 || first.Header().Get("Set-Cookie") == "" || first.Header().Get(HeaderReplayed) != "" {
			t.Fatalf("first = %d %v; want 201 with the handler's own headers, not replayed", first.Code, first.Header())
		}
		// "order-1" and `"order-1"` are one key.
		for _, key := range []string{"order-1", `"order-1"`} {
			w := do(h, req{key: key, body: `{"amount":5}`})
			if w.Code != 201 || w.Body.String() != first.Body.String() {
				t.Errorf("replay(%s) = %d %q; want 201 %q", key, w.Code, w.Body, first.Body)
			}
			hd := w.Header()
			if hd.Get(HeaderReplayed) != "true" || hd.Get("Location") != "/orders/17" || hd.Get("Content-Type") != "application/json" {
				t.Errorf("replay headers = %v; want %s: true, Location and Content-Type", hd, HeaderReplayed)
			}
			if hd.Get("Set-Cookie") != "" || hd.Get("X-Run") != "" {
				t.Errorf("replay headers = %v; want no Set-Cookie and no header outside the allowlist", hd)
			}
		}
		if n := c.runs.Load(); n != 1 {
			t.Errorf("handler ran %d times; want 1", n)
		}
	})
}

// §6: the same key with a different request is 422, done or in flight.
func TestFingerprintMismatch(t *testing.T) {
	eachStore(t, func(t *testing.T, s *countingStore) {
		var c counter
		h := mustNew(t, Options{SingleTenant: true, Store: s}, &c)
		do(h, req{key: "k", body: `{"amount":5}`})
		wantProblem(t, do(h, req{key: "k", body: `{"amount":6}`}), 422, TypeFingerprintMismatch)
		wantProblem(t, do(h, req{key: "k", body: `{"amount":5}`, header: map[string]string{"Content-Type": "text/plain"}}), 422, TypeFingerprintMismatch)
		wantProblem(t, do(h, req{key: "k", body: `{"amount":5}`, path: "/orders?dry=1"}), 422, TypeFingerprintMismatch)
		if n := c.runs.Load(); n != 1 {
			t.Errorf("handler ran %d times; want 1", n)
		}
	})
}

// blocker is a handler that waits for release before answering, and says
// when it started.
type blocker struct {
	counter
	started chan struct{}
	release chan struct{}
}

func newBlocker() *blocker {
	return &blocker{started: make(chan struct{}, 10), release: make(chan struct{})}
}

func (b *blocker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.started <- struct{}{}
	<-b.release
	b.counter.ServeHTTP(w, r)
}

// §6: while the first is in flight a retry waits up to LockTimeout, then
// gets 409 with Retry-After; a different request gets 422 at once (422 wins
// over 409); a retry still waiting when the first finishes replays it.
func TestInFlight(t *testing.T) {
	eachStore(t, func(t *testing.T, s *countingStore) {
		b := newBlocker()
		lock := 150 * time.Millisecond
		h := mustNew(t, Options{SingleTenant: true, Store: s, LockTimeout: lock}, b)
		first := make(chan int)
		go func() { first <- do(h, req{key: "k", body: `{"a":1}`}).Code }()
		<-b.started

		start := time.Now()
		w := do(h, req{key: "k", body: `{"a":1}`})
		if took := time.Since(start); took < lock {
			t.Errorf("409 came after %v; want a wait of LockTimeout %v first", took, lock)
		}
		wantProblem(t, w, 409, TypeInProgress)
		if ra := w.Header().Get("Retry-After"); ra != "1" {
			t.Errorf("Retry-After = %q; want 1 (DefaultRetryAfter), not the holder's lease end", ra)
		}

		start = time.Now()
		wantProblem(t, do(h, req{key: "k", body: `{"a":2}`}), 422, TypeFingerprintMismatch)
		if took := time.Since(start); took >= lock {
			t.Errorf("422 came after %v; want it at once, before LockTimeout %v", took, lock)
		}

		// A waiter with a long LockTimeout replays once the first is done.
		hw := mustNew(t, Options{SingleTenant: true, Store: s, LockTimeout: 5 * time.Second}, b)
		waiter := make(chan *http.Response)
		go func() { waiter <- do(hw, req{key: "k", body: `{"a":1}`}).Result() }()
		time.Sleep(50 * time.Millisecond) // let it poll at least once
		close(b.release)
		if code := <-first; code != 201 {
			t.Errorf("first = %d; want 201", code)
		}
		resp := <-waiter
		if resp.StatusCode != 201 || resp.Header.Get(HeaderReplayed) != "true" {
			t.Errorf("waiter = %d %v; want a 201 replay", resp.StatusCode, resp.Header)
		}
		if n := b.runs.Load(); n != 1 {
			t.Errorf("handler ran %d times; want 1", n)
		}
	})
}

// §6: a 5xx records nothing and releases the key; the retry runs the
// handler, and its success is then replayed.
func TestServerErrorForgets(t *testing.T) {
	eachStore(t, func(t *testing.T, s *countingStore) {
		var runs int
		h := mustNew(t, Options{SingleTenant: true, Store: s}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs++
			if runs == 1 {
				http.Error(w, "database down", http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
		}))
		for i, want := range []int{500, 201, 201} {
			if w := do(h, req{key: "k", body: "{}"}); w.Code != want {
				t.Errorf("request %d = %d; want %d", i, w.Code, want)
			}
		}
		if runs != 2 {
			t.Errorf("handler ran %d times; want 2 (the 5xx, then the retry; the third replays)", runs)
		}
	})
}

// §6: a panic records nothing, releases the key and goes on; the retry
// runs the handler.
func TestPanicForgets(t *testing.T) {
	eachStore(t, func(t *testing.T, s *countingStore) {
		var runs int
		h := mustNew(t, Options{SingleTenant: true, Store: s}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs++
			if runs == 1 {
				panic("boom")
			}
			w.WriteHeader(http.StatusCreated)
		}))
		func() {
			defer func() {
				if v := recover(); v != "boom" {
					t.Errorf("recovered %v; want the handler's panic re-raised", v)
				}
			}()
			do(h, req{key: "k", body: "{}"})
		}()
		if keys := s.claimedKeys(); len(keys) != 1 {
			t.Fatalf("claimed %d keys; want 1", len(keys))
		} else if _, err := s.Lookup(t.Context(), keys[0]); err == nil {
			t.Errorf("Lookup after the panic found a record; want the lease released")
		}
		if w := do(h, req{key: "k", body: "{}"}); w.Code != 201 || runs != 2 {
			t.Errorf("retry = %d after %d runs; want 201 after 2", w.Code, runs)
		}
	})
}

// §6: a store that does not answer is 503, and the handler does not run.
func TestStoreDown(t *testing.T) {
	t.Run("claim error", func(t *testing.T) {
		s := newCounting()
		s.claimErr = errStoreDown
		var c counter
		h := mustNew(t, Options{SingleTenant: true, Store: s}, &c)
		w := do(h, req{key: "k", body: "{}"})
		wantProblem(t, w, 503, TypeStoreUnavailable)
		if w.Header().Get("Retry-After") == "" || c.runs.Load() != 0 {
			t.Errorf("Retry-After %q, handler runs %d; want a Retry-After and 0 runs", w.Header().Get("Retry-After"), c.runs.Load())
		}
	})
	t.Run("redis gone", func(t *testing.T) {
		st, srv := newMiniredisStore(t)
		var c counter
		h := mustNew(t, Options{SingleTenant: true, Store: st}, &c)
		srv.Close()
		wantProblem(t, do(h, req{key: "k", body: "{}"}), 503, TypeStoreUnavailable)
		if c.runs.Load() != 0 {
			t.Errorf("handler ran %d times; want 0", c.runs.Load())
		}
	})
}

// The record is written even when the client hangs up while the handler
// runs, and a Confirm that fails at first is retried.
func TestRecordDetachedAndRetried(t *testing.T) {
	eachStore(t, func(t *testing.T, s *countingStore) {
		s.confirmErr.Store(2)
		var c counter
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		h := mustNew(t, Options{SingleTenant: true, Store: s}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			l, ok := idem.LeaseFrom(r.Context())
			if !ok || l.Token <= 0 {
				t.Errorf("LeaseFrom = %v, %v; want the lease, with a token", l, ok)
			}
			cancel() // the client hangs up while the work runs
			c.ServeHTTP(w, r)
		}))
		h.ServeHTTP(httptest.NewRecorder(), req{key: "k", body: "{}"}.build().WithContext(ctx))
		w := do(h, req{key: "k", body: "{}"})
		if w.Code != 201 || w.Header().Get(HeaderReplayed) != "true" || c.runs.Load() != 1 {
			t.Errorf("retry = %d %v after %d runs; want a 201 replay after 1 run", w.Code, w.Header(), c.runs.Load())
		}
		if n := s.confirmErr.Load(); n >= 0 {
			t.Errorf("Confirm failures left = %d; want both used (Confirm retried)", n)
		}
	})
}

// Options.Keep decides what is recorded: here a 4xx is not, so the retry
// runs the handler.
func TestKeep(t *testing.T) {
	s := newCounting()
	runs := 0
	h := mustNew(t, Options{SingleTenant: true, Store: s, Keep: func(status int) bool { return status < 400 }}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		if runs == 1 {
			http.Error(w, "card declined", http.StatusPaymentRequired)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	for i, want := range []int{402, 201, 201} {
		if w := do(h, req{key: "k", body: "{}"}); w.Code != want {
			t.Errorf("request %d = %d; want %d", i, w.Code, want)
		}
	}
	if runs != 2 {
		t.Errorf("handler ran %d times; want 2", runs)
	}
}

// N concurrent requests with one key: the handler runs once and every
// client gets its response.
func TestConcurrentRetries(t *testing.T) {
	eachStore(t, func(t *testing.T, s *countingStore) {
		b := newBlocker()
		h := mustNew(t, Options{SingleTenant: true, Store: s}, b)
		const n = 8
		var wg sync.WaitGroup
		codes, bodies := make([]int, n), make([]string, n)
		for i := range n {
			wg.Go(func() {
				w := do(h, req{key: "k", body: "{}"})
				codes[i], bodies[i] = w.Code, w.Body.String()
			})
		}
		<-b.started
		time.Sleep(50 * time.Millisecond) // let the others find the key in flight
		close(b.release)
		wg.Wait()
		for i := range n {
			if codes[i] != 201 || bodies[i] != bodies[0] {
				t.Errorf("client %d = %d %q; want 201 %q like client 0", i, codes[i], bodies[i], bodies[0])
			}
		}
		if r := b.runs.Load(); r != 1 {
			t.Errorf("handler ran %d times; want 1", r)
		}
	})
}
