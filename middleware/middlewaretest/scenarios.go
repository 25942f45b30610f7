package middlewaretest

// The scenarios Run runs, one function each, in the order of its table:
// what the middleware answers a first request and its retry, a request
// without a key, a key reused for another request, a key in flight, a store
// down; the keep rules, a panic, the lease in the request's context, and a
// crash's take-over and quarantine.

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/middleware"
)

// firstThenReplay: the first request runs and is recorded; a retry gets
// the recorded status, the replayed headers and the body, and the handler
// does not run again. "k" and `"k"` are one key.
func firstThenReplay(t *testing.T, mount Mount) {
	s := newService(t, mount, middleware.Options{})
	first := s.do(req{key: "order-1", body: `{"amount":5}`})
	if first.Code != 201 || first.Header().Get(middleware.HeaderReplayed) != "" || first.Header().Get("Set-Cookie") == "" {
		t.Fatalf("first = %d %v; want 201 with the handler's own headers, not replayed", first.Code, first.Header())
	}
	if a := decode(t, first); a.Body != `{"amount":5}` {
		t.Errorf("the handler read the body %q; want the request's, whole, after the middleware read it for the fingerprint", a.Body)
	}
	for _, key := range []string{"order-1", `"order-1"`} {
		w := s.do(req{key: key, body: `{"amount":5}`})
		if w.Code != 201 || w.Body.String() != first.Body.String() {
			t.Errorf("replay(%s) = %d %q; want 201 %q", key, w.Code, w.Body, first.Body)
		}
		hd := w.Header()
		if hd.Get(middleware.HeaderReplayed) != "true" || hd.Get("Location") != "/orders/17" || hd.Get("Content-Type") != "application/json" {
			t.Errorf("replay(%s) headers = %v; want %s: true, Location and Content-Type", key, hd, middleware.HeaderReplayed)
		}
		if hd.Get("Set-Cookie") != "" || hd.Get("X-Run") != "" {
			t.Errorf("replay(%s) headers = %v; want no Set-Cookie and no header outside the allowlist", key, hd)
		}
	}
	s.wantRuns(1)
}

// passThrough: a covered method without a key, and a method not covered
// with one, reach the handler untouched, without a store call.
func passThrough(t *testing.T, mount Mount) {
	s := newService(t, mount, middleware.Options{})
	for i := range 2 {
		if w := s.do(req{body: `{}`}); w.Code != 201 || w.Header().Get(middleware.HeaderReplayed) != "" {
			t.Errorf("request %d without a key = %d %v; want 201, not replayed", i, w.Code, w.Header())
		}
	}
	if w := s.do(req{method: http.MethodPut, key: "k", body: `{}`}); w.Code != 201 {
		t.Errorf("PUT with a key = %d; want 201 (not covered)", w.Code)
	}
	s.wantRuns(3)
	if n := s.store.calls.Load(); n != 0 {
		t.Errorf("store calls = %d; want 0 for requests the middleware does not cover", n)
	}
}

// mismatch: the same key with another body, content type, target or
// method is 422, and the handler does not run.
func mismatch(t *testing.T, mount Mount) {
	s := newService(t, mount, middleware.Options{})
	s.do(req{key: "k", body: `{"amount":5}`})
	for _, q := range []req{
		{key: "k", body: `{"amount":6}`},
		{key: "k", body: `{"amount":5}`, header: map[string]string{"Content-Type": "text/plain"}},
		{key: "k", body: `{"amount":5}`, path: "/orders/18"},
		{key: "k", body: `{"amount":5}`, path: "/orders?dry=1"},
		{key: "k", body: `{"amount":5}`, method: http.MethodPatch},
	} {
		wantProblem(t, s.do(q), problem{status: 422, typ: sec22, key: "k"})
	}
	s.wantRuns(1)
}

// inFlight: while the first request runs, a retry waits LockTimeout and
// gets 409 with Retry-After; another request gets 422 at once; a retry
// still waiting when the first ends gets its replay.
func inFlight(t *testing.T, mount Mount) {
	lock := 150 * time.Millisecond
	s := newService(t, mount, middleware.Options{LockTimeout: lock})
	first := s.hold(req{key: "k", body: `{"a":1}`})

	start := time.Now()
	w := s.do(req{key: "k", body: `{"a":1}`})
	if took := time.Since(start); took < lock {
		t.Errorf("409 came after %v; want a wait of LockTimeout %v first", took, lock)
	}
	wantProblem(t, w, problem{status: 409, typ: sec26, retryable: true, key: "k", header: map[string]string{"Retry-After": "1"}})
	start = time.Now()
	wantProblem(t, s.do(req{key: "k", body: `{"a":2}`}), problem{status: 422, typ: sec22, key: "k"})
	if took := time.Since(start); took >= lock {
		t.Errorf("422 came after %v; want it at once, before LockTimeout %v", took, lock)
	}

	waiting := newWithStore(t, mount, s, middleware.Options{LockTimeout: 10 * time.Second})
	waiter := make(chan *httptest.ResponseRecorder, 1)
	go func() { waiter <- waiting.do(req{key: "k", body: `{"a":1}`}) }()
	time.Sleep(50 * time.Millisecond) // let it poll at least once
	s.work.releaseAll()
	f := <-first
	wr := <-waiter
	if f.Code != 201 || wr.Code != 201 || wr.Header().Get(middleware.HeaderReplayed) != "true" || wr.Body.String() != f.Body.String() {
		t.Errorf("first = %d %q; waiter = %d %v %q; want 201, then its replay", f.Code, f.Body, wr.Code, wr.Header(), wr.Body)
	}
	s.wantRuns(1)
}

// newWithStore mounts another service over s's store and handler, with o.
func newWithStore(t *testing.T, mount Mount, s *service, o middleware.Options) *service {
	t.Helper()
	o.Store, o.SingleTenant = s.store, true
	h, err := mount(o, s.work)
	if err != nil {
		t.Fatalf("mount(%+v) = %v", o, err)
	}
	return &service{t: t, h: h, work: s.work, store: s.store}
}

// storeDown: a store that fails answers 503 with Retry-After, the handler
// does not run (fail closed), and the store's error text is not shown.
func storeDown(t *testing.T, mount Mount) {
	s := newService(t, mount, middleware.Options{RetryAfter: 3 * time.Second})
	s.store.down.Store(true)
	wantProblem(t, s.do(req{key: "k", body: `{}`}), problem{status: 503, typ: middleware.TypeStoreUnavailable, retryable: true, header: map[string]string{"Retry-After": "3"}})
	s.wantRuns(0)
	s.store.down.Store(false)
	if w := s.do(req{key: "k", body: `{}`}); w.Code != 201 || w.Header().Get(middleware.HeaderReplayed) != "" {
		t.Errorf("after the store is back = %d %v; want 201, run (nothing was recorded)", w.Code, w.Header())
	}
	s.wantRuns(1)
}

// keepRules: a status a retry cannot change is recorded and replayed; one
// that says the work did not happen, or may happen later, releases the
// key, so that a retry runs the handler. DefaultKeep decides.
func keepRules(t *testing.T, mount Mount) {
	for _, status := range []int{200, 201, 204, 302, 400, 401, 403, 404, 405, 406, 409, 410, 413, 415, 422, 425, 429, 500, 502, 503} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			s := newService(t, mount, middleware.Options{})
			q := req{key: "k", body: `{}`, header: map[string]string{headerStatus: strconv.Itoa(status)}}
			first := s.do(q)
			if first.Code != status {
				t.Fatalf("first = %d; want the handler's %d", first.Code, status)
			}
			w := s.do(q)
			kept := middleware.DefaultKeep(status)
			switch {
			case kept && (w.Code != status || w.Header().Get(middleware.HeaderReplayed) != "true" || w.Body.String() != first.Body.String()):
				t.Errorf("retry after %d = %d %v %q; want the recorded answer replayed", status, w.Code, w.Header(), w.Body)
			case !kept && (w.Code != status || w.Header().Get(middleware.HeaderReplayed) != ""):
				t.Errorf("retry after %d = %d %v; want the handler run again", status, w.Code, w.Header())
			}
			if kept {
				s.wantRuns(1)
			} else {
				s.wantRuns(2)
			}
		})
	}
}

// panicReleases: a handler that panics records nothing and releases the
// key: a retry runs the handler.
func panicReleases(t *testing.T, mount Mount) {
	s := newService(t, mount, middleware.Options{LockTimeout: 100 * time.Millisecond})
	w := s.do(req{key: "k", body: `{}`, header: map[string]string{headerPanic: "1"}})
	if w.Code == 201 || w.Header().Get(middleware.HeaderReplayed) != "" {
		t.Errorf("a request whose handler panics = %d %v; want no success", w.Code, w.Header())
	}
	if w := s.do(req{key: "k", body: `{}`}); w.Code != 201 || w.Header().Get(middleware.HeaderReplayed) != "" {
		t.Errorf("retry after a panic = %d %v %s; want 201, run again (the key released)", w.Code, w.Header(), w.Body)
	}
	s.wantRuns(2)
}

// leaseInContext: the handler finds the key's lease in its request's
// context, and its fencing token grows from one holder to the next.
func leaseInContext(t *testing.T, mount Mount) {
	s := newService(t, mount, middleware.Options{})
	a := decode(t, s.do(req{key: "k1", body: `{}`, header: map[string]string{headerStatus: "500"}}))
	b := decode(t, s.do(req{key: "k1", body: `{}`}))
	if a.Token <= 0 || b.Token <= a.Token {
		t.Errorf("lease tokens = %d, then %d; want a lease in the handler's context, its token growing", a.Token, b.Token)
	}
	if c := decode(t, s.do(req{body: `{}`})); c.Token != 0 {
		t.Errorf("lease token without a key = %d; want no lease", c.Token)
	}
}

// crashTakeOverQuarantine: a server that dies mid-handler (its store
// answers nothing from then on) leaves the key's claim to run out; the
// next request's handler finds the take-over in its context (the dead
// attempt's token, one take-over). When that one dies too (MaxTakeOvers
// 1), the key is quarantined: 423 TypeQuarantined, not retryable, and the
// handler does not run.
func crashTakeOverQuarantine(t *testing.T, mount Mount) {
	const lease = idem.MinLeaseTTL
	s := newServiceOn(t, mount, middleware.Options{RecordTimeout: lease}, idem.Options{LeaseTTL: lease, MaxTakeOvers: 1})
	dies := map[string]string{headerDie: "1"}
	crash := func() answer {
		a := decode(t, s.do(req{key: "k", body: `{}`, header: dies}))
		s.store.dead.Store(false) // a new server, on the same records
		time.Sleep(2 * lease)     // the dead one's lease runs out
		return a
	}
	first := crash()
	if first.TakeOvers != 0 {
		t.Errorf("first request: %d take-overs in its context; want none", first.TakeOvers)
	}
	second := crash()
	if second.TakeOvers != 1 || second.Prior != first.Token {
		t.Errorf("the request after a crash: take-overs %d, prior token %d; want 1, the dead attempt's %d",
			second.TakeOvers, second.Prior, first.Token)
	}
	wantProblem(t, s.do(req{key: "k", body: `{}`}), problem{status: 423, typ: middleware.TypeQuarantined, key: "k"})
	s.wantRuns(2)
}
