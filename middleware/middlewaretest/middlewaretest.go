// Package middlewaretest is the scenario suite of the idempotency
// middleware, for every way of mounting it: the net/http middleware runs
// it on a plain handler, and each framework adapter (the Echo and Gin
// modules) on its framework, so that a service answers alike whichever
// front door it is written on.
//
// A Mount builds the service under test from the middleware's Options and
// a plain handler; Run sends request sequences through it and checks each
// answer: the first request runs and is recorded, a retry replays it, a
// key reused for another request is 422, a key in flight is 409 with
// Retry-After, the store down is 503, the keep rules decide what is
// recorded, a panic releases the key, the handler finds the lease in its
// request's context (and, after a crash, the take-over), a key whose
// requests crashed the server repeatedly is 423, and every error is the
// problem+json a client acts on (the public idempot.dev scenarios among
// them).
//
//	func TestScenarios(t *testing.T) {
//		middlewaretest.Run(t, func(o middleware.Options, h http.Handler) (http.Handler, error) {
//			mw, err := middleware.New(o)
//			if err != nil {
//				return nil, err
//			}
//			return mw(h), nil
//		})
//	}
package middlewaretest

// Over 500 lines, one concept: the scenario suite every mounting of
// the middleware runs, each scenario a step of the same conversation.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/middleware"
)

// Mount builds the service under test: h, reached through the middleware
// that o describes, mounted as the framework mounts it. h serves every
// path the suite sends to (POST, PATCH and PUT under /orders): the
// service must route them all to it. An error (the middleware's New
// refusing o) fails the scenario.
type Mount func(o middleware.Options, h http.Handler) (http.Handler, error)

// Request headers the suite's handler acts on.
const (
	headerStatus = "X-Test-Status" // answer with this status
	headerHold   = "X-Test-Hold"   // block until the scenario releases it
	headerPanic  = "X-Test-Panic"  // panic
	headerDie    = "X-Test-Die"    // the server dies: its store answers nothing from then on
)

// Run runs every scenario on services that mount builds, each scenario a
// subtest with a store of its own.
func Run(t *testing.T, mount Mount) {
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) { sc.run(t, mount) })
	}
}

var scenarios = []struct {
	name string
	run  func(t *testing.T, mount Mount)
}{
	{"FirstThenReplay", firstThenReplay},
	{"PassThrough", passThrough},
	{"Mismatch", mismatch},
	{"InFlight", inFlight},
	{"StoreDown", storeDown},
	{"KeepRules", keepRules},
	{"Panic", panicReleases},
	{"Lease", leaseInContext},
	{"Crash", crashTakeOverQuarantine},
	{"Problems", problems},
}

// handler is the suite's handler: it counts its runs and answers 201 (or
// headerStatus) with a JSON body holding the run's number, the request's
// body and its lease's token, a Location, a cookie and a header outside
// the replayed ones.
type handler struct {
	runs    atomic.Int64
	started chan struct{}
	release chan struct{}
	once    sync.Once
	die     func() // headerDie: the server dies
}

func newHandler() *handler {
	return &handler{started: make(chan struct{}, 16), release: make(chan struct{})}
}

func (h *handler) releaseAll() { h.once.Do(func() { close(h.release) }) }

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(headerHold) != "" {
		h.started <- struct{}{}
		<-h.release
	}
	n := h.runs.Add(1)
	if r.Header.Get(headerPanic) != "" {
		panic("middlewaretest: the handler panics, as asked")
	}
	body, _ := io.ReadAll(r.Body)
	var token int64
	if l, ok := idem.LeaseFrom(r.Context()); ok {
		token = l.Token
	}
	var takeOvers int
	var prior int64
	if t, ok := idem.TakeOverFrom(r.Context()); ok {
		takeOvers, prior = t.TakeOvers, t.Prior.Token
	}
	if r.Header.Get(headerDie) != "" && h.die != nil {
		h.die()
	}
	status := http.StatusCreated
	if s := r.Header.Get(headerStatus); s != "" {
		status, _ = strconv.Atoi(s)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/17")
	w.Header().Set("Set-Cookie", "session=s3cret")
	w.Header().Set("X-Run", "private")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"run": n, "body": string(body), "token": token,
		"takeovers": takeOvers, "prior": prior})
}

// answer is the handler's body.
type answer struct {
	Run       int64
	Body      string
	Token     int64
	TakeOvers int   // after a crash: the take-overs in a row
	Prior     int64 // after a crash: the token of the attempt taken over
}

// service is one scenario's service under test.
type service struct {
	t     *testing.T
	h     http.Handler
	work  *handler
	store *store
}

// store wraps a MemoryStore, counting calls, and can be made to fail.
type store struct {
	idem.Store
	calls atomic.Int64
	down  atomic.Bool
	dead  atomic.Bool // the server died: no renewal, confirm or forget reaches the store
}

// errDown is the failing store's error; its text must never reach a
// client.
var errDown = errors.New("dial tcp 10.0.0.7:6379: connect: connection refused (secret internals)")

func (s *store) Claim(ctx context.Context, key string, fp []byte) (idem.Claim, error) {
	s.calls.Add(1)
	if s.down.Load() {
		return idem.Claim{}, errDown
	}
	return s.Store.Claim(ctx, key, fp)
}

func (s *store) Confirm(ctx context.Context, l *idem.Lease, result []byte) error {
	s.calls.Add(1)
	if s.dead.Load() {
		return errDown
	}
	return s.Store.Confirm(ctx, l, result)
}

func (s *store) Forget(ctx context.Context, l *idem.Lease) error {
	s.calls.Add(1)
	if s.dead.Load() {
		return errDown
	}
	return s.Store.Forget(ctx, l)
}

func (s *store) Renew(ctx context.Context, l *idem.Lease) error {
	if s.dead.Load() {
		return errDown
	}
	return s.Store.Renew(ctx, l)
}

// newService mounts the suite's handler behind o; o.Store is the
// scenario's store, and SingleTenant is set unless o.Scope is.
func newService(t *testing.T, mount Mount, o middleware.Options) *service {
	t.Helper()
	return newServiceOn(t, mount, o, idem.Options{})
}

// newServiceOn is newService on a MemoryStore with options so.
func newServiceOn(t *testing.T, mount Mount, o middleware.Options, so idem.Options) *service {
	t.Helper()
	mem, err := idem.NewMemoryStore(so)
	if err != nil {
		t.Fatalf("NewMemoryStore = %v", err)
	}
	s := &service{t: t, work: newHandler(), store: &store{Store: mem}}
	s.work.die = func() { s.store.dead.Store(true) }
	o.Store = s.store
	o.SingleTenant = o.Scope == nil
	if s.h, err = mount(o, s.work); err != nil {
		t.Fatalf("mount(%+v) = %v", o, err)
	}
	t.Cleanup(s.work.releaseAll)
	return s
}

// req is one request of a scenario.
type req struct {
	method, path, key, body string
	keys                    []string // several header fields, when set
	header                  map[string]string
}

// do sends q and returns the response. A panic that the service lets out
// is recovered, and answered 500 as net/http's server would close the
// connection: the client sees no answer.
func (s *service) do(q req) (w *httptest.ResponseRecorder) {
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
	w = httptest.NewRecorder()
	defer func() {
		if recover() != nil {
			w = httptest.NewRecorder()
			w.Code = 0
		}
	}()
	s.h.ServeHTTP(w, r)
	return w
}

// hold sends q in the background with headerHold, and returns once its
// handler runs; the response comes on the channel once released.
func (s *service) hold(q req) <-chan *httptest.ResponseRecorder {
	s.t.Helper()
	if q.header == nil {
		q.header = map[string]string{}
	}
	q.header[headerHold] = "1"
	ch := make(chan *httptest.ResponseRecorder, 1)
	go func() { ch <- s.do(q) }()
	select {
	case <-s.work.started:
	case <-time.After(10 * time.Second):
		s.t.Fatalf("%s %s: the handler did not start within 10s", q.method, q.path)
	}
	return ch
}

func (s *service) wantRuns(n int64) {
	s.t.Helper()
	if got := s.work.runs.Load(); got != n {
		s.t.Errorf("handler ran %d times; want %d", got, n)
	}
}

func decode(t *testing.T, w *httptest.ResponseRecorder) answer {
	t.Helper()
	var a answer
	if err := json.Unmarshal(w.Body.Bytes(), &a); err != nil {
		t.Fatalf("body %q does not decode: %v", w.Body, err)
	}
	return a
}

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

// Problem types the draft defines.
const (
	draft = "https://datatracker.ietf.org/doc/html/draft-ietf-httpapi-idempotency-key-header-07"
	sec21 = draft + "#section-2.1"
	sec22 = draft + "#section-2.2"
	sec26 = draft + "#section-2.6"
)

// problem is what a client acts on in an error answer.
type problem struct {
	status    int
	typ       string
	retryable bool
	key       string // idempotency_key; "" means absent, unless keyEmpty
	keyEmpty  bool   // idempotency_key is present and ""
	header    map[string]string
	detail    string // a substring of detail, when set
}

// wantProblem checks that w is the problem+json want describes, that it
// names its occurrence and shows no internal error text.
func wantProblem(t *testing.T, w *httptest.ResponseRecorder, want problem) {
	t.Helper()
	if w.Code != want.status {
		t.Errorf("status = %d; want %d (body %s)", w.Code, want.status, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type = %q; want application/problem+json", ct)
	}
	for k, v := range want.header {
		if got := w.Header().Get(k); got != v {
			t.Errorf("%s = %q; want %q", k, got, v)
		}
	}
	var p struct {
		Type, Title, Detail, Instance string
		Status                        int
		Retryable                     *bool
		Key                           *string `json:"idempotency_key"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem %q does not decode: %v", w.Body, err)
	}
	if p.Type != want.typ || p.Status != want.status || p.Title == "" {
		t.Errorf("problem = %+v; want type %s, status %d and a title", p, want.typ, want.status)
	}
	if !strings.HasPrefix(p.Instance, "urn:uuid:") || len(p.Instance) != len("urn:uuid:")+36 {
		t.Errorf("instance = %q; want urn:uuid:<UUID>", p.Instance)
	}
	if p.Retryable == nil || *p.Retryable != want.retryable {
		t.Errorf("retryable = %v; want %v", p.Retryable, want.retryable)
	}
	switch {
	case want.keyEmpty && (p.Key == nil || *p.Key != ""):
		t.Errorf("idempotency_key = %v; want \"\"", p.Key)
	case want.keyEmpty:
	case want.key == "" && p.Key != nil:
		t.Errorf("idempotency_key = %q; want it absent", *p.Key)
	case want.key != "" && (p.Key == nil || *p.Key != want.key):
		t.Errorf("idempotency_key = %v; want %q", p.Key, want.key)
	}
	if !strings.Contains(p.Detail, want.detail) {
		t.Errorf("detail = %q; want it to say %q", p.Detail, want.detail)
	}
	if body := w.Body.String(); strings.Contains(body, "secret") || strings.Contains(body, "idem:") {
		t.Errorf("problem %q shows internal error text", body)
	}
}

// step is one request of a problem sequence; a held one is sent in the
// background and blocks until the sequence ends.
type step struct {
	q    req
	hold bool
	want *problem // nil: not an error
}

// problems: every error answer a client acts on, with the draft's type
// where it defines the case, retryable, the client's well-formed key on
// the key's errors, a short Retry-After on 409 and 503; the public
// idempot.dev scenarios among them. None makes a store call before the
// request is known to be well-formed, and none runs the handler.
func problems(t *testing.T, mount Mount) {
	longScope := func(*http.Request) (string, error) { return strings.Repeat("t", 2000), nil }
	for _, c := range []struct {
		name   string
		opts   middleware.Options
		down   bool
		claims bool // the store is asked before the answer
		steps  []step
	}{
		{name: "key missing", opts: middleware.Options{Required: true}, steps: []step{
			{q: req{body: `{}`}, want: &problem{status: 400, typ: sec21}},
		}},
		{name: "key malformed", steps: []step{
			{q: req{key: "a b", body: `{}`}, want: &problem{status: 400, typ: sec21, keyEmpty: true}},
		}},
		{name: "key repeated", steps: []step{
			{q: req{keys: []string{"a", "b"}, body: `{}`}, want: &problem{status: 400, typ: sec21, keyEmpty: true}},
		}},
		{name: "key empty", steps: []step{
			{q: req{keys: []string{""}, body: `{}`}, want: &problem{status: 400, typ: sec21, keyEmpty: true, detail: "empty"}},
			{q: req{keys: []string{`""`}, body: `{}`}, want: &problem{status: 400, typ: sec21, keyEmpty: true, detail: "empty"}},
		}},
		{name: "key too long", steps: []step{
			{q: req{key: strings.Repeat("k", 256), body: `{}`}, want: &problem{status: 400, typ: sec21, keyEmpty: true}},
		}},
		{name: "key refused by the store", claims: true, opts: middleware.Options{Scope: longScope}, steps: []step{
			{q: req{key: "k-1", body: `{}`}, want: &problem{status: 400, typ: sec21, key: "k-1"}},
		}},
		{name: "scope refused", opts: middleware.Options{Scope: func(*http.Request) (string, error) { return "", errDown }}, steps: []step{
			{q: req{key: "k-1", body: `{}`}, want: &problem{status: 400, typ: middleware.TypeScopeInvalid}},
		}},
		{name: "empty scope", opts: middleware.Options{Scope: func(*http.Request) (string, error) { return "", nil }}, steps: []step{
			{q: req{key: "k-1", body: `{}`}, want: &problem{status: 400, typ: middleware.TypeScopeInvalid}},
		}},
		{name: "body too large", opts: middleware.Options{MaxBodyBytes: 4}, steps: []step{
			{q: req{key: "k-1", body: `{"a":1}`}, want: &problem{status: 413, typ: middleware.TypeBodyTooLarge}},
		}},
		{name: "key reused, done", steps: []step{
			{q: req{key: `"k-1"`, body: `{"a":1}`}},
			{q: req{key: `"k-1"`, body: `{"a":2}`}, want: &problem{status: 422, typ: sec22, key: "k-1"}},
		}},
		{name: "key reused, in flight", steps: []step{
			{q: req{key: "k-1", body: `{"a":1}`}, hold: true},
			{q: req{key: "k-1", body: `{"a":2}`}, want: &problem{status: 422, typ: sec22, key: "k-1"}},
		}},
		{name: "in flight", opts: middleware.Options{LockTimeout: 50 * time.Millisecond}, steps: []step{
			{q: req{key: "k-1", body: `{}`}, hold: true},
			{q: req{key: "k-1", body: `{}`}, want: &problem{status: 409, typ: sec26, retryable: true, key: "k-1",
				header: map[string]string{"Retry-After": "1"}, detail: "being processed"}},
		}},
		{name: "in flight, RetryAfter rounded up", opts: middleware.Options{LockTimeout: 50 * time.Millisecond, RetryAfter: 1500 * time.Millisecond}, steps: []step{
			{q: req{key: "k-1", body: `{}`}, hold: true},
			{q: req{key: "k-1", body: `{}`}, want: &problem{status: 409, typ: sec26, retryable: true, key: "k-1",
				header: map[string]string{"Retry-After": "2"}}},
		}},
		{name: "store unavailable", down: true, steps: []step{
			{q: req{key: "k-1", body: `{}`}, want: &problem{status: 503, typ: middleware.TypeStoreUnavailable, retryable: true,
				header: map[string]string{"Retry-After": "1"}}},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newService(t, mount, c.opts)
			s.store.down.Store(c.down)
			runs := int64(0)
			for i, st := range c.steps {
				if st.hold {
					s.hold(st.q)
					runs = -1 // the held handler counts once released
					continue
				}
				calls := s.store.calls.Load()
				w := s.do(st.q)
				if st.want == nil {
					if w.Code >= 400 {
						t.Fatalf("request %d = %d %s; want success", i, w.Code, w.Body)
					}
					runs++
					continue
				}
				t.Run(fmt.Sprint("request ", i), func(t *testing.T) { wantProblem(t, w, *st.want) })
				if (st.want.status == 400 || st.want.status == 413) && !c.claims && s.store.calls.Load() != calls {
					t.Errorf("request %d: %d store calls before its %d; want none", i, s.store.calls.Load()-calls, st.want.status)
				}
			}
			if runs >= 0 {
				s.wantRuns(runs)
			}
		})
	}
}
