package middlewaretest

// The suite's harness: the handler that counts its runs, the store that can
// fail or die under it, the service that a Mount builds over both, and the
// requests a scenario sends it.

import (
	"context"
	"encoding/json"
	"errors"
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
