package bench

// The HTTP contenders' parts: the bare handler they serve, the middleware
// around it, the middleware's replay Instance, and one request served in
// process, so that what shows is the handler's and the middleware's own
// cost.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/middleware"
)

// The handler every HTTP contender serves: it reads the body and answers a
// small JSON document, as a create endpoint would.
var bareHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte(`{"id":"ord_123","status":"created"}`))
})

func newMiddleware(s idem.Store) (http.Handler, error) {
	mw, err := middleware.New(middleware.Options{Store: s, SingleTenant: true})
	if err != nil {
		return nil, err
	}
	return mw(bareHandler), nil
}

// replay is the Instance of the middleware's replay path on s: each
// goroutine sends its first request when it starts, then replays it.
func replay(e *Env, s idem.Store) (*Instance, error) {
	h, err := newMiddleware(s)
	if err != nil {
		return nil, err
	}
	return &Instance{Worker: func() Op {
		key := e.Key("replay")
		first := serve(h, key, false)
		return func(context.Context) error {
			if first != nil {
				return first
			}
			return serve(h, key, true)
		}
	}}, nil
}

// serve sends one request to h in process and checks the answer: ServeHTTP
// with a request built by http.NewRequest and a writer that keeps only the
// status and headers. No network and no request parsing, so what shows is
// the handler's and the middleware's own cost (httptest.NewRequest and
// ResponseRecorder would add more allocations than the bare handler makes).
func serve(h http.Handler, key string, replay bool) error {
	r, err := http.NewRequest(http.MethodPost, "http://bench.test/orders", strings.NewReader(`{"amount":1000,"currency":"eur"}`))
	if err != nil {
		return err
	}
	r.Header["Content-Type"] = jsonType
	if key != "" {
		r.Header["Idempotency-Key"] = []string{key}
	}
	w := responseWriter{header: make(http.Header, 4)}
	h.ServeHTTP(&w, r)
	if w.code != http.StatusCreated || w.body == 0 {
		return fmt.Errorf("POST /orders (key %q) = %d with %d body bytes; want 201 and a body", key, w.code, w.body)
	}
	if got := w.header.Get(middleware.HeaderReplayed) == "true"; got != replay {
		return fmt.Errorf("POST /orders (key %q): replayed = %v; want %v", key, got, replay)
	}
	return nil
}

var jsonType = []string{"application/json"}

// responseWriter is the least http.ResponseWriter: a header map, the
// status, a count of body bytes.
type responseWriter struct {
	header http.Header
	code   int
	body   int
}

func (w *responseWriter) Header() http.Header { return w.header }

func (w *responseWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}

func (w *responseWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	w.body += len(p)
	return len(p), nil
}
