package middleware

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/idemgo/idem"
)

// mounting is one way to place the middleware in a service that serves
// POST /api/orders/{id} and POST /api/refunds, all of them doing the same
// work: what a deploy may change without the client knowing.
type mounting struct {
	name  string
	build func(mw func(http.Handler) http.Handler, work http.Handler) http.Handler
}

// logging stands for any wrapper between the middleware and the router.
func logging(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { next.ServeHTTP(w, r) })
}

var mountings = []mounting{
	{"around the mux", func(mw func(http.Handler) http.Handler, work http.Handler) http.Handler {
		mux := http.NewServeMux()
		mux.Handle("POST /api/orders/{id}", work)
		mux.Handle("POST /api/refunds", work)
		return mw(mux)
	}},
	{"around a wrapper of the mux", func(mw func(http.Handler) http.Handler, work http.Handler) http.Handler {
		mux := http.NewServeMux()
		mux.Handle("POST /api/orders/{id}", work)
		mux.Handle("POST /api/refunds", work)
		return mw(logging(mux))
	}},
	{"inside each route", func(mw func(http.Handler) http.Handler, work http.Handler) http.Handler {
		mux := http.NewServeMux()
		mux.Handle("POST /api/orders/{id}", mw(work))
		mux.Handle("POST /api/refunds", mw(work))
		return mux
	}},
	{"under StripPrefix", func(mw func(http.Handler) http.Handler, work http.Handler) http.Handler {
		inner := http.NewServeMux()
		inner.Handle("POST /orders/{id}", work)
		inner.Handle("POST /refunds", work)
		outer := http.NewServeMux()
		outer.Handle("/api/", http.StripPrefix("/api", mw(inner)))
		return outer
	}},
	{"chi Use", func(mw func(http.Handler) http.Handler, work http.Handler) http.Handler {
		r := chi.NewRouter()
		r.Use(mw)
		r.Method("POST", "/api/orders/{id}", work)
		r.Method("POST", "/api/refunds", work)
		return r
	}},
	{"chi With", func(mw func(http.Handler) http.Handler, work http.Handler) http.Handler {
		r := chi.NewRouter()
		r.With(mw).Method("POST", "/api/orders/{id}", work)
		r.With(mw).Method("POST", "/api/refunds", work)
		return r
	}},
	{"chi Route and Use", func(mw func(http.Handler) http.Handler, work http.Handler) http.Handler {
		r := chi.NewRouter()
		r.Route("/api", func(r chi.Router) {
			r.Use(mw)
			r.Method("POST", "/orders/{id}", work)
			r.Method("POST", "/refunds", work)
		})
		return r
	}},
}

// #25, deliver 2: one record per key, however the middleware is mounted.
// For every pair of mountings, a request served under the first and
// retried under the second (a deploy that changed only the wrapping) ran
// the work once, and the retry got the recorded response; the key reused
// on another endpoint, or on another order, is refused (422) under either.
// Before, the record's key held the route as each mounting named it (a
// ServeMux pattern, the path, chi's pattern or ""): the retry across
// such a deploy ran the work twice.
func TestOneRecordHoweverMounted(t *testing.T) {
	store := memStore(idem.Options{})
	var runs atomic.Int64
	work := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		w.Header().Set("Location", fmt.Sprintf("/api/orders/%d", n))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"run":%d}`, n)
	})
	mw, err := New(Options{Store: store, SingleTenant: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, before := range mountings {
		for _, after := range mountings {
			t.Run(before.name+" then "+after.name, func(t *testing.T) {
				old, now := before.build(mw, work), after.build(mw, work)
				key := "redeploy-" + strings.ReplaceAll(t.Name(), "/", "-")
				order := req{key: key, path: "/api/orders/1", body: `{"sku":"tea"}`}
				start := runs.Load()
				first := do(old, order)
				if first.Code != 201 || runs.Load() != start+1 {
					t.Fatalf("POST /api/orders/1 under %s = %d %s; want the work's 201", before.name, first.Code, first.Body)
				}
				retry := do(now, order)
				if retry.Code != 201 || retry.Header().Get(HeaderReplayed) != "true" || retry.Body.String() != first.Body.String() ||
					retry.Header().Get("Location") != first.Header().Get("Location") {
					t.Errorf("the retry under %s = %d %q (replayed %q); want a replay of %q", after.name, retry.Code, retry.Body, retry.Header().Get(HeaderReplayed), first.Body)
				}
				if n := runs.Load() - start; n != 1 {
					t.Errorf("the work ran %d times across the deploy; want once", n)
				}
				for _, h := range []http.Handler{old, now} {
					wantProblem(t, do(h, req{key: key, path: "/api/refunds", body: `{"sku":"tea"}`}), 422, TypeFingerprintMismatch)
					wantProblem(t, do(h, req{key: key, path: "/api/orders/2", body: `{"sku":"tea"}`}), 422, TypeFingerprintMismatch)
				}
				if n := runs.Load() - start; n != 1 {
					t.Errorf("the work ran %d times; want once: a reused key is refused", n)
				}
			})
		}
	}
}
